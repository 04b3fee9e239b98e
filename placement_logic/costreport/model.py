"""Cost report model: plain data that every renderer reads.

Input: nothing (definitions; ``build`` fills them). Output: frozen dataclasses holding
exact numbers (``fractions.Fraction``, None while symbols are unbound) and formulas as
strings (sympy's plain form and LaTeX), so renderers need neither sympy nor the IR.
Objects give ``_repr_latex_`` for Jupyter (``CostReport``'s is attached by the package, from
``latex``, so this module imports no renderer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from ..outcome import (
    SCHEMA_VERSION,  # noqa: F401 - re-exported by the package
    QuestionVerdict,
)
from .rows import DEVICE_ROWS, HOST_ROWS, stage_title, tex_text  # noqa: F401 - part of the model's API


@dataclass(frozen=True)
class Quantity:
    """One derived number: symbolic formula, value after binding, exact value if bound."""

    formula: str  # symbolic, in the spec's symbols (sympy's plain form)
    latex: str  # the same through the LaTeX printer with display names
    exact: Fraction | None  # None when symbols remain unbound
    value: str  # the formula after substituting the bound symbols
    unbound: tuple[str, ...] = ()
    symbols: tuple[str, ...] = ()  # every symbol of the formula (before binding), sorted
    latex_lines: tuple[str, ...] = ()  # ``latex`` broken for a display equation; () when it fits one line
    # a long case analysis is named (costreport.pieces): the formula as the reports show it, its pieces defined
    # apart (``latex`` and ``formula`` stay whole; ``latex_lines`` then hold the named form)
    shown: str = ""
    pieces: tuple = ()

    @property
    def bound(self) -> bool:
        return self.exact is not None

    def _repr_latex_(self) -> str:
        return f"${self.latex}$"


@dataclass(frozen=True)
class CollectiveRow:
    """One collective of a plan as the report prints it."""

    kind: str
    state: str
    axes: tuple[str, ...]
    link: str | None
    phase: str
    count: Quantity
    buffer: Quantity
    bytes_per_device: Quantity
    volume: Quantity
    payload: str
    rule: str

    @property
    def axis(self) -> str:
        return "×".join(self.axes) if self.axes else "host"


@dataclass(frozen=True)
class GroupTotal:
    """The bytes per device and volume over one communication group."""

    group: str  # an axis name, "a×b" for a multi-axis group, or "host"
    link: str | None
    bytes_per_device: Quantity
    volume: Quantity


@dataclass(frozen=True)
class ParamGroupRow:
    """One parameter group (``ir.groups``): its size and what one device holds of it."""

    name: str
    count: Quantity  # parameters in the model (the copy's size for a tied head)
    tensor: str  # split | whole | heads: how a tensor axis holds it
    stage: str  # layers | first | last
    expert: bool  # an expert axis divides it
    user: bool  # declared with `group NAME { ... }`
    per_device: dict[str, Quantity]  # params | optimizer | grads -> persistent bytes (device + host)


@dataclass(frozen=True)
class StageReport:
    """One pipeline stage's device memory (DEVICE_ROWS) and what its schedule keeps in flight."""

    stage: str  # "first" | "last"
    device: dict[str, Quantity]  # DEVICE_ROWS
    in_flight: dict[str, Quantity]  # layer_microbatches, embedding_microbatches, output_microbatches


@dataclass(frozen=True)
class FitReport:
    """Whether the plan's peak per device fits the device's memory."""

    device: str  # the device's title
    capacity: Quantity  # bytes
    peak: Quantity  # the plan's peak per device (the larger stage with a pipeline)
    headroom: Quantity  # capacity − peak (negative: over)
    fits: bool | None  # None: symbols unbound


@dataclass(frozen=True)
class TimeReport:
    """The step-time model's figures (costs.steptime): seconds, FLOPs, tokens."""

    step: Quantity
    compute: Quantity
    bubble: Quantity
    overlapped: Quantity
    exposed: Quantity
    tokens: Quantity
    tokens_per_second: Quantity
    model_flops: Quantity
    mfu: Quantity
    per_link: dict  # link -> seconds of communication per step
    assumptions: tuple[str, ...] = ()
    optimizer: Quantity | None = None  # seconds of the optimizer step (the kernel model)


@dataclass(frozen=True)
class PlanReport:
    """One plan's report: memory per state and stage, communication, fit and step time."""

    name: str
    strategies: tuple[str, ...]
    device: dict[str, Quantity]  # DEVICE_ROWS
    host: dict[str, Quantity]  # HOST_ROWS
    transient_terms: dict[str, Quantity]
    model_state: Quantity
    comm_total: Quantity  # ring bytes sent per device per step (network)
    volume_total: Quantity  # ZeRO convention
    per_axis: dict[str, GroupTotal]  # each mesh axis and "host"
    per_group: tuple[GroupTotal, ...]
    per_link: dict[str, GroupTotal]
    collectives: tuple[CollectiveRow, ...]
    notes: tuple[str, ...] = ()
    stages: tuple[StageReport, ...] = ()  # first and last pipeline stage; () without a pipeline
    peak_stage: str | None = None  # "first", "last", "both" (equal), None (undecided or no pipeline)
    param_groups: tuple[ParamGroupRow, ...] = ()
    fit: FitReport | None = None  # with a device (mesh `device = ...` or --device)
    time: TimeReport | None = None  # with a device and a transformer shape

    @property
    def fits_not(self) -> bool:
        return self.fit is not None and self.fit.fits is False

    def _repr_latex_(self) -> str:
        n = tex_text(self.name)
        return (rf"$M^{{\mathrm{{{n}}}}}_{{\mathrm{{device}}}} = {self.device['total'].latex}, \quad "
                rf"C^{{\mathrm{{{n}}}}} = {self.comm_total.latex}$")


