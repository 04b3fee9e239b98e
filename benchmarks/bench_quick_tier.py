"""The quick test tier's time: ``python benchmarks/bench_quick_tier.py [--top N] [--over S]``.

Runs ``python -m pytest -q`` (the quick tier, one worker per core) with ``tier_timer`` recording
each test's CPU time, and prints the run's wall time, its CPU time (user + system of pytest, its
workers and their subprocesses), each worker's share, the machine and its load, and the ``--top``
slowest tests by CPU time (``--over S``: every test of at least S seconds). ``--mark-over S`` adds
every quick test of at least S seconds to ``tests/slow_measured.txt`` (read into ``SLOW`` by
``tests/conftest.py``), but for the modules of ``KEEP`` and the last quick test of a module: each
module keeps a test in the quick tier. ``--save FILE`` keeps the run's rows, ``--rows FILE`` reads
them instead of running. The figures go to docs/benchmarks.md, "The quick test tier"."""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cores, cpu_name  # noqa: E402


def run(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.jsonl"
        env = dict(os.environ, TIER_TIMER_OUT=str(out),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")])))
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tier_timer", "-p", "no:cacheprovider",
                               *extra], cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"status": proc.returncode, "summary": (proc.stdout.strip().splitlines()[-1:] or [""]) + failed,
            "wall": wall, "cpu": cpu, "load": (load, os.getloadavg()[0]), "rows": rows}


MEASURED = ROOT / "tests" / "slow_measured.txt"
# the modules whose checks a contributor trips over first (layering, lint, diagnostics' registry): always quick
KEEP = ("tests/test_layering.py", "tests/test_lint.py", "tests/test_check_layers.py", "tests/test_diagnostics.py",
        "tests/test_tiers.py")


def mark(rows: list[dict], over: float) -> list[str]:
    """The tests of ``rows`` of at least ``over`` CPU seconds that go to ``MEASURED``: the slowest
    first, never a module's last quick test nor a test of ``KEEP``."""
    left = collections.Counter(row["test"].split("::")[0] for row in rows)
    added = []
    for row in sorted(rows, key=lambda row: -row["cpu"]):
        module = row["test"].split("::")[0]
        if row["cpu"] < over or module in KEEP or left[module] <= 1:
            continue
        left[module] -= 1
        added.append(f"{row['test']}  # {row['cpu']:.2f} s")
    return added


def write_measured(added: list[str]) -> None:
    old = MEASURED.read_text(encoding="utf-8").splitlines() if MEASURED.exists() else []
    have = {line.split("  #")[0] for line in old}
    lines = old + [line for line in added if line.split("  #")[0] not in have]
    tmp = MEASURED.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(MEASURED)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=25, help="list the N slowest tests (default 25)")
    ap.add_argument("--over", type=float, help="list every test of at least this many CPU seconds instead")
    ap.add_argument("--mark-over", type=float, help="add the quick tests of at least this many CPU seconds to "
                    "tests/slow_measured.txt")
    ap.add_argument("--rows", type=Path, help="read the rows of an earlier --save instead of running the tier")
    ap.add_argument("--save", type=Path, help="write every test's row (JSON lines) to this file")
    ap.add_argument("pytest_args", nargs="*", help="more arguments for pytest")
    args = ap.parse_args(argv)
    if args.rows:
        rows = [json.loads(line) for line in args.rows.read_text(encoding="utf-8").splitlines()]
        r = {"status": 0, "summary": [f"rows of {args.rows}"], "wall": 0.0, "cpu": 0.0, "load": os.getloadavg() * 1,
             "rows": rows}
    else:
        r = run(args.pytest_args)
    if args.save:
        args.save.write_text("".join(json.dumps(row) + "\n" for row in r["rows"]), encoding="utf-8")
    workers = collections.Counter()
    for row in r["rows"]:
        workers[row["worker"]] += row["cpu"]
    print(f"machine: {cpu_name()}, {cores()} cores; load average {r['load'][0]:.1f} before, {r['load'][1]:.1f} after")
    print(f"pytest: {r['summary'][0]} (exit status {r['status']})")
    for line in r["summary"][1:]:
        print(f"  {line}")
    print(f"wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s (user + sys of pytest, its workers and their children)")
    print(f"tests: {len(r['rows'])}, their CPU {sum(workers.values()):.1f} s; per worker: "
          + ", ".join(f"{w} {s:.1f} s" for w, s in sorted(workers.items())))
    rows = sorted(r["rows"], key=lambda row: -row["cpu"])
    shown = [row for row in rows if row["cpu"] >= args.over] if args.over is not None else rows[:args.top]
    for row in shown:
        print(f"{row['cpu']:7.2f} s  {row['test']}")
    if args.mark_over is not None:
        added = mark(r["rows"], args.mark_over)
        write_measured(added)
        print(f"{len(added)} tests of at least {args.mark_over} s CPU in {MEASURED.relative_to(ROOT)}")
    return r["status"]


if __name__ == "__main__":
    raise SystemExit(main())
