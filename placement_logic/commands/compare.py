"""``placement compare``: every plan of a spec side by side, with ratios to a baseline.

Input: argv (FILE, --plan, --baseline, --set, --format). Output: one table of memory per state,
total memory, communication per axis and in total, each with its ratio to the baseline
(the first plan unless ``--baseline`` names one). Exit status as for ``placement cost``.
"""

from __future__ import annotations

from typing import TextIO

from .cost import NO_LATEX, add_common, exit_status, render, spec_sets
from .options import add_device, add_plan, colour, device_option, output_width, parse_timeout


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("compare", help="plans side by side with ratios to a baseline",
                              description="Compare every plan of a spec: memory per state, total, "
                              "communication per axis and total, with ratios to the baseline plan.")
    add_common(p)
    add_plan(p, "compare only this plan (repeatable; the baseline is added when not named)")
    p.add_argument("--baseline", metavar="NAME", help="the plan the ratios are taken to (default: the first)")
    add_device(p)
    p.set_defaults(run=run)


def run(args, out: TextIO, err: TextIO) -> int:
    from ..costreport import build
    from ..costs.budget import budget
    from ..frontend.loader import load_spec
    from . import sweep

    spec = load_spec(args.file)
    sets, sweeps = spec_sets(args, spec, sweeps=True)
    sweep.check_options(args, sweeps)
    if sweep.wanted(args, sweeps):
        return sweep.run(args, spec, sets, sweeps, "compare", out, output_width(args, out), colour(out))
    with budget(parse_timeout(args.timeout)):
        report = build(spec, plans=args.plans, sets=sets, baseline=args.baseline, command="compare",
                       device=device_option(args), latex=args.format not in NO_LATEX)
    out.write(render(report, args.format, output_width(args, out), colour(out)))
    if args.plot is not None:
        sweep.plot_only(args, spec, sets, "compare")
    return exit_status(report)