@dataclass(frozen=True)
class QuestionResult:
    """An assert or claim of the spec, its two sides and its verdict."""

    kind: str  # assert | claim
    label: str | None
    op: str
    left: Quantity
    right: Quantity
    verdict: QuestionVerdict
    identity: bool | None  # the comparison holds symbolically for every value (None: not decided)
    where: str  # file:line:col
    expected: str | None = None  # a claim marked `expect fails`: "fails", or "holds only when dp = 8"
    met: bool | None = None  # the expectation came true (None: no expectation, or not decided)

    @property
    def shown(self) -> str:
        """The verdict with its expectation: ``fails (expected: holds only when dp = 8)``."""
        if self.expected is None:
            return self.verdict
        if self.met:
            return f"{self.verdict} (expected)" if self.expected == QuestionVerdict.FAILS else \
                f"{self.verdict} (expected: {self.expected})"
        if self.met is None:
            return f"{self.verdict} (expected: {self.expected}; not decided)"
        pins = self.expected.removeprefix("holds only when ")
        if self.verdict is QuestionVerdict.HOLDS:
            return "holds (UNEXPECTED: expected it to fail" + ("" if self.expected == QuestionVerdict.FAILS else f" unless {pins}") + ")"
        return f"fails (UNEXPECTED: expected it to hold when {pins}, but it fails there too)"


@dataclass(frozen=True)
class Binding:
    """A bound symbol of the report: its exact value and formula, and whether --set re-bound it."""

    name: str
    exact: Fraction | None
    formula: str
    overridden: bool = False


@dataclass(frozen=True)
class CostReport:
    """The report of ``placement cost`` or ``compare``: bindings, axes, plans and questions."""

    command: str  # cost | compare
    file: str
    bindings: tuple[Binding, ...]
    axes: tuple[tuple[str, str | None], ...]  # (axis, link)
    plans: tuple[PlanReport, ...]
    questions: tuple[QuestionResult, ...] = ()
    baseline: str | None = None
    ratios: dict[str, dict[str, Quantity | None]] = field(default_factory=dict)  # plan -> row -> ratio
    show_groups: bool = False  # text and markdown add each plan's parameter-group table
    params: Quantity | None = None  # Ψ (a count)
    active_params: Quantity | None = None  # parameters one token uses (MoE), else Ψ

    @property
    def failed_asserts(self) -> int:
        return sum(1 for q in self.questions if q.kind == "assert" and q.verdict is QuestionVerdict.FAILS)

    @property
    def unfit(self) -> tuple[str, ...]:
        """The plans whose peak per device exceeds the device's memory."""
        return tuple(p.name for p in self.plans if p.fit is not None and p.fits_not)

    @property
    def exit_status(self) -> int:
        """1 when an assert fails or an expectation does not come true, 3 when an assert is
        undecided and nothing fails, else 0."""
        from ..outcome import Exit

        if self.failed_asserts or self.unmet_expectations or self.unfit:
            return int(Exit.FAILED)
        return int(Exit.UNKNOWN if self.unknown_asserts else Exit.OK)

    @property
    def unmet_expectations(self) -> int:
        """Claims marked ``expect fails`` whose expectation did not come true."""
        return sum(1 for q in self.questions if q.met is False)

    @property
    def unknown_asserts(self) -> int:
        return sum(1 for q in self.questions if q.kind == "assert" and q.verdict is QuestionVerdict.UNKNOWN)


def compare_rows(r: CostReport) -> list[tuple[str, Callable[[PlanReport], Quantity]]]:
    """The rows of a side-by-side comparison: (key, how to read it from a plan)."""
    rows: list[tuple[str, Callable[[PlanReport], Quantity]]] = [
        (f"memory.{k}", lambda p, k=k: p.device[k]) for k in DEVICE_ROWS]
    rows.append(("memory.host", lambda p: p.host["total"]))
    rows += [(f"comm.{a}", lambda p, a=a: p.per_axis[a].bytes_per_device) for a, _ in r.axes]
    rows += [("comm.total", lambda p: p.comm_total), ("volume.total", lambda p: p.volume_total)]
    if r.plans and all(p.fit is not None for p in r.plans):
        rows.append(("fit.headroom", lambda p: p.fit.headroom))
    if r.plans and all(p.time is not None for p in r.plans):
        rows += [("time.step", lambda p: p.time.step), ("time.tokens_per_second", lambda p: p.time.tokens_per_second),
                 ("time.mfu", lambda p: p.time.mfu)]
    return rows
