"""``placement check``: a spec file in, machine-checked safety verdicts out.

Input: argv (FILE, --plan, --format, --timeout, --set). Output: the report printed in
the chosen format; exit status 0 when every obligation is proved, 1 when one is refuted,
3 when one is unknown and none refuted; input errors raise ``DiagnosticError`` (exit 2).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TextIO

FORMATS = ("text", "markdown", "json")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="prove or refute gradient integrity, state consistency and composition rules",
        description="For each plan, prove or refute (with z3) gradient integrity, state consistency and the "
        "composition rules; every counterexample is re-checked by a concrete replay and printed with a "
        "command that re-runs it. Mesh sizes and microbatches are symbolic unless pinned with --set.")
    p.add_argument("file", metavar="FILE", help="a .place spec")
    p.add_argument("--plan", dest="plans", action="append", default=[], metavar="NAME",
                   help="check only this plan (repeatable)")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument("--timeout", default="10", metavar="SECONDS", help="solver time limit per query (default: 10)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                   help="pin a mesh axis size, microbatches, or re-bind a let symbol (repeatable)")
    p.set_defaults(run=run)


def parse_timeout(text: str) -> float:
    from ..diagnostics import Diagnostic, DiagnosticError

    try:
        value = float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        value = -1.0
    if not value > 0:
        raise DiagnosticError([Diagnostic("PL500", f"--timeout {text}: expected a positive number of seconds")])
    return value


def parse_sets(sets: list[str]) -> dict[str, int]:
    from ..diagnostics import Diagnostic, DiagnosticError

    out: dict[str, int] = {}
    for item in sets:
        name, sep, value = item.partition("=")
        try:
            number = Fraction(value.strip()) if sep else None
        except (ValueError, ZeroDivisionError):
            number = None
        if not name.strip() or number is None or number.denominator != 1 or number < 1:
            raise DiagnosticError([Diagnostic("PL301", f"--set {item}: expected NAME=N with N a positive integer")])
        out[name.strip()] = int(number)
    return out


def run(args, out: TextIO, err: TextIO) -> int:
    from ..check.render import render
    from ..check.run import check_spec
    from ..frontend.loader import load_spec

    timeout = parse_timeout(args.timeout)
    sets = parse_sets(args.sets)
    spec = load_spec(args.file)
    report = check_spec(spec, plans=args.plans or None, pinned=sets, timeout=timeout)
    out.write(render(report, args.format))
    return report.exit_status
