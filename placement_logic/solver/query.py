"""Proof obligations: what a theorem states and the solver query that decides it.

Input: nothing (definitions). Output: ``Obligation`` (a named statement, the verdict it
is expected to get, and a builder of its *negation* as z3 constraints) and ``Query``
(the constraints plus a function that turns a solver model into readable witness lines).

Every obligation is decided the same way: the negation of the statement is handed to
the solvers; ``unsat`` proves the statement, ``sat`` refutes it and the model is the
counterexample. Necessity witnesses and broken-rule compositions are obligations whose
statement is *expected* to be refuted: the solver's model is the witness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..outcome import Verdict

PROVED = Verdict.PROVED
REFUTED = Verdict.REFUTED


@dataclass
class Query:
    """The negation of a statement: constraints, and how to show a model of them."""

    constraints: list
    explain: Callable[[Any], tuple[tuple[str, str], ...]] = lambda model: ()
    # Re-checks a witness without the solver; returns an error text when it does not hold.
    replay: Callable[[Any], str | None] = lambda model: None


@dataclass(frozen=True)
class Obligation:
    key: str  # stable file stem, e.g. "memory/zero3-closed-form"
    theorem: str  # the theorem it belongs to, e.g. "Memory derivation"
    name: str  # one line, e.g. "ZeRO-3 model state = (4 + K)Ψ/N"
    statement: str  # the statement in mathematical notation
    expect: Verdict  # PROVED, or REFUTED for witnesses and broken rules
    build: Callable[[Any], Query]  # z3 context -> Query
    source: str = ""  # which engine piece the formulas come from
    detail: tuple[tuple[str, str], ...] = field(default=())  # extra report lines (closed forms, conditions)

    @property
    def kind(self) -> str:
        return "theorem" if self.expect is PROVED else "witness"
