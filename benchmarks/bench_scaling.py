"""How `placement check` grows with the number of data-like axes: one plan with k data axes
(ZeRO-2 on each), every obligation, all mesh sizes symbolic. Warm, in process; the solver
time is the time inside z3. The encoding is polynomial in the number of axes (token counts,
squared norms and overflow flags in product form), so time grows with the number of
obligations, not with the 2^k blocks of devices.

Usage: python benchmarks/bench_scaling.py [--max-axes K] [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from irkit import plan  # the test suite's hand-built IR (on the path set above)

from placement_logic.check.run import check_plan
from placement_logic.solver.session import Session


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-axes", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print("| data axes | obligations | warm (ms) | solver (ms) | verdict |")
    print("|---:|---:|---:|---:|---|")
    for k in range(1, args.max_axes + 1, 2):
        spec, p = plan("p", {f"d{i}": ("data", "R,S,S,R") for i in range(k)})
        walls, solver, report = [], [], None
        for _ in range(args.repeat):
            sess = Session(timeout=30)
            t = time.perf_counter()
            report = check_plan(sess, spec, p, {})
            walls.append(time.perf_counter() - t)
            solver.append(sum(s for _, s, _ in sess.timings))
        print(f"| {k} | {len(report.obligations)} | {statistics.median(walls) * 1e3:.0f} | "
              f"{statistics.median(solver) * 1e3:.0f} | {report.verdict.word} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
