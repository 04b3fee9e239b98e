"""Report data of a measurement: plain frozen data that renderers turn into text.

Input: what ``compare`` derived from a prediction and a run. Output: ``MeasureReport``
(with ``Row``s for every compared quantity and an ``Equivalence``). Nothing here knows
of torch, sympy or lark. Outcomes: ``matched`` (every row equal or explained, the run
equivalent), ``mismatch`` (a row differs with no explanation), ``diverged`` (the run is
not equivalent to one device), ``unrealised`` (PyTorch cannot run the plan as written),
``failed`` (a rank raised).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

TOLERANCE = 1e-5  # relative, fp32
# relative, by the width of the parameters and gradients that ran: fp32, or bfloat16 (2^-8, the
# unit round-off of its 8 significant bits: the summation orders of bf16 gradients differ by it)
TOLERANCES = {4: TOLERANCE, 2: 2.0 ** -8}
# the first step's gradients, relative to the largest reference gradient: fp32 as the
# parameters; bf16 wider, 2^-6 (eight roundings of 2^-9): a distributed bf16 gradient is rounded
# at every microbatch's accumulation, every reduction step and every division, one process's at
# other points, while a gradient bug moves it by a factor (an extra sum over an axis of size n:
# (n - 1) x, relative 1/2 and more), so the margin stays wide
GRAD_TOLERANCES = {4: TOLERANCE, 2: 2.0 ** -6}
DTYPE_NAMES = {4: "fp32", 2: "bf16"}

class Outcome(StrEnum):
    """How a measured plan came out (its value is what text and JSON show)."""

    MATCHED = "matched"  # every measured quantity matches or is explained
    MISMATCH = "mismatch"  # some quantity differs from the prediction
    DIVERGED = "diverged"  # N-device training differs from single-device training
    UNREALISED = "unrealised"  # the plan has no faithful PyTorch realisation
    FAILED = "failed"  # a rank failed or timed out


OUTCOMES = tuple(Outcome)


class RowStatus(StrEnum):
    """How one compared quantity came out (``Row.status``; its value is what text and JSON show)."""

    MATCH = "match"
    EXPLAINED = "explained"  # differs by what a documented mechanism (compare.MECHANISMS) accounts for
    DIFFERS = "differs"
    REPORTED = "reported"  # shown, not part of the outcome (the allocator's peak)


@dataclass(frozen=True)
class Row:
    """One compared quantity. Bytes are per rank (the largest over ranks) or per step."""

    group: str  # parameters | memory | collectives | activations | peak
    quantity: str
    predicted: Fraction | None
    measured: Fraction | None
    status: RowStatus
    note: str = ""
    per_rank: tuple[int, ...] = ()  # measured on every rank, when ranks differ
    mechanism: str = ""  # an explained row: the documented mechanism (compare.MECHANISMS) that accounts for it
    predicted_per_rank: tuple = ()  # predicted for every rank, when ranks differ (their own pipeline stage)

    @property
    def abs_diff(self) -> Fraction | None:
        if self.predicted is None or self.measured is None:
            return None
        return self.measured - self.predicted

    @property
    def rel_diff(self) -> Fraction | None:
        d = self.abs_diff
        if d is None:
            return None
        if self.predicted == 0:
            return Fraction(0) if d == 0 else None
        return d / self.predicted


@dataclass(frozen=True)
class CounterexampleView:
    """The checker's counterexample of one refuted obligation, as the checker prints it."""

    obligation: str  # e.g. "GI grads[dense]"
    sizes: tuple[tuple[str, int], ...]
    lines: tuple[tuple[str, str], ...]  # label -> value: devices, token counts, contributions ...
    equation: str  # the failing equation, both sides evaluated
    diagnosis: tuple[str, ...]  # the missing, doubled or mis-scaled collective
    command: str  # re-runs the check at these sizes
    notes: tuple[str, ...] = ()  # side remarks on the run, not causes


@dataclass(frozen=True)
class CheckerView:
    """What the checker says about the same plan (absent when the checker is not installed)."""

    available: bool
    verdict: str = ""  # proved | refuted | unknown
    summary: tuple[str, ...] = ()  # refuted obligations with their counterexample
    counterexamples: tuple[CounterexampleView, ...] = ()  # in full, one per refuted obligation


@dataclass(frozen=True)
class Equivalence:
    steps: int
    param_abs: float
    param_rel: float
    param_worst: str
    loss_abs: float
    loss_rel: float
    replicas_agree: bool  # every rank's gathered parameters are the same
    tolerance: float = TOLERANCE
    # the first step's whole gradients against one process's (None: not compared, and why)
    grad_abs: float | None = None
    grad_rel: float | None = None
    grad_worst: str = ""
    grad_unavailable: str = ""
    grad_tolerance: float = TOLERANCE

    @property
    def within(self) -> bool:
        grads = self.grad_rel is None or self.grad_rel <= self.grad_tolerance
        return self.param_rel <= self.tolerance and self.loss_rel <= self.tolerance and self.replicas_agree and grads

    def gradient_text(self) -> str:
        if self.grad_rel is None:
            return f"first-step gradients not compared ({self.grad_unavailable})"
        bound = f", within {self.grad_tolerance:g}" if self.grad_tolerance != self.tolerance else ""
        return f"first-step gradients {self.grad_rel:.3g} relative ({self.grad_worst}{bound})"


@dataclass(frozen=True)
class MeasureReport:
    file: str
    plan: str
    outcome: Outcome
    mesh: tuple[tuple[str, int], ...]
    steps: int
    implementation: str = ""
    prediction_source: str = ""
    shape: tuple[tuple[str, object], ...] = ()
    approximations: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()  # why unrealised, or the error of a failed rank
    rows: tuple[Row, ...] = ()
    equivalence: Equivalence | None = None
    checker: CheckerView | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def devices(self) -> int:
        n = 1
        for _, s in self.mesh:
            n *= s
        return n

    def counts(self) -> dict[str, int]:
        out = {RowStatus.MATCH: 0, RowStatus.EXPLAINED: 0, RowStatus.DIFFERS: 0}
        for r in self.rows:
            if r.status in out:
                out[r.status] += 1
        return out
