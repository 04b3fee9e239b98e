"""``placement lift``: a trace file in, the plan the traced script really ran, as a spec.

Input: a trace written by ``placement trace`` (docs/json.md, "Trace files"). Output: a
``.place`` spec on ``out`` (``--format json``: the spec text, the parameter groups, the
notes and everything not lifted). Every recorded call that cannot be lifted is reported
on ``err`` as a PL614 diagnostic at the script line that issued it, with its rank and call
number; nothing is dropped. Exit status: 0 lifted whole, 1 something not lifted, 2 input error.
"""

from __future__ import annotations

import json
import re

from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..outcome import Exit
from .objective import add_objective, parse_objective
from .options import command_line_span


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "lift", help="turn a trace of a training script into a spec of what it really ran",
        description="Lift a trace written by `placement trace` into a .place spec: mesh axes from the process "
        "groups, parameter groups from the parameter names and layouts, placements from the observed shards, "
        "and the reductions actually observed as the plan, with overrides where it departs from the library "
        "strategy it resembles. `placement check` and `placement cost` read the result unchanged.",
        epilog="exit status: 0 lifted, 1 some recorded calls could not be lifted (reported on stderr), "
        "2 input error.")
    p.add_argument("file", metavar="TRACE", help="a trace file (placement trace -o TRACE.json)")
    p.add_argument("--plan-name", default="traced", metavar="NAME", help="name of the lifted plan (default traced)")
    p.add_argument("--format", choices=("place", "json"), default="place", help="output format (default: place)")
    add_objective(p)
    p.set_defaults(run=run)


def report_unliftable(lifted, err) -> None:
    from ..diagnostics import Diagnostic, Span
    from ..snippets import render

    for u in lifted.unliftable:
        frame = u.stack[0] if u.stack else None
        span = Span.point(frame["file"], frame["line"], 1) if frame else Span.point("<trace>", 1, 1)
        ranks = ", ".join(str(r) for r in u.ranks)
        others = len(set(u.calls) - {u.seq})
        call = (f"call {u.seq}" + (f" and {others} more" if others else "")) if u.seq >= 0 else "the step"
        diag = Diagnostic(Code.NOT_LIFTABLE, f"not lifted: {u.what} ({call}, rank{'s' if len(u.ranks) > 1 else ''} {ranks}): "
                          f"{u.reason}", span)
        source = None
        if frame:
            try:
                with open(frame["file"], encoding="utf-8") as fh:
                    source = fh.read()
            except OSError:
                source = None
        err.write(render(diag, source) + "\n")


def to_json(lifted) -> dict:
    return {"plan": lifted.plan, "spec": lifted.text, "groups": lifted.groups, "notes": lifted.notes,
            "not_lifted": [u.to_json() for u in lifted.unliftable],
            "origins": {str(k): v for k, v in sorted(lifted.origins.items())}}


def _plan_name(name: str) -> bool:
    """Whether ``name`` can name a plan: an identifier the grammar reads as a name (no keyword)."""
    from ..diagnostics import DiagnosticError as _Bad
    from ..frontend.parser import parse

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return False
    try:
        parse(f"plan {name} {{\n}}\n", "<plan name>")
    except _Bad:
        return False
    return True


def run(args, out, err) -> int:
    from ..trace.lift import lift
    from ..trace.schema import load_trace

    if not _plan_name(args.plan_name or ""):
        raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--plan-name {args.plan_name!r}: a plan name is a letter or "
                                          "underscore followed by letters, digits or underscores",
                                          command_line_span(f"--plan-name {args.plan_name}"))])
    objective = parse_objective(getattr(args, "objective", None))
    trace = load_trace(args.file)
    lifted = lift(trace, args.plan_name, args.file, objective)
    if args.format == "json":
        json.dump(to_json(lifted), out, indent=2)
        out.write("\n")
    else:
        out.write(lifted.text)
    report_unliftable(lifted, err)
    return int(Exit.FAILED) if lifted.unliftable else int(Exit.OK)
