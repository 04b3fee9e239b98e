"""How `placement check` grows with the number of data-like axes: one plan with k data axes
(ZeRO-2 on each), every obligation, all mesh sizes symbolic. Warm, in process; the solver
time is the time inside z3. The encoding is polynomial in the number of axes (token counts,
squared norms and overflow flags in product form), so time grows with the number of
obligations, not with the 2^k blocks of devices.

Then refutations: the same plan with a known bug, for 1..K data axes: the loss a mean of
per-device means (every GI normalisation refuted) and the gradient not reduced over the
last axis, each with all sizes symbolic and with every size pinned to 2. One run each
(a refutation's time is mostly z3's on the for-all query, which varies from run to run).

Usage: python benchmarks/bench_scaling.py [--max-axes K] [--repeat N] [--no-proved] [--no-refuted]
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

from irkit import ov, plan  # the test suite's hand-built IR (on the path set above)
from machine import cores, cpu_name

from placement_logic.check.run import check_plan
from placement_logic.solver.session import Session


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-axes", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-proved", action="store_true")
    ap.add_argument("--no-refuted", action="store_true")
    args = ap.parse_args(argv)
    if not args.no_proved:
        proved(args)
    if not args.no_refuted:
        refuted(args.max_axes)
    return 0


BUGS = {
    "mean of means": lambda k: (ov("loss", "per_device_mean"),),
    "no reduction over the last axis": lambda k: (ov("grads", "reduce", None, tuple(f"d{i}" for i in range(k - 1))),),
}


def refuted(max_axes: int) -> None:
    import platform

    import z3

    print(f"\nmachine: {cpu_name()}, {cores()} logical CPUs, Python {platform.python_version()}, z3 {z3.get_version_string()}")
    print("| bug | sizes | data axes | obligations | refuted | unknown | wall (s) | solver (s) | verdict |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for bug, overrides in BUGS.items():
        for pin in (False, True):
            for k in range(1, max_axes + 1):
                axes = {f"d{i}": ("data", "R,S,S,R") for i in range(k)}
                spec, p = plan("p", axes, overrides=overrides(k))
                pinned = {a: 2 for a in axes} if pin else {}
                sess = Session(timeout=10)
                t = time.perf_counter()
                report = check_plan(sess, spec, p, pinned)
                wall = time.perf_counter() - t
                count = {v: sum(1 for o in report.obligations if o.verdict.word == v) for v in ("refuted", "unknown")}
                print(f"| {bug} | {'all 2' if pin else 'symbolic'} | {k} | {len(report.obligations)} | "
                      f"{count['refuted']} | {count['unknown']} | {wall:.2f} | "
                      f"{sum(s for _, s, _ in sess.timings):.2f} | {report.verdict.word} |", flush=True)


def proved(args) -> None:
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


if __name__ == "__main__":
    raise SystemExit(main())
