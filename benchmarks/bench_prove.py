"""Benchmark of ``placement prove``: CPU time per theorem group, z3 and cvc5 solver time,
paired with llm-analysis.

Usage: ``python benchmarks/bench_prove.py [--llm-analysis PYTHON]``. Prints, per group, the
CPU time (``time.process_time``: a shared machine disturbs it less than wall time) to build and
decide its obligations and the summed solver time of each solver (wall, inside the solver
calls), then the whole run; with llm-analysis (``--llm-analysis``, ``$LLM_ANALYSIS_PYTHON`` or
``/work/llmvenv/bin/python``) the CPU time of its cold command line (benchmarks/bench_cold.py's
configuration, median of 5) measured in the same run, and the ratio of the whole prove run to it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_cold import LLM_ANALYSIS, cpu, llm_python, version  # noqa: E402
from machine import cores, cpu_name  # noqa: E402

from placement_logic.prove import GROUPS, prove  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llm-analysis", metavar="PYTHON", default=None)
    args = ap.parse_args(argv)
    total = 0.0
    print(f"{'group':<12} {'obligations':>11} {'CPU s':>8} {'z3 s':>8} {'cvc5 s':>8}")
    for group in GROUPS:
        start = time.process_time()
        report, _ = prove(only=(group,))
        spent = time.process_time() - start
        total += spent
        solver = {name: sum(s.seconds for r in report.results for s in r.solvers if s.solver == name)
                  for name in ("z3", "cvc5")}
        print(f"{group:<12} {len(report.results):>11} {spent:>8.2f} {solver['z3']:>8.2f} {solver['cvc5']:>8.2f}")
    print(f"{'all':<12} {'':>11} {total:>8.2f}")
    other = llm_python(args.llm_analysis)
    if other:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        llm = statistics.median(cpu([other, *LLM_ANALYSIS], clean) for _ in range(5))
        print(f"llm-analysis {version(other, 'llm-analysis')} cold command line: {llm:.3f} s CPU; "
              f"the whole prove run is {total / llm:.0f}× it")
    print(f"machine: {cpu_name()}, {cores()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
          f"Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
