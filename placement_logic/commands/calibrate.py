"""``placement calibrate``: measure this machine's matrix products, memory bandwidth and
all-reduce with torch and write the mesh lines a spec uses for them (placement_logic/calibrate.py)."""

from __future__ import annotations

from .. import hardware as hw
from ..diagnostics import Code, Diagnostic, DiagnosticError, did_you_mean
from .options import command_line_span


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine's GEMMs, memory and all-reduce; write mesh lines",
                       description="Measure a sweep of matrix products, of memory copies and of all-reduce "
                       "with torch (cpu: fp32 and gloo between processes; cuda: bf16 and NCCL between the "
                       "node's GPUs) and print the mesh lines a spec uses for them: 'device = NAME(matmul = ..., "
                       "hbm = ...)' refining a catalogue device, or a device of one's own, and "
                       "'intra_node = link(bandwidth = ..., latency = ...)', the sweeps as comments.")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda when a GPU is visible (auto, the default), else cpu")
    p.add_argument("--device", metavar="NAME", default=None,
                   help="the catalogue device the measurement refines (its peak gives the matmul fraction)")
    p.add_argument("--name", default="calibrated", help="the name of a device of one's own (without --device)")
    p.add_argument("--ranks", type=int, default=2, help="processes (GPUs) in the all-reduce sweep; 1: none")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per size")
    p.add_argument("--quick", action="store_true", help="a tiny sweep (checks the mechanics, not the device)")
    p.set_defaults(run=run)


def _refuse(message: str, option: str, notes: tuple = ()) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.CALIBRATE_UNAVAILABLE, message, command_line_span(option), notes=notes)])


def run(args, out, err) -> int:
    if args.device is not None and hw.device(args.device) is None:
        raise DiagnosticError([Diagnostic(Code.FILTER_ON_SHARDS, f"--device {args.device}: not a device of the catalogue",
                                          command_line_span(f"--device {args.device}"),
                                          notes=did_you_mean(args.device, tuple(hw.DEVICES)))])
    if args.ranks < 1 or args.repeats < 1:
        raise _refuse("--ranks and --repeats must be at least 1", f"--ranks {args.ranks} --repeats {args.repeats}")
    try:
        import torch
    except ImportError:
        raise _refuse("placement calibrate measures with torch, which is not installed", "calibrate",
                      ("install it: pip install torch",)) from None
    backend = args.backend
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "cpu"
    if backend == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < args.ranks):
        raise _refuse(f"--backend cuda needs {args.ranks} visible GPU(s); torch sees "
                      f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}", f"--backend {backend}")
    from ..calibrate import measure, mesh_lines

    err.write(f"calibrating ({backend}{', quick' if args.quick else ''}) ...\n")
    cal = measure(backend, quick=args.quick, repeats=args.repeats, ranks=args.ranks)
    out.write(mesh_lines(cal, args.device, args.name))
    return 0
