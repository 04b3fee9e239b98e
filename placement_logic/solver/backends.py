"""Deciding obligations with two independent solvers through SMT-LIB 2 text.

Input: an ``Obligation``. Output: ``Decision`` records: z3's verdict (from the z3 API,
with a model when sat), the SMT-LIB 2 text of the query (declarations, assertions,
``check-sat``; the file ``placement prove --export`` writes) and cvc5's verdict on that
text, parsed by cvc5's own SMT-LIB parser. Time-outs are ``unknown``; nothing here
treats unknown as success.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import z3

from ..outcome import Verdict
from .query import Obligation, Query
from .session import SolverStatus

_STATUS = {SolverStatus.UNSAT: Verdict.PROVED, SolverStatus.SAT: Verdict.REFUTED}


@dataclass
class Run:
    solver: str
    verdict: Verdict
    seconds: float
    reason: str = ""
    model: Any = None


def verdict_word(v: Verdict) -> str:
    return v.word


def _comment(text: str) -> str:
    """Text safe inside one SMT-LIB comment line: no line break or other control character
    (a file name or a label could otherwise end the comment and inject commands)."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def smt2_text(ob: Obligation, query: Query, ctx: z3.Context) -> str:
    """The query as a self-contained SMT-LIB 2 script with the obligation as comments."""
    solver = z3.Solver(ctx=ctx)
    solver.add(*query.constraints)
    body = solver.to_smt2()
    lines = [ln for ln in body.splitlines() if not ln.startswith(("; benchmark", "(set-info :status", "(check-sat"))]
    expected = SolverStatus.UNSAT if ob.expect is Verdict.PROVED else SolverStatus.SAT
    head = [
        f"; placement-logic proof obligation: {_comment(ob.key)}",
        f"; theorem: {_comment(ob.theorem)}",
        f"; {_comment(ob.name)}",
    ]
    head += [f";   {_comment(ln)}" for ln in ob.statement.splitlines()]
    head += [
        "; the assertions are the NEGATION of the statement:",
        f";   expected {expected} ({'statement proved' if expected is SolverStatus.UNSAT else 'witness exists'})",
        "(set-logic ALL)",
        f"(set-info :status {expected})",
    ]
    return _renumber("\n".join(head + lines + ["(check-sat)", "(exit)"]) + "\n")


def _renumber(text: str) -> str:
    """z3's let names (?x123, $x45) numbered by first appearance: the numbers z3 picks depend on
    the order its terms were created in, which need not be the same from one process to the
    next; a consistent renaming keeps the script's meaning and makes the file reproducible."""
    names: dict[str, str] = {}

    def sub(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"{m.group(1)}x{sum(1 for k in names if k[0] == m.group(1))}")

    return re.sub(r"([?$])x\d+\b", sub, text)


def run_z3(query: Query, ctx: z3.Context, timeout: float) -> Run:
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", max(1, int(timeout * 1000)))
    solver.add(*query.constraints)
    start = time.perf_counter()
    result = solver.check()
    seconds = time.perf_counter() - start
    if result == z3.unsat:
        return Run("z3", Verdict.PROVED, seconds)
    if result == z3.sat:
        return Run("z3", Verdict.REFUTED, seconds, model=solver.model())
    return Run("z3", Verdict.UNKNOWN, seconds, reason=solver.reason_unknown() or "unknown")


def run_cvc5(text: str, timeout: float) -> Run:
    """cvc5 on the SMT-LIB text (its own parser; nothing shared with z3 but the text)."""
    import cvc5

    tm = cvc5.TermManager()
    slv = cvc5.Solver(tm)
    slv.setOption("tlimit-per", str(max(1, int(timeout * 1000))))
    parser = cvc5.InputParser(slv)
    parser.setStringInput(cvc5.InputLanguage.SMT_LIB_2_6, text, "obligation.smt2")
    symbols = parser.getSymbolManager()
    start = time.perf_counter()
    answer = ""
    try:
        while True:
            cmd = parser.nextCommand()
            if cmd.isNull():
                break
            out = cmd.invoke(slv, symbols).strip()
            if out:
                answer = out
    except RuntimeError as exc:
        return Run("cvc5", Verdict.UNKNOWN, time.perf_counter() - start, reason=f"cvc5: {exc}")
    seconds = time.perf_counter() - start
    if answer in _STATUS:
        return Run("cvc5", _STATUS[answer], seconds)
    return Run("cvc5", Verdict.UNKNOWN, seconds, reason=f"cvc5 answered {answer or 'nothing'}")
