"""Time `placement check` on every example plan: warm (in process) and cold (a fresh
`python -m placement_logic` process), and the solver time per obligation.

Usage: python benchmarks/bench_check.py [--repeat N] [--no-cold] [--plans-only PATTERN]
benchmarks/run.py calls ``main(argv)``. Output: Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import cores, cpu_name

from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_spec
from placement_logic.solver.session import Session


def machine() -> str:
    import z3

    cpu = cpu_name()
    return (f"{cpu}, {cores()} logical CPUs, Python {platform.python_version()}, "
            f"z3 {z3.get_version_string()}, {platform.system()} {platform.release()}")


def plans() -> list[tuple[Path, str]]:
    out = []
    for path in sorted((ROOT / "examples").rglob("*.place")):
        spec = load_spec(path)
        out.extend((path, p.name) for p in spec.plans)
    return out


def warm(path: Path, plan: str, repeat: int) -> tuple[float, list[tuple[str, float, str]], int]:
    spec = load_spec(path)
    check_spec(spec, plans=[plan])  # warm-up: imports, z3 context, caches
    times = []
    timings: list[tuple[str, float, str]] = []
    n = 0
    for _ in range(repeat):
        sess = Session(timeout=10)
        start = time.perf_counter()
        report = check_spec(spec, plans=[plan], session=sess)
        times.append(time.perf_counter() - start)
        timings = sess.timings
        n = len(report.obligations)
    return statistics.median(times), timings, n


def cold(path: Path, plan: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "placement_logic", "check", str(path), "--plan", plan, "--format", "json"],
                   cwd=ROOT, capture_output=True, check=False)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--plans-only", default="", help="only plans whose file path contains this text")
    args = ap.parse_args(argv)
    print("## Checker")
    print()
    print(f"Machine: {machine()}.")
    print()
    print(f"Warm: median of {args.repeat} in-process runs after one warm-up. Cold: one fresh process "
          "(interpreter start, imports, parsing, checking, JSON output).")
    print()
    print("| spec | plan | obligations | warm (ms) | cold (ms) | solver total (ms) | slowest obligation (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    per_obligation: dict[str, list[float]] = {}
    for path, plan in plans():
        rel = path.relative_to(ROOT)
        if args.plans_only and args.plans_only not in str(rel):
            continue
        w, timings, n = warm(path, plan, args.repeat)
        c = "" if args.no_cold else f"{cold(path, plan) * 1000:.0f}"
        by_ob: dict[str, float] = {}
        for label, seconds, _ in timings:
            name = label.split(":")[1]
            by_ob[name] = by_ob.get(name, 0.0) + seconds
        for name, s in by_ob.items():
            per_obligation.setdefault(name, []).append(s)
        slow = max(by_ob.items(), key=lambda kv: kv[1]) if by_ob else ("", 0.0)
        total = sum(by_ob.values())
        print(f"| {rel} | {plan} | {n} | {w * 1000:.1f} | {c} | {total * 1000:.1f} | "
              f"{slow[1] * 1000:.1f} ({slow[0]}) |")
    print()
    print("Solver time per obligation over all plans (all queries of the obligation, ms):")
    print()
    print("| obligation | plans | median | max |")
    print("|---|---:|---:|---:|")
    for name in sorted(per_obligation):
        xs = per_obligation[name]
        print(f"| {name} | {len(xs)} | {statistics.median(xs) * 1000:.2f} | {max(xs) * 1000:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
