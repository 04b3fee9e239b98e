"""Launch measurement ranks and collect what they measured.

Input: ``Job``s that share one world size. Output: for each job key, the list of
per-rank result dicts (ordered by rank). Each rank is a fresh interpreter running
``python -m placement_logic.measure.ranks.worker`` (so no caller's main module is re-imported);
the ranks meet over TCP on a free port of 127.0.0.1 and write their results to a
temporary directory. Torch is imported only inside the ranks.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from .job import Job

RUN_TIMEOUT_S = 600


class LaunchError(Exception):
    """The ranks could not be started or one of them died."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(procs: list[subprocess.Popen], outdir: str) -> None:
    """Wait for every rank; raise ``LaunchError`` naming each rank that failed. A rank that exits
    abnormally after *every* rank marked its results complete (``ranks/shutdown.py``: the
    marker follows a barrier that every rank passed after writing) died in teardown: its
    results are whole and stand."""
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise LaunchError(f"rank {rank} did not finish within {RUN_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            last = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
            errors.append(f"rank {rank} exited with status {proc.returncode}: {last[0]}")
    if errors and not all(Path(outdir, f"done.{rank}").exists() for rank in range(len(procs))):
        raise LaunchError("; ".join(errors))


def launch(jobs: list[Job], world: int) -> dict[str, list[dict]]:
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="placement-measure-") as outdir:
        Path(outdir, "jobs.pkl").write_bytes(pickle.dumps(list(jobs)))
        port = free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "placement_logic.measure.ranks.worker", outdir, str(rank), str(world), str(port)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            for rank in range(world)
        ]
        wait_for(procs, outdir)
        results: dict[str, list[dict]] = {}
        for job in jobs:
            ranks = []
            for rank in range(world):
                path = Path(outdir, f"{job.key}.{rank}.json")
                if not path.exists():
                    raise LaunchError(f"rank {rank} wrote no result for {job.key}")
                ranks.append(json.loads(path.read_text()))
            results[job.key] = ranks
        return results
