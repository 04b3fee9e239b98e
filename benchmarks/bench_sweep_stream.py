"""Streamed sweep benchmark: ``python benchmarks/bench_sweep_stream.py [ROWS ...]``.

``placement cost examples/zero_paper.place --set dp=1..N --format F`` for N = 1e3, 1e4, 1e5
(or the sizes given) and every format (csv, json, markdown, text), each in a fresh process:
its peak resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the whole process:
Python, sympy, numpy and rich included), its wall time, and configurations per second. A
process of 1 configuration gives the memory every run starts from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import cores, cpu_name  # noqa: E402

CHILD = r"""
import io, os, resource, sys, time
os.environ["PLACEMENT_NO_CACHE"] = "1"
from placement_logic.cli import main

class Nowhere(io.TextIOBase):
    def write(self, s):
        return len(s)

n, fmt = int(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
status = main(["cost", "examples/zero_paper.place", "--set", f"dp=1..{n}", "--format", fmt], Nowhere(), io.StringIO())
t1 = time.perf_counter()
print(t1 - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, status)
"""


def one(n: int, fmt: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), fmt], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    seconds, rss_kib = float(out[0]), int(out[1])
    return {"rows": n, "format": fmt, "s": seconds, "peak_rss_mib": rss_kib / 1024, "rows_per_s": n / seconds}


def main() -> int:
    sizes = [int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000]
    print("machine:", json.dumps({"cpu": cpu_name(), "cores": cores(), "python": sys.version.split()[0]}))
    t = time.perf_counter()
    base = one(1, "csv")
    print(f"[sweep-stream] 1 configuration: peak RSS {base['peak_rss_mib']:.0f} MiB, {base['s']:.2f} s")
    for n in sizes:
        for fmt in ("csv", "json", "markdown", "text"):
            r = one(n, fmt)
            print(f"[sweep-stream] {n:>7,} configurations × 4 plans, {fmt:<8}: peak RSS {r['peak_rss_mib']:6.0f} MiB, "
                  f"{r['s']:7.2f} s, {r['rows_per_s']:8,.0f} configurations/s", flush=True)
    print(f"[sweep-stream] total {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
