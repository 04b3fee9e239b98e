"""``placement measure``: run plans on real PyTorch distributed and compare with the predictions.

Input: a .place file, ``--plan`` names, ``--devices``, ``--set``, ``--steps``, ``--format``. Output:
the measurement report on ``out``. Exit status: 0 every plan matched (every difference
explained) and stayed equivalent to one process; 1 a mismatch, a divergence or a failed
rank; 2 input or usage error (including a missing torch); 4 a plan PyTorch cannot
realise, with nothing worse.
"""

from __future__ import annotations

import json

from ..diagnostics import Code
from ..outcome import Exit, envelope
from .options import add_set

EXIT_UNREALISED = int(Exit.UNREALISED)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "measure",
        help="run plans on PyTorch distributed (CPU processes) and compare with the predictions",
        description="Run plans of a spec on real PyTorch distributed (gloo on CPU, NCCL with GPUs), "
        "measure held bytes and collectives per rank, compare with the cost engine, and compare K "
        "steps with one process. Needs the torch extra: pip install '.[torch]' in a clone of placement-logic.",
        epilog="exit status: 0 matched, 1 mismatch / diverged / failed, 2 input error, "
        "4 not realisable by PyTorch.",
    )
    p.add_argument("file", help="a .place spec")
    p.add_argument("--plan", action="append", required=True, metavar="NAME", help="plan to measure (repeatable)")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="processes (default 2; meshes of k axes use 2 per axis)")
    add_set(p, "re-bind a let symbol or run an axis at a size (repeatable), e.g. --set dp=4: the re-bound spec "
            f"is what is realised, predicted and checked; axis sizes 2 to {MAX_DEVICES} processes in all "
            "(one value per name)")
    p.add_argument("--steps", type=int, default=3, metavar="K", help="training steps (default 3)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text", help="output format (default: text)")
    p.add_argument("--no-check", action="store_true", help="do not ask the checker for its verdict")
    p.add_argument("--torchrun", action="store_true",
                   help="run as one rank of a torchrun job (torchrun --nproc-per-node N [--nnodes ...] -m "
                   "placement_logic measure FILE --plan NAME --torchrun): ranks and rendezvous from torchrun's "
                   "environment, cuda:LOCAL_RANK with NCCL where every local rank has a GPU, the report printed "
                   "by rank 0")
    p.set_defaults(run=run)


MAX_DEVICES = 64  # processes one machine runs for a measurement (each a PyTorch interpreter)
MAX_STEPS = 100


def _check_counts(args) -> None:
    """--devices and --steps within what one machine can run, before any process starts."""
    from ..diagnostics import Diagnostic, DiagnosticError
    from .options import command_line_span

    for flag, value, top in (("--devices", args.devices, MAX_DEVICES), ("--steps", args.steps, MAX_STEPS)):
        if value is not None and not 1 <= value <= top:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"{flag} {value}: expected 1 to {top}",
                                              command_line_span(f"{flag} {value}"))])


def _pinned_sizes(args, spec, sets) -> dict[str, int]:
    """The axis sizes ``--set`` gives, each 2 to ``MAX_DEVICES``, and for each plan to measure
    at most ``MAX_DEVICES`` processes in all (the other axes at their default of 2 each), PL301
    at the options otherwise."""
    from ..diagnostics import Diagnostic, DiagnosticError
    from .options import command_line_span

    axes = spec.mesh.names if spec.mesh else ()
    pinned = {a: int(v) for a, v in sets.items() if a in axes}
    for a, n in pinned.items():
        if not 2 <= n <= MAX_DEVICES:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {a}={n}: a measured axis runs on 2 to {MAX_DEVICES} "
                                              "devices", command_line_span(f"--set {a}={n}"))])
    for name in args.plan:
        plan = next((p for p in spec.plans if p.name == name), None)
        if plan is None or len(plan.mesh.names) < 2 or not any(a in pinned for a in plan.mesh.names):
            continue
        world = 1
        for a in plan.mesh.names:
            world *= pinned.get(a, 2)
        if world > MAX_DEVICES:
            given = " ".join(f"--set {a}={n}" for a, n in pinned.items() if a in plan.mesh.names)
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"{given}: plan '{name}' would run {world} processes; at most "
                                              f"{MAX_DEVICES}", command_line_span(given))])
    return pinned


def run(args, out, err) -> int:
    from ..frontend.loader import load_spec
    from ..measure.session import measure
    from ..resolve.validate import rebound
    from .options import spec_single_sets

    spec = load_spec(args.file)
    _check_counts(args)
    sets = spec_single_sets(args.sets, spec, "measure")
    pinned = _pinned_sizes(args, spec, sets)
    spec = rebound(spec, sets)
    from .progress import Progress

    if args.torchrun:
        return _under_torchrun(args, spec, pinned, out, err)
    with Progress(err, "measure", quiet=getattr(args, "quiet", False)) as bar:
        reports = measure(spec, args.plan, devices=args.devices, steps=args.steps, with_checker=not args.no_check,
                          progress=bar.tick, pinned=pinned)
    return _write(args, reports, out)


def torchrun_env(args, environ):
    """The torchrun environment (``--torchrun``), PL620 when it is missing or inconsistent and PL621 when
    ``--devices`` is not torchrun's WORLD_SIZE."""
    from ..diagnostics import Diagnostic, DiagnosticError
    from ..measure.dist_env import EnvError, from_environ
    from .options import command_line_span

    try:
        env = from_environ(environ)
    except EnvError as exc:
        raise DiagnosticError([Diagnostic(Code.TORCHRUN_ENV, f"--torchrun: {exc}", command_line_span("--torchrun"))]) from None
    if args.devices is not None and args.devices != env.world:
        raise DiagnosticError([Diagnostic(Code.TORCHRUN_DEVICES, f"--devices {args.devices}: torchrun started {env.world} processes "
                                          "(WORLD_SIZE); the run is sized by torchrun",
                                          command_line_span(f"--devices {args.devices}"))])
    return env


def _under_torchrun(args, spec, pinned, out, err) -> int:
    """Every rank prepares the same plans, runs them in this process (``ranks.torchrun``) and compares;
    rank 0 asks the checker and writes the report, the other ranks write nothing."""
    import os

    from ..measure.session import measure, require_torch

    env = torchrun_env(args, os.environ)
    require_torch()
    from ..measure.ranks import torchrun

    device = torchrun.start(env)
    try:
        reports = measure(spec, args.plan, devices=env.world, steps=args.steps,
                          with_checker=not args.no_check and env.rank == 0,
                          launcher=torchrun.launcher(env, device), pinned=pinned)
    finally:
        torchrun.stop()
    if env.rank != 0:
        return _status(reports)
    return _write(args, reports, out)


def _status(reports) -> int:
    from ..measure.report import Outcome

    outcomes = {r.outcome for r in reports}
    if outcomes & {Outcome.MISMATCH, Outcome.DIVERGED, Outcome.FAILED}:
        return int(Exit.FAILED)
    if Outcome.UNREALISED in outcomes:
        return EXIT_UNREALISED
    return int(Exit.OK)


def _write(args, reports, out) -> int:
    from ..measure import render

    status = _status(reports)
    if args.format == "json":
        doc = render.to_json(reports)
        json.dump({**envelope("measure", status, file=str(args.file)), "plans": doc["plans"]}, out, indent=2)
        out.write("\n")
    elif args.format == "markdown":
        out.write(render.markdown(reports))
    else:
        out.write(render.text(reports))
    return status
