"""How much of a check z3 decides: every obligation's for-all query over the examples and the
mutation/equivalence corpus (tests/corpus), asked of z3's ``simplify`` alone (rewriting,
no search) and of the solver.

The step model is derived in Python (``check.steps``: which reductions each group's gradient
receives, how often, the loss normaliser and the divisor), so for most obligations the
multiplicities reach the query as constants and the negation folds to ``false`` before any
search. This counts them: per obligation, whether the conjunction of the query's side
constraints and negated condition simplifies to ``false``, and z3's verdict on it.

Usage: python benchmarks/bench_simplify.py [--timeout S]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import z3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import cores, cpu_name

from placement_logic.check import encode as en
from placement_logic.check.plan import PlanChecker
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_spec
from placement_logic.solver.session import Session


def files() -> list[Path]:
    return sorted((ROOT / "examples").rglob("*.place")) + sorted((ROOT / "tests" / "corpus").rglob("*.place"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args(argv)
    tally: Counter = Counter()
    by_condition: Counter = Counter()
    for path in files():
        try:
            spec = load_spec(path)
        except DiagnosticError:
            tally["files that do not load"] += 1
            continue
        for p in spec.plans:
            sess = Session(timeout=args.timeout)
            try:
                checker = PlanChecker(spec, p)
            except DiagnosticError:
                tally["plans rejected"] += 1
                continue
            tally["plans"] += 1
            for ob in checker.obligations():
                env = en.Env(sess, checker.step, checker.bindings, {}, None, False, checker.step.equal_tokens)
                cons, _ = ob.encode(env)
                query = z3.And(env.side + cons)
                folded = z3.is_false(z3.simplify(query))
                status = sess.check(ob.name, env.side + cons).status
                tally["queries"] += 1
                tally[f"z3 {status}"] += 1
                if folded:
                    tally["simplify -> false"] += 1
                    by_condition[ob.condition] += 1
                if status == "unsat":
                    tally["unsat, simplify -> false" if folded else "unsat, needs the solver"] += 1
                    if not folded:
                        by_condition[f"needs the solver: {ob.condition}"] += 1
    print(f"machine: {cpu_name()}, {cores()} logical CPUs, z3 {z3.get_version_string()}")
    print(f"files: {len(files())}")
    for k in ("plans", "queries", "z3 unsat", "z3 sat", "z3 unknown", "simplify -> false",
              "unsat, simplify -> false", "unsat, needs the solver", "plans rejected", "files that do not load"):
        print(f"{k}: {tally[k]}")
    unsat = tally["z3 unsat"]
    if unsat:
        print(f"share of proved queries that simplify alone decides: {tally['unsat, simplify -> false'] / unsat:.1%}")
    for k, v in sorted(by_condition.items()):
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
