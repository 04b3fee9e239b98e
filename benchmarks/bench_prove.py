"""Benchmark of ``placement prove``: time per theorem group, z3 and cvc5 solver time.

Usage: ``python benchmarks/bench_prove.py``. Prints, per group, the wall time to build
and decide its obligations and the summed solver time of each solver, then the machine.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from placement_logic.prove import GROUPS, prove


def main() -> None:
    total = 0.0
    print(f"{'group':<12} {'obligations':>11} {'wall s':>8} {'z3 s':>8} {'cvc5 s':>8}")
    for group in GROUPS:
        start = time.perf_counter()
        report, _ = prove(only=(group,))
        wall = time.perf_counter() - start
        total += wall
        solver = {name: sum(s.seconds for r in report.results for s in r.solvers if s.solver == name)
                  for name in ("z3", "cvc5")}
        print(f"{group:<12} {len(report.results):>11} {wall:>8.2f} {solver['z3']:>8.2f} {solver['cvc5']:>8.2f}")
    print(f"{'all':<12} {'':>11} {total:>8.2f}")
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
