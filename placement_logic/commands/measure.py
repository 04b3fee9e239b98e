"""``placement measure``: run plans on real PyTorch distributed and compare with the predictions.

Input: a .place file, ``--plan`` names, ``--devices``, ``--steps``, ``--format``. Output:
the measurement report on ``out``. Exit status: 0 every plan matched (every difference
explained) and stayed equivalent to one process; 1 a mismatch, a divergence or a failed
rank; 2 input or usage error (including a missing torch); 4 a plan PyTorch cannot
realise, with nothing worse.
"""

from __future__ import annotations

import json

from ..outcome import Exit, envelope

EXIT_UNREALISED = int(Exit.UNREALISED)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "measure",
        help="run plans on PyTorch distributed (CPU processes) and compare with the predictions",
        description="Run plans of a spec on real PyTorch distributed (gloo on CPU, NCCL with GPUs), "
        "measure held bytes and collectives per rank, compare with the cost engine, and compare K "
        "steps with one process. Needs the torch extra: pip install 'placement-logic[torch]'.",
        epilog="exit status: 0 matched, 1 mismatch / diverged / failed, 2 input error, "
        "4 not realisable by PyTorch.",
    )
    p.add_argument("file", help="a .place spec")
    p.add_argument("--plan", action="append", required=True, metavar="NAME", help="plan to measure (repeatable)")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="processes (default 2; meshes of k axes use 2 per axis)")
    p.add_argument("--steps", type=int, default=3, metavar="K", help="training steps (default 3)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--no-check", action="store_true", help="do not ask the checker for its verdict")
    p.set_defaults(run=run)


MAX_DEVICES = 64  # processes one machine runs for a measurement (each a PyTorch interpreter)
MAX_STEPS = 100


def _check_counts(args) -> None:
    """--devices and --steps within what one machine can run, before any process starts."""
    from ..diagnostics import Diagnostic, DiagnosticError
    from .options import command_line_span

    for flag, value, top in (("--devices", args.devices, MAX_DEVICES), ("--steps", args.steps, MAX_STEPS)):
        if value is not None and not 1 <= value <= top:
            raise DiagnosticError([Diagnostic("PL301", f"{flag} {value}: expected 1 to {top}",
                                              command_line_span(f"{flag} {value}"))])


def run(args, out, err) -> int:
    from ..frontend.loader import load_spec
    from ..measure import render
    from ..measure.report import Outcome
    from ..measure.session import measure

    spec = load_spec(args.file)
    _check_counts(args)
    from .progress import Progress

    with Progress(err, "measure") as bar:
        reports = measure(spec, args.plan, devices=args.devices, steps=args.steps, with_checker=not args.no_check,
                          progress=bar.tick)
    outcomes = {r.outcome for r in reports}
    if outcomes & {Outcome.MISMATCH, Outcome.DIVERGED, Outcome.FAILED}:
        status = int(Exit.FAILED)
    elif Outcome.UNREALISED in outcomes:
        status = EXIT_UNREALISED
    else:
        status = int(Exit.OK)
    if args.format == "json":
        doc = render.to_json(reports)
        json.dump({**envelope("measure", status, file=str(args.file)), "plans": doc["plans"]}, out, indent=2)
        out.write("\n")
    elif args.format == "markdown":
        out.write(render.markdown(reports))
    else:
        out.write(render.text(reports))
    return status
