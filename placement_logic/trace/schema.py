"""The trace file: its schema name and version, and reading one back (no torch).

A trace is JSON (docs/json.md, "Trace files"): ``schema`` = ``TRACE_SCHEMA``,
``version`` = ``VERSION``, the world size, the script and its arguments, and one object
per rank. ``load_trace`` returns the dict or raises a located ``PL612`` diagnostic:
unreadable file, not JSON, another schema, another version, a rank missing.
"""

from __future__ import annotations

import json

from ..diagnostics import Diagnostic, DiagnosticError, Span

TRACE_SCHEMA = "placement-trace"
VERSION = 1

RANK_KEYS = ("rank", "world", "meshes", "collectives", "unrecognised", "steps")


def _bad(path: str, message: str, line: int = 1) -> DiagnosticError:
    return DiagnosticError([Diagnostic("PL612", f"{message}", Span.point(path, line, 1))])


def validate(trace: object, path: str = "<trace>") -> dict:
    if not isinstance(trace, dict) or trace.get("schema") != TRACE_SCHEMA:
        raise _bad(path, f"not a placement trace (expected \"schema\": \"{TRACE_SCHEMA}\")")
    if trace.get("version") != VERSION:
        raise _bad(path, f"trace schema version {trace.get('version')!r}; this placement reads version {VERSION}")
    world = trace.get("world")
    ranks = trace.get("ranks")
    if not isinstance(world, int) or not isinstance(ranks, list) or sorted(
            r.get("rank") for r in ranks if isinstance(r, dict)) != list(range(world)):
        raise _bad(path, "the trace does not hold one entry per rank 0..world-1")
    for r in ranks:
        missing = [k for k in RANK_KEYS if k not in r]
        if missing:
            raise _bad(path, f"rank {r.get('rank')}: missing {', '.join(missing)}")
    return trace


def load_trace(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnosticError([Diagnostic("PL006", f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                                          Span.point(path, 1, 1))]) from None
    try:
        trace = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(path, f"not JSON: {exc.msg}", exc.lineno) from None
    return validate(trace, path)
