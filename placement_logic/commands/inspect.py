"""``placement inspect FILE``: the resolved plans, state by state and axis by axis."""

from __future__ import annotations

import json

from ..diagnostics import Code, Diagnostic, DiagnosticError, did_you_mean
from ..outcome import envelope
from .options import add_file, add_format, add_plan, add_set, spec_single_sets


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="show what the resolver made of each plan",
                       description="Resolve FILE and print every plan: the mode of each state on each "
                       "mesh axis, roles, settings and overrides.")
    add_file(p)
    add_plan(p, "show only this plan (repeatable)")
    add_format(p, ("text", "markdown", "json"))
    add_set(p, "re-bind a let symbol or an axis size (repeatable), e.g. --set dp=64: the lets, axis sizes and "
            "counts shown are those of the re-bound spec (one value per name; lists and ranges sweep in cost)")
    p.set_defaults(run=run)


def run(args, out, err) -> int:
    from ..frontend.loader import load_spec
    from ..ir.summary import spec_data, spec_markdown, spec_text
    from ..resolve.validate import rebound

    spec = load_spec(args.file)
    sets = spec_single_sets(args.sets, spec, "inspect")
    spec = rebound(spec, sets)
    known = [p.name for p in spec.plans]
    for name in args.plans:
        if name not in known:
            raise DiagnosticError([Diagnostic(Code.UNKNOWN_PLAN, f"no plan named '{name}' in {spec.file}",
                                              notes=did_you_mean(name, known))])
    plans = tuple(args.plans)
    if args.format == "json":
        data = envelope("inspect", 0, **spec_data(spec, plans, sets))
        json.dump(data, out, indent=2)
        out.write("\n")
    elif args.format == "markdown":
        out.write(spec_markdown(spec, plans, sets))
    else:
        out.write(spec_text(spec, plans, sets))
    return 0
