"""An explicit solver session: one z3 context, a time limit, and timing records.

Input: z3 constraints built in the session's context. Output: ``Outcome`` (sat with a
model, unsat, or unknown with z3's reason) and per-query timings. Nothing global: every
term is created in ``Session.ctx`` and every query gets a fresh solver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import z3


class SolverStatus(StrEnum):
    """A solver's answer to a query (the SMT-LIB words)."""

    SAT = "sat"
    UNSAT = "unsat"
    UNKNOWN = "unknown"


@dataclass
class Outcome:
    status: SolverStatus
    model: Any = None  # z3.ModelRef when sat
    reason: str = ""
    seconds: float = 0.0


@dataclass
class Session:
    """Solver state for one check run. ``timeout`` is seconds per query."""

    timeout: float = 10.0
    ctx: z3.Context = field(default_factory=z3.Context)
    timings: list[tuple[str, float, str]] = field(default_factory=list)
    remember: bool = False  # answer a repeated query from the first one (see ``check``)
    _decided: dict = field(default_factory=dict, repr=False)  # query key -> (its terms, its outcome)

    # ----------------------------------------------------------- term constructors
    def int(self, name: str) -> z3.ArithRef:
        return z3.Int(name, self.ctx)

    def real(self, name: str) -> z3.ArithRef:
        return z3.Real(name, self.ctx)

    def bool(self, name: str) -> z3.BoolRef:
        return z3.Bool(name, self.ctx)

    def num(self, value) -> z3.ArithRef:
        return z3.RealVal(str(value), self.ctx)

    def true(self) -> z3.BoolRef:
        return z3.BoolVal(True, self.ctx)

    def false(self) -> z3.BoolRef:
        return z3.BoolVal(False, self.ctx)

    # ----------------------------------------------------------- queries
    def raw_check(self, solver: z3.Solver) -> Any:
        """One z3 call; tests replace it to simulate a solver that gives up."""
        return solver.check()

    def check(self, label: str, constraints: list, timeout: float | None = None) -> Outcome:
        """One query; ``timeout`` (seconds) shortens the session's limit for this query.

        In a session that remembers (``remember``), a query identical to one it has decided
        (the same constraints, in order, under the same limit) gets that outcome again without
        calling the solver: z3 shares structurally equal terms of a context as one node, so
        equal node ids are equal constraints, and the session keeps the first query's terms
        alive so that no id is reused. (Checking many plans asks many such queries: an
        obligation that does not depend on the rest of the plan is the same query in every plan
        that has it.) Off by default: a skipped solver call leaves z3's context in another
        state, so a later query's model (a counterexample shown to the user) may be another
        one, equally valid; ``prove``'s compositions, which read only verdicts, remember."""
        limit = self.timeout if timeout is None else min(timeout, self.timeout)
        key = _key(constraints, limit) if self.remember else None
        hit = self._decided.get(key) if key is not None else None
        if hit is not None:
            out = replace(hit[1], seconds=0.0)
            self.timings.append((label, 0.0, out.status))
            return out
        out = self._solve(label, constraints, limit)
        if key is not None and out.status != SolverStatus.UNKNOWN:  # a query z3 gave up on is asked again
            self._decided[key] = (list(constraints), out)
        return out

    def _solve(self, label: str, constraints: list, limit: float) -> Outcome:
        solver = z3.Solver(ctx=self.ctx)
        solver.set("timeout", max(1, int(limit * 1000)))
        solver.add(*constraints)
        start = time.perf_counter()
        result = self.raw_check(solver)
        seconds = time.perf_counter() - start
        if result == z3.sat:
            out = Outcome(SolverStatus.SAT, solver.model(), seconds=seconds)
        elif result == z3.unsat:
            out = Outcome(SolverStatus.UNSAT, seconds=seconds)
        else:
            reason = solver.reason_unknown() if result == z3.unknown else str(result)
            out = Outcome(SolverStatus.UNKNOWN, reason=reason or "unknown", seconds=seconds)
        self.timings.append((label, seconds, out.status))
        return out


def _key(constraints: list, limit: float) -> tuple | None:
    """The identity of a query in its context: its terms' node ids, in order, and its limit
    (``None`` when a constraint is not a z3 term: such a query is not remembered)."""
    try:
        return tuple(c.get_id() for c in constraints), limit
    except AttributeError:
        return None


def value_of(model: Any, term: Any) -> Any:
    """A model's value for ``term`` as int, Fraction or bool (model completion on)."""
    from fractions import Fraction

    v = model.evaluate(term, model_completion=True)
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        return Fraction(v.numerator_as_long(), v.denominator_as_long())
    if z3.is_algebraic_value(v):
        raise ValueError("irrational model value")
    raise ValueError(f"unexpected model value {v}")
