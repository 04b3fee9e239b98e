"""Report data of a check run: plain frozen data that renderers turn into text.

Input: what the checker found. Output: ``CheckReport`` -> ``PlanReport`` ->
``ObligationResult`` (with an optional ``Counterexample``). Nothing here knows of z3 or
lark; the verdicts are ordered refuted < unknown < proved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import NO_SPAN, Span
from ..outcome import Verdict, exit_for

__all__ = ["Verdict", "Counterexample", "ObligationResult", "Finding", "PlanReport", "CheckReport"]


@dataclass(frozen=True)
class Counterexample:
    """A concrete run, re-checked without the solver, that breaks the condition."""

    sizes: tuple[tuple[str, int], ...]  # mesh axis sizes and microbatches
    devices: tuple[tuple[str, str], ...]  # label -> device coordinates as text
    values: tuple[tuple[str, str], ...]  # label -> exact value as text
    equation: str  # the equation that fails, with both sides evaluated
    diagnosis: tuple[str, ...]  # which collective is missing, doubled or mis-scaled
    command: str  # re-run with the sizes pinned
    notes: tuple[str, ...] = ()  # side remarks on this run (not causes), shown after the diagnosis

    def to_json(self) -> dict:
        return {
            "sizes": dict(self.sizes),
            "devices": dict(self.devices),
            "values": dict(self.values),
            "equation": self.equation,
            "diagnosis": list(self.diagnosis),
            "notes": list(self.notes),
            "command": self.command,
        }


@dataclass(frozen=True)
class ObligationResult:
    name: str  # e.g. "GI grads[norms]"
    condition: str  # gradient_integrity, state_consistency or a rule code
    verdict: Verdict
    scope: str  # "all mesh sizes", "mesh sizes <= 8", "at dp=2, tp=2"
    location: Span = NO_SPAN
    checked: str = ""  # what the obligation states
    reason: str = ""  # why unknown
    counterexample: Counterexample | None = None
    why: str = ""  # why the rule matters (refuted rules)
    fix: str = ""  # suggested fix (refuted rules)
    notes: tuple[str, ...] = ()
    seconds: float = 0.0  # solver time
    groups: tuple[str, ...] = ()  # the parameter groups a placement-caused obligation concerns ((): all)
    # (axis, size): the sizes the obligation's own encoding holds axes at, besides the pins (part of ``scope``)
    fixed_sizes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Finding:
    """One defect of a plan: its root cause (the obligation that names the collective, group
    and axis, and its diagnosis), where it comes from, and every obligation it breaks."""

    root: str  # the obligation whose counterexample shows the defect most directly
    cause: str  # the root's diagnosis: which collective is missing, doubled or mis-scaled
    location: Span
    breaks: tuple[str, ...]  # every refuted obligation this defect accounts for, the root first


@dataclass(frozen=True)
class PlanReport:
    plan: str
    obligations: tuple[ObligationResult, ...]
    assumed: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()

    def finding_of(self, name: str) -> tuple[int, Finding] | None:
        """(1-based number, finding) of the defect that accounts for obligation ``name``."""
        for i, f in enumerate(self.findings, 1):
            if name in f.breaks:
                return i, f
        return None

    @property
    def verdict(self) -> Verdict:
        return min((o.verdict for o in self.obligations), default=Verdict.PROVED)

    @property
    def fixed_sizes(self) -> dict[str, int]:
        """The sizes some obligation's encoding holds axes at (``ObligationResult.fixed_sizes``): a plan whose
        obligations are all proved is proved at the sizes every one of them covers, these held (and any pins)."""
        out: dict[str, int] = {}
        for o in self.obligations:
            for a, n in o.fixed_sizes:
                out.setdefault(a, n)
        return out


@dataclass(frozen=True)
class CheckReport:
    file: str
    plans: tuple[PlanReport, ...]
    timeout: float
    pinned: tuple[tuple[str, int], ...] = ()
    assumed: tuple[str, ...] = field(default=())

    @property
    def obligations(self) -> tuple[ObligationResult, ...]:
        return tuple(o for p in self.plans for o in p.obligations)

    def counts(self) -> dict[Verdict, int]:
        out = {v: 0 for v in Verdict}
        for o in self.obligations:
            out[o.verdict] += 1
        return out

    @property
    def verdict(self) -> Verdict:
        return min((p.verdict for p in self.plans), default=Verdict.PROVED)

    @property
    def exit_status(self) -> int:
        return int(exit_for(self.verdict))


def coords_text(names, coord) -> str:
    """A device's coordinates as ``(dp=0, tp=1)``."""
    return "(" + ", ".join(f"{n}={c}" for n, c in zip(names, coord)) + ")"
