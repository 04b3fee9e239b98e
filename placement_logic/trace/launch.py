"""Run a user's script on N ranks as ``torchrun --nproc-per-node N`` would, traced.

Input: the command after ``--`` (``python SCRIPT.py ARGS...`` or ``SCRIPT.py ARGS...``)
and N. Output: the merged trace (``schema.TRACE_SCHEMA``, version ``schema.VERSION``).
Each rank is a fresh interpreter running ``python -m placement_logic.trace.bootstrap``
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (a
free port of 127.0.0.1, as ``measure`` uses) in a process group of its own; the last 64 KiB
of the ranks' standard output and error are kept for the report, and a run past its time
limit ends every rank and every process a rank started. Torch is imported only inside the ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
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
        raise DiagnosticError([Diagnostic(Code.BAD_TRACE_COMMAND, f"expected '-- python SCRIPT.py ARGS...', got {text}",
                                          command_line_span(text))])
    if not Path(rest[0]).is_file():
        raise DiagnosticError([Diagnostic(Code.BAD_TRACE_COMMAND, f"no script {rest[0]}", command_line_span(rest[0]))])
    return rest[0], rest[1:]


TAIL_BYTES = 64 * 1024  # what is kept of each rank's standard output and error: the last 64 KiB


class _Tail:
    """Drains one pipe on a thread, keeping only its last ``TAIL_BYTES`` bytes: a script that
    prints without end costs bounded memory, and never blocks on a full pipe."""

    def __init__(self, stream):
        import collections
        import threading

        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536), b""):
            self._chunks.append(chunk)
            self._size += len(chunk)
            while self._size - len(self._chunks[0]) >= TAIL_BYTES:
                self._size -= len(self._chunks.popleft())
        stream.close()

    def text(self, wait: float = 5.0) -> str:
        self._thread.join(wait)
        return b"".join(self._chunks)[-TAIL_BYTES:].decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    """The rank and every process it started (its own process group) ended at once."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone
    try:
        proc.kill()
    except OSError:
        pass  # already gone


def run_traced(command: list[str], nproc: int, timeout: float = RUN_TIMEOUT_S) -> dict:
    """The merged trace of ``command`` on ``nproc`` ranks. Each rank runs in a process group of
    its own; when the ranks have not all finished within ``timeout`` seconds (one deadline for
    the run, not per rank) every group is killed, children included, and the run is PL613."""
    import time

    script, argv = script_of(command)
    package_root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="placement-trace-") as outdir:
        port = free_port()
        procs, tails = [], []
        try:
            for rank in range(nproc):
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
                env.setdefault("OMP_NUM_THREADS", "1")
                env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                           GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                           TORCHELASTIC_RUN_ID="placement-trace")
                proc = subprocess.Popen(
                    [sys.executable, "-m", "placement_logic.trace.bootstrap", str(Path(outdir, f"rank{rank}.json")),
                     script, *argv], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, start_new_session=True)
                procs.append(proc)
                tails.append((_Tail(proc.stdout), _Tail(proc.stderr)))
            deadline = time.monotonic() + timeout
            for rank, proc in enumerate(procs):
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise DiagnosticError([Diagnostic(
                        Code.TRACE_FAILED, f"rank {rank} of {script} did not finish within {timeout:g} s (every rank and "
                        "the processes it started were stopped; --rank-timeout sets the limit)")]) from None
        finally:
            for proc in procs:
                _kill_group(proc)  # a rank still running, and children a finished rank left running
        ranks, failures = [], []
        for rank, proc in enumerate(procs):
            stdout, stderr = (t.text() for t in tails[rank])
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
        return Diagnostic(Code.TRACE_FAILED, f"rank {rank} of the traced script failed: {error['message']}",
                          Span.point(error["file"], error["line"], 1))
    last = [line for line in (stderr or "").strip().splitlines() if line.strip()][-1:] or ["no output"]
    return Diagnostic(Code.TRACE_FAILED, f"rank {rank} of {script} exited with status {status}: {last[0]}")
