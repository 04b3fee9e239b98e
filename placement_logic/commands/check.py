"""``placement check``: a spec file in, machine-checked safety verdicts out.

Input: argv (FILE, --plan, --format (text, markdown, json, latex, latex-fragment), --timeout, --set). Output: the report printed in
the chosen format; exit status 0 when every obligation is proved, 1 when one is refuted,
3 when one is unknown and none refuted; input errors raise ``DiagnosticError`` (exit 2).
"""

from __future__ import annotations

from typing import TextIO

from ..diagnostics import Code
from .options import (
    add_file,
    add_format,
    add_plan,
    add_set,
    add_timeout,
    add_width,
    parse_sets,
    parse_timeout,
    wrap_width,
)

FORMATS = ("text", "markdown", "json", "latex", "latex-fragment")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="prove or refute gradient integrity, state consistency and composition rules",
        description="For each plan, prove or refute (with z3) gradient integrity, state consistency and the "
        "composition rules; every counterexample is re-checked by a concrete replay and printed with a "
        "command that re-runs it. Mesh sizes and microbatches are symbolic unless pinned with --set.")
    add_file(p)
    add_plan(p, "check only this plan (repeatable)")
    add_format(p, FORMATS)
    p.add_argument("--latex-fragment", dest="format", action="store_const", const="latex-fragment",
                   help="only the plans' verdicts, findings and counterexamples, to \\input into a paper "
                   "(the same as --format latex-fragment)")
    add_width(p)
    add_timeout(p)
    add_set(p, "pin a mesh axis size, microbatches, or re-bind a let symbol (repeatable)")
    p.set_defaults(run=run)


def run(args, out: TextIO, err: TextIO) -> int:
    from ..check.render import render
    from ..check.run import check_spec
    from ..frontend.loader import load_spec

    timeout = parse_timeout(args.timeout)
    sets = {k: int(v) for k, v in parse_sets(args.sets, integers=True).items()}
    spec = load_spec(args.file)
    if not spec.plans:
        from ..diagnostics import Diagnostic, DiagnosticError, Span

        raise DiagnosticError([Diagnostic(Code.MISSING_SECTION, "nothing to check: the spec defines no plan",
                                          Span.point(str(args.file), 1, 1))])
    from .progress import Progress

    with Progress(err, "check", quiet=getattr(args, "quiet", False)) as bar:
        report = check_spec(spec, plans=args.plans or None, pinned=sets, timeout=timeout, progress=bar.tick)
    if args.format in ("latex", "latex-fragment"):
        from ..check.render_latex import render as latex

        out.write(latex(report, fragment=args.format == "latex-fragment"))
    else:
        out.write(render(report, args.format, wrap_width(args, out)))
    return report.exit_status
