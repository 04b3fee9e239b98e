"""What tracing costs: ``python benchmarks/bench_trace.py``.

For each script of examples/traced/ (2 processes, gloo on CPU): the wall time of the
script run plainly (the environment torchrun gives, no recorder), the same run under
``placement trace`` (the recorder on every rank, the trace merged), and lifting plus
checking the trace. Median of ``--repeat`` runs (default 3). Prints JSON with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import cores, cpu_name  # noqa: E402

from placement_logic.measure.runner import free_port  # noqa: E402

SCRIPTS = ("ddp.py", "fsdp.py", "tp_sp.py")


def plain(script: str, nproc: int = 2) -> float:
    port = free_port()
    t0 = time.perf_counter()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, script], env=env, cwd=ROOT / "examples" / "traced",
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def traced(script: str, out: Path, nproc: int = 2) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "placement_logic.cli", "trace", "--nproc", str(nproc), "-o", str(out), "--",
                    "python", f"examples/traced/{script}"], cwd=ROOT, check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return time.perf_counter() - t0


def lift_and_check(trace: Path, spec: Path) -> float:
    t0 = time.perf_counter()
    with open(spec, "w") as fh:
        subprocess.run([sys.executable, "-m", "placement_logic.cli", "lift", str(trace)], cwd=ROOT, stdout=fh,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    subprocess.run([sys.executable, "-m", "placement_logic.cli", "check", "-q", str(spec)], cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for script in SCRIPTS:
            trace, spec = Path(tmp, "t.json"), Path(tmp, "t.place")
            p = [plain(script) for _ in range(args.repeat)]
            t = [traced(script, trace) for _ in range(args.repeat)]
            c = [lift_and_check(trace, spec) for _ in range(args.repeat)]
            rows.append({"script": script, "plain_s": statistics.median(p), "traced_s": statistics.median(t),
                         "lift_check_s": statistics.median(c), "trace_bytes": trace.stat().st_size})
    print(json.dumps({"machine": {"cpu": cpu_name(), "cores": cores(), "python": platform.python_version()},
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
