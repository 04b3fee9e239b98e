"""``placement inspect FILE``: the resolved plans, state by state and axis by axis."""

from __future__ import annotations

import json

from ..outcome import envelope


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="show what the resolver made of each plan",
                       description="Resolve FILE and print every plan: the mode of each state on each "
                       "mesh axis, roles, settings and overrides.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(run=run)


def run(args, out, err) -> int:
    from ..frontend.loader import load_spec
    from ..ir.summary import spec_data, spec_text

    spec = load_spec(args.file)
    if args.format == "json":
        data = envelope("inspect", 0, **spec_data(spec))
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        out.write(spec_text(spec))
    return 0
