"""``placement cost``: a spec file in, its memory and communication report out.

Input: argv (FILE, --plan, --set, --format, --exact, --plot). Output: the report printed in
the chosen format, or with a list or range in ``--set`` one row per configuration
(``commands.sweep``); exit status 0, or 1 when an ``assert`` fails, 3 when an assert cannot be decided
(unbound symbols) and none fails; input errors raise ``DiagnosticError`` (exit 2).
"""

from __future__ import annotations

from typing import TextIO

from .options import (
    add_device,
    add_file,
    add_format,
    add_plan,
    add_set,
    add_timeout,
    add_width,
    colour,
    device_option,
    output_width,
    parse_sets,
    parse_sweep_sets,
    parse_timeout,
)

FORMATS = ("text", "markdown", "json", "latex", "latex-fragment", "csv")
NO_LATEX = ("text", "markdown")  # formats whose report prints no LaTeX: build skips it


def add_common(p) -> None:
    add_file(p)
    add_set(p, "re-bind a let symbol or an axis size (repeatable), e.g. --set dp=1024; a list or a range sweeps "
            "it: --set dp=8,16,32, --set b=1..8, --set dp=1..1024:x2 (see docs/sweeps.md)")
    add_format(p, FORMATS)
    p.add_argument("--latex-fragment", dest="format", action="store_const", const="latex-fragment",
                   help="only the equations, their symbols and the table, to \\input into a paper "
                   "(the same as --format latex-fragment)")
    add_width(p)
    add_timeout(p, "5", "time limit in seconds for each simplification of an expression: a ratio, an identity "
                "of a claim, the order of two pipeline stages' peaks (default: 5); past it the result is left "
                "undecided, never assumed")
    from . import sweep

    sweep.add_options(p)


def spec_sets(args, spec, sweeps: bool = False):
    """The command's ``--set`` values: every let, axis, and symbol the report leaves free (the
    sequence length s and microbatch b a model does not give, and without a transformer shape
    h, L, V, a): every name the report's "unbound symbols" note names can be set."""
    known = [n for n, _ in spec.bindings]
    if spec.model is not None and args.sets:
        from ..costs.sizes import shape_of

        known += list(shape_of(spec.model).missing)
        if spec.model.transformer is None:
            known += ["h", "L", "V", "a"]
    axes = spec.mesh.names if spec.mesh else ()
    if sweeps:  # (single values, swept values)
        return parse_sweep_sets(args.sets, known=known, axes=axes)
    return parse_sets(args.sets, known=known, axes=axes)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("cost", help="closed-form memory and communication per plan",
                              description="Exact per-device memory and per-step communication of each plan, "
                              "as formulas in the spec's symbols and as numbers when they are bound.")
    add_common(p)
    add_plan(p, "report only this plan (repeatable)")
    p.add_argument("--groups", action="store_true",
                   help="add a table of the parameter groups (size, tensor rule, bytes per device) to each plan")
    add_device(p)
    p.add_argument("--symbolic", action="store_true",
                   help="formulas in Ψ and the shape's symbols (h, L, a, f, V, s, b), each bound to the model's "
                        "number, instead of the numbers (for --format latex in a paper)")
    p.add_argument("--no-cache", action="store_true",
                   help="derive again even when the same spec, imports and options were reported before")
    p.set_defaults(run=run)


def render(report, fmt: str, width: int = 120, color: bool = False) -> str:
    import importlib

    if fmt == "text":
        from ..costreport import text

        return text.render(report, width=width, color=color)
    if fmt == "latex-fragment":
        from ..costreport import latex

        return latex.render(report, fragment=True)
    module = {"markdown": "markdown", "json": "jsonout", "latex": "latex"}[fmt]  # only the renderer asked for
    return importlib.import_module(f"..costreport.{module}", __package__).render(report)


def exit_status(report) -> int:
    return report.exit_status


def run(args, out: TextIO, err: TextIO) -> int:
    from pathlib import Path

    from ..frontend.loader import load_with_sources, read_source
    from . import cache

    spec, sources = load_with_sources(read_source(args.file), str(args.file), Path(args.file).resolve().parent)
    sets, sweeps = spec_sets(args, spec, sweeps=True)
    from . import sweep

    sweep.check_options(args, sweeps)
    seconds = parse_timeout(args.timeout)
    use_cache = cache.enabled(getattr(args, "no_cache", False)) and args.plot is None  # a plot is written each time
    if use_cache:
        k = cache.key("cost", sources, {"file": str(args.file), "plans": args.plans, "sets": args.sets,
                                        "format": args.format, "exact": args.exact,
                                        "sweeps": {n: [str(v) for v in vs] for n, vs in sweeps.items()},
                                        "groups": getattr(args, "groups", False),
                                        "symbolic": getattr(args, "symbolic", False),
                                        "device": getattr(args, "device", None),
                                        "width": output_width(args, out), "colour": colour(out),
                                        "timeout": seconds})
        hit = cache.get(k)
        if hit is not None:
            out.write(hit[0])
            return hit[1]
    if sweep.wanted(args, sweeps):  # the rows go out as they are made; a copy is kept for the cache while short
        sink = cache.Recorder(out)
        status = sweep.run(args, spec, sets, sweeps, "cost", sink, output_width(args, out), colour(out))
        if use_cache and sink.text is not None:
            cache.put(k, sink.text, status)
        return status
    else:
        from ..costreport import build
        from ..costs.budget import budget

        with budget(seconds):
            report = build(spec, plans=args.plans, sets=sets, command="cost",
                           show_groups=getattr(args, "groups", False), device=device_option(args),
                           latex=args.format not in NO_LATEX, symbolic=getattr(args, "symbolic", False))
        text = render(report, args.format, output_width(args, out), colour(out))
        status = exit_status(report)
        if args.plot is not None:
            sweep.plot_only(args, spec, sets, "cost")
    if use_cache:
        cache.put(k, text, status)
    out.write(text)
    return status
