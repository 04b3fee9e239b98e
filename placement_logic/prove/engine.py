"""Discharging obligations: each with z3 and with cvc5, compared, witnesses replayed.

Input: ``Obligation`` objects and a per-query time limit. Output: ``Result`` records
(both verdicts, combined verdict, witness lines, any disagreement) and, on request, the
SMT-LIB 2 text of every query keyed by obligation (``export_texts``). One z3 context per
obligation; no global solver state.
"""

from __future__ import annotations

import z3

from ..check.report import Verdict
from ..solver.backends import run_cvc5, run_z3, smt2_text
from ..solver.query import Obligation
from .report import Result, SolverVerdict


def decide(ob: Obligation, timeout: float, second: bool = True) -> tuple[Result, str]:
    """Both solvers on one obligation; returns the result and the SMT-LIB text."""
    ctx = z3.Context()
    query = ob.build(ctx)
    text = smt2_text(ob, query, ctx)
    first = run_z3(query, ctx, timeout)
    runs = [first]
    if second:
        runs.append(run_cvc5(text, timeout))
    definite = [r.verdict for r in runs if r.verdict is not Verdict.UNKNOWN]
    error = ""
    if len(set(definite)) > 1:
        error = "solvers disagree: " + ", ".join(f"{r.solver} {r.verdict.word}" for r in runs)
    verdict = definite[0] if definite else Verdict.UNKNOWN
    witness: tuple[tuple[str, str], ...] = ()
    if first.verdict is Verdict.REFUTED and not error:
        witness = query.explain(first.model)
        problem = query.replay(first.model)
        if problem:
            error = f"witness does not replay without the solver: {problem}"
    elif verdict is Verdict.REFUTED and not error:
        witness = (("note", "cvc5 found a model; z3 gave no verdict, so no witness is shown"),)
    result = Result(
        ob.key, ob.theorem, ob.name, ob.statement, ob.expect, verdict,
        tuple(SolverVerdict(r.solver, r.verdict, r.seconds, r.reason) for r in runs),
        ob.source, witness, ob.detail, error,
    )
    return result, text


def export_texts(obligations: list[Obligation]) -> dict[str, str]:
    """The SMT-LIB 2 text of every obligation, without solving (for ``--export``)."""
    out = {}
    for ob in obligations:
        ctx = z3.Context()
        out[ob.key] = smt2_text(ob, ob.build(ctx), ctx)
    return out
