"""``placement cost``: a spec file in, its memory and communication report out.

Input: argv (FILE, --plan, --set, --format). Output: the report printed in the chosen
format; exit status 0, or 1 when an ``assert`` fails, 3 when an assert cannot be decided
(unbound symbols) and none fails; input errors raise ``DiagnosticError`` (exit 2).
"""

from __future__ import annotations

from typing import TextIO

from .options import add_file, add_format, add_plan, add_set, add_width, colour, output_width, parse_sets

FORMATS = ("text", "markdown", "json", "latex", "latex-fragment")


def add_common(p) -> None:
    add_file(p)
    add_set(p, "re-bind a let symbol or an axis size (repeatable), e.g. --set dp=1024")
    add_format(p, FORMATS)
    p.add_argument("--latex-fragment", dest="format", action="store_const", const="latex-fragment",
                   help="only the equations, their symbols and the table, to \\input into a paper "
                   "(the same as --format latex-fragment)")
    add_width(p)


def spec_sets(args, spec):
    """The command's ``--set`` values: every let, axis, and symbol the report leaves free (the
    sequence length s and microbatch b a model does not give, and without a transformer shape
    h, L, V, a): every name the report's "unbound symbols" note names can be set."""
    known = [n for n, _ in spec.bindings]
    if spec.model is not None and args.sets:
        from ..costs.sizes import shape_of

        known += list(shape_of(spec.model).missing)
        if spec.model.transformer is None:
            known += ["h", "L", "V", "a"]
    return parse_sets(args.sets, known=known, axes=spec.mesh.names if spec.mesh else ())


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("cost", help="closed-form memory and communication per plan",
                              description="Exact per-device memory and per-step communication of each plan, "
                              "as formulas in the spec's symbols and as numbers when they are bound.")
    add_common(p)
    add_plan(p, "report only this plan (repeatable)")
    p.add_argument("--groups", action="store_true",
                   help="add a table of the parameter groups (size, tensor rule, bytes per device) to each plan")
    p.add_argument("--no-cache", action="store_true",
                   help="derive again even when the same spec, imports and options were reported before")
    p.set_defaults(run=run)


def render(report, fmt: str, width: int = 120, color: bool = False) -> str:
    from ..costreport import jsonout, latex, markdown, text

    if fmt == "text":
        return text.render(report, width=width, color=color)
    if fmt == "latex-fragment":
        return latex.render(report, fragment=True)
    return {"markdown": markdown.render, "json": jsonout.render, "latex": latex.render}[fmt](report)


def exit_status(report) -> int:
    return report.exit_status


def run(args, out: TextIO, err: TextIO) -> int:
    from pathlib import Path

    from ..frontend.loader import load_with_sources, read_source
    from . import cache

    spec, sources = load_with_sources(read_source(args.file), str(args.file), Path(args.file).resolve().parent)
    sets = spec_sets(args, spec)
    use_cache = cache.enabled(getattr(args, "no_cache", False))
    if use_cache:
        k = cache.key("cost", sources, {"file": str(args.file), "plans": args.plans, "sets": args.sets,
                                        "format": args.format,
                                        "groups": getattr(args, "groups", False),
                                        "width": output_width(args, out), "colour": colour(out)})
        hit = cache.get(k)
        if hit is not None:
            out.write(hit[0])
            return hit[1]
    from ..costreport import build

    report = build(spec, plans=args.plans, sets=sets, command="cost", show_groups=getattr(args, "groups", False))
    text = render(report, args.format, output_width(args, out), colour(out))
    status = exit_status(report)
    if use_cache:
        cache.put(k, text, status)
    out.write(text)
    return status
