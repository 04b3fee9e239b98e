"""Run a user's script on N ranks as ``torchrun --nproc-per-node N`` would, traced.

Input: the command after ``--`` (``python SCRIPT.py ARGS...`` or ``SCRIPT.py ARGS...``)
and N. Output: the merged trace (``schema.TRACE_SCHEMA``, version ``schema.VERSION``).
Each rank is a fresh interpreter running ``python -m placement_logic.trace.bootstrap``
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (a
free port of 127.0.0.1, as ``measure`` uses); the ranks' standard output and error are
kept for the report. Torch is imported only inside the ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..diagnostics import Diagnostic, DiagnosticError, Span
from ..measure.runner import free_port
from .schema import TRACE_SCHEMA, VERSION

RUN_TIMEOUT_S = 600
MIN_PROCS, MAX_PROCS = 2, 8


def command_line_span(text: str) -> Span:
    return Span("<command line>", 1, 1, 1, len(text) + 1)


def script_of(command: list[str]) -> tuple[str, list[str]]:
    """(script path, its arguments) from ``python SCRIPT ARGS`` or ``SCRIPT ARGS``."""
    rest = list(command)
    if rest and (Path(rest[0]).name.startswith("python") or rest[0] == sys.executable):
        rest = rest[1:]
    if not rest or rest[0].startswith("-"):
        text = " ".join(command) or "(nothing after --)"
        raise DiagnosticError([Diagnostic("PL611", f"expected '-- python SCRIPT.py ARGS...', got {text}",
                                          command_line_span(text))])
    if not Path(rest[0]).is_file():
        raise DiagnosticError([Diagnostic("PL611", f"no script {rest[0]}", command_line_span(rest[0]))])
    return rest[0], rest[1:]


def run_traced(command: list[str], nproc: int, timeout: int = RUN_TIMEOUT_S) -> dict:
    script, argv = script_of(command)
    package_root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="placement-trace-") as outdir:
        port = free_port()
        procs = []
        for rank in range(nproc):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
            env.setdefault("OMP_NUM_THREADS", "1")
            env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                       GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                       TORCHELASTIC_RUN_ID="placement-trace")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "placement_logic.trace.bootstrap", str(Path(outdir, f"rank{rank}.json")),
                 script, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        ranks, failures = [], []
        for rank, proc in enumerate(procs):
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise DiagnosticError([Diagnostic(
                    "PL613", f"rank {rank} of {script} did not finish within {timeout} s")]) from None
            path = Path(outdir, f"rank{rank}.json")
            part = json.loads(path.read_text()) if path.exists() else None
            if part is None or proc.returncode != 0:
                failures.append((rank, proc.returncode, part, stderr))
            if part is not None:
                part["stdout_tail"] = stdout.splitlines()[-5:]
                ranks.append(part)
        if failures:
            raise DiagnosticError([_failure(script, *failures[0])])
    return {
        "schema": TRACE_SCHEMA,
        "version": VERSION,
        "world": nproc,
        "script": os.path.relpath(script),
        "argv": argv,
        "torch": ranks[0].get("torch_version", "") if ranks else "",
        "ranks": sorted(ranks, key=lambda r: r["rank"]),
    }


def _failure(script: str, rank: int, status: int, part: dict | None, stderr: str) -> Diagnostic:
    error = (part or {}).get("error")
    if error:
        return Diagnostic("PL613", f"rank {rank} of the traced script failed: {error['message']}",
                          Span.point(error["file"], error["line"], 1))
    last = [line for line in (stderr or "").strip().splitlines() if line.strip()][-1:] or ["no output"]
    return Diagnostic("PL613", f"rank {rank} of {script} exited with status {status}: {last[0]}")
