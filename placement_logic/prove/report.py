"""Report data of a prove run: plain frozen data that renderers turn into text.

Input: what the solvers decided. Output: ``ProveReport`` -> ``Result`` per obligation,
with both solvers' verdicts, the witness (for refutations), and the status words the
renderers show. Nothing here knows of z3, cvc5 or lark.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..outcome import Exit, Verdict


class ProveStatus(StrEnum):
    """What the report shows for an obligation (``Result.status``)."""

    PROVED = "proved"  # a theorem proved
    WITNESS_FOUND = "witness found"  # a witness obligation: its witness exists
    NO_WITNESS = "no witness (proved)"  # a witness obligation whose negation was proved
    REFUTED = "refuted"  # a theorem refuted
    UNKNOWN = "unknown"
    ERROR = "error"  # the solvers disagree, or a witness did not replay


class ClaimHolds(StrEnum):
    """Where a spec's claim holds (``ClaimResult.holds``)."""

    ALWAYS = "always"
    NEVER = "never"
    CONDITIONAL = "conditional"
    UNKNOWN = "unknown"  # no closed-form condition found


@dataclass(frozen=True)
class SolverVerdict:
    solver: str  # z3 | cvc5
    verdict: Verdict
    seconds: float
    reason: str = ""


@dataclass(frozen=True)
class Result:
    key: str
    theorem: str
    name: str
    statement: str
    expect: Verdict
    verdict: Verdict  # the combined verdict (see ``combine``)
    solvers: tuple[SolverVerdict, ...]
    source: str = ""
    witness: tuple[tuple[str, str], ...] = ()  # the counterexample or witness, as label/value
    detail: tuple[tuple[str, str], ...] = ()
    error: str = ""  # solver disagreement, or a witness that did not replay

    @property
    def kind(self) -> str:
        return "theorem" if self.expect is Verdict.PROVED else "witness"

    @property
    def ok(self) -> bool:
        return not self.error and self.verdict is self.expect

    @property
    def status(self) -> ProveStatus:
        """What the report shows: proved / witness found / refuted / unknown / disagreement."""
        if self.error:
            return ProveStatus.ERROR
        if self.verdict is Verdict.UNKNOWN:
            return ProveStatus.UNKNOWN
        if self.expect is Verdict.REFUTED:
            return ProveStatus.WITNESS_FOUND if self.verdict is Verdict.REFUTED else ProveStatus.NO_WITNESS
        return ProveStatus.PROVED if self.verdict is Verdict.PROVED else ProveStatus.REFUTED

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.solvers)


@dataclass(frozen=True)
class ClaimResult:
    """A claim of a spec: the exact condition under which it holds."""

    file: str
    label: str
    text: str  # the claim as written
    holds: ClaimHolds
    condition: str  # e.g. "dp = 8" (empty when always/never)
    at_values: str  # "true" / "false" at the spec's bound values, with the values
    keys: tuple[str, ...]  # the obligations that confirm the condition


@dataclass(frozen=True)
class ProveReport:
    results: tuple[Result, ...]
    claims: tuple[ClaimResult, ...] = ()
    timeout: float = 0.0
    exported: str = ""  # folder the .smt2 files were written to, if any

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys((ProveStatus.PROVED, ProveStatus.WITNESS_FOUND, ProveStatus.REFUTED, ProveStatus.UNKNOWN,
                             ProveStatus.ERROR), 0)
        for r in self.results:
            key = r.status if r.status in out else ProveStatus.REFUTED
            out[key] += 1
        return out

    @property
    def errors(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r.error)

    @property
    def failed(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if not r.ok and r.verdict is not Verdict.UNKNOWN or r.error)

    @property
    def false_claims(self) -> tuple[ClaimResult, ...]:
        """Claims that hold for no values of their symbols."""
        return tuple(c for c in self.claims if c.holds == ClaimHolds.NEVER)

    @property
    def exit_status(self) -> int:
        if self.failed or self.false_claims:
            return int(Exit.FAILED)
        if any(r.verdict is Verdict.UNKNOWN for r in self.results):
            return int(Exit.UNKNOWN)
        return int(Exit.OK)

    @property
    def verdict_word(self) -> str:
        return {Exit.OK: ProveStatus.PROVED, Exit.FAILED: "failed", Exit.UNKNOWN: ProveStatus.UNKNOWN}[self.exit_status]
