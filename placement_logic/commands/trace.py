"""``placement trace``: run a training script on N CPU processes, recorded; optionally check it.

Input: ``--nproc N`` and the command after ``--`` (``python SCRIPT.py ARGS...``). Output:
the merged trace (JSON, docs/json.md "Trace files") on ``out``; with ``--check``, the
checker's report on the lifted plan instead, each finding mapped back to the script
lines it was lifted from (``--trace-file`` keeps the trace then). Exit status: 0 traced
(with --check: proved, for the sizes the report states), 1 refuted, 2 input error (torch missing, the
script failed on a rank), 3 with --check: unknown or not everything lifted, nothing refuted.
"""

from __future__ import annotations

import argparse
import json

from ..diagnostics import Code
from ..outcome import Exit, Verdict
from .objective import add_objective, parse_objective
from .output import check_writable, write_output


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "trace", help="run a training script on N CPU processes and record what it really does",
        description="Run SCRIPT as `torchrun --nproc-per-node N` would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
        "MASTER_PORT; gloo on CPU) with a recorder installed through PyTorch's dispatch-mode, module and "
        "optimizer hooks, and write the merged trace. With --check, lift the trace into a plan and prove or "
        "refute it for every mesh size, pointing each finding at the script line behind it. Needs the torch "
        "extra: pip install '.[torch]' in a clone of placement-logic.",
        epilog="example: placement trace --nproc 2 --check -- python examples/traced/ddp.py\n"
        "exit status: 0 traced / proved, 1 refuted, 2 input error or the script failed, 3 unknown or "
        "not everything lifted (with --check).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, required=True, metavar="N", help="processes (2 to 8)")
    p.add_argument("--check", action="store_true", help="lift the trace and check the plan (exit 0 proved, 1 refuted)")
    p.add_argument("--trace-file", metavar="FILE", default=None, help="with --check: also write the trace to FILE")
    p.add_argument("--spec-file", metavar="FILE", default=None, help="with --check: also write the lifted spec to FILE")
    add_objective(p)
    p.add_argument("--timeout", default="10", metavar="SECONDS", help="with --check: solver time limit per query")
    p.add_argument("--rank-timeout", default="600", metavar="SECONDS",
                   help="stop the run (every rank and what it started) when it has not ended within SECONDS "
                        "(default 600)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- python SCRIPT.py ARGS",
                   help="the training script and its arguments, after --")
    p.set_defaults(run=run)


def _nproc(n: int) -> None:
    from ..diagnostics import Diagnostic, DiagnosticError
    from ..trace.launch import MAX_PROCS, MIN_PROCS
    from .options import command_line_span

    if not MIN_PROCS <= n <= MAX_PROCS:
        raise DiagnosticError([Diagnostic(Code.BAD_TRACE_COMMAND, f"--nproc {n}: expected {MIN_PROCS} to {MAX_PROCS} processes",
                                          command_line_span(f"--nproc {n}"))])


def require_torch() -> None:
    import importlib.util

    from ..diagnostics import Diagnostic, DiagnosticError

    if importlib.util.find_spec("torch") is None:
        raise DiagnosticError([Diagnostic(
            Code.TORCH_MISSING, "placement trace needs PyTorch to run the script: pip install '.[torch]' in a clone of placement-logic")])


def run(args, out, err) -> int:
    from ..trace.launch import run_traced, script_of

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    _nproc(args.nproc)
    objective = parse_objective(getattr(args, "objective", None))
    script_of(command)
    for option, target in (("--trace-file", args.trace_file), ("--spec-file", getattr(args, "spec_file", None))):
        if target:
            check_writable(target, option)
    from .options import parse_timeout

    timeout = parse_timeout(args.timeout) if args.check else None
    limit = parse_timeout(args.rank_timeout, "--rank-timeout")
    require_torch()
    trace = run_traced(command, args.nproc, limit)
    if not args.check:
        json.dump(trace, out, indent=1)
        out.write("\n")
        return int(Exit.OK)
    if args.trace_file:
        write_output(args.trace_file, json.dumps(trace, indent=1), option="--trace-file")
    return check_trace(trace, out, err, timeout, args.spec_file, objective)


def check_trace(trace: dict, out, err, timeout: float, spec_file: str | None = None,
                objective: dict[str, str] | None = None) -> int:
    """Lift, check, and report the findings at the script's lines."""
    from ..check.render import render
    from ..check.run import check_spec
    from ..frontend.loader import load_with_sources
    from ..trace.lift import lift
    from .lift import report_unliftable

    lifted = lift(trace, objective=objective)
    name = spec_file or f"{trace['script']}.lifted.place"
    if spec_file:
        write_output(spec_file, lifted.text, option="--spec-file")
    report_unliftable(lifted, err)
    spec, _ = load_with_sources(lifted.text, name)
    if all(p.name != lifted.plan for p in spec.plans):
        # nothing of a training step was lifted (the PL614 lines above say what is missing): no plan to check
        err.write(f"placement: nothing to check: no training step was lifted from {trace['script']}\n")
        return int(Exit.INPUT)
    report = check_spec(spec, [lifted.plan], timeout=timeout)
    spec_lines = lifted.text.splitlines()
    out.write(f"traced {trace['script']} on {trace['world']} processes; lifted plan '{lifted.plan}':\n")
    if lifted.unliftable:
        n = len(lifted.unliftable)
        out.write(f"  ({n} kind{'s' if n != 1 else ''} of recorded call not lifted: PL614 on stderr; the verdicts "
                  "below concern the lifted part of the step only, so none of them is the script's)\n")
    inside = False
    for line in spec_lines:
        inside = inside or line.startswith(f"plan {lifted.plan} ")
        if inside and line.startswith("  "):
            out.write(f"  {line.strip()}\n")
    out.write("\n")
    plan = report.plans[0]
    verdict = plan.verdict.word
    if plan.findings:
        part = " (in the lifted part of the step)" if lifted.unliftable else ""
        out.write(f"{len(plan.findings)} finding{'s' if len(plan.findings) != 1 else ''} in {trace['script']}{part}:\n")
        for f in plan.findings:
            frames = lifted.origins.get(f.location.line, [])
            line_text = spec_lines[f.location.line - 1].split("#")[0].strip() if 0 < f.location.line <= len(
                spec_lines) else ""
            where = frames[0] if frames else None
            loc = f"{where['file']}:{where['line']}" if where else f"{name}:{f.location.line}"
            out.write(f"{loc}: refuted {f.root}: {f.cause}\n")
            if where and where.get("code"):
                out.write(f"    {where['line']} | {where['code']}\n")
            if line_text:
                out.write(f"    lifted as: {line_text}\n")
            for other in frames[1:3]:
                out.write(f"    also at {other['file']}:{other['line']}\n")
            out.write(f"    breaks: {', '.join(f.breaks)}\n")
        out.write("\n")
    elif verdict == Verdict.PROVED.word and not lifted.unliftable:
        held = plan.fixed_sizes  # sizes some obligation is decided at (a list of rank sets, a K/V copy layout)
        scope = "all mesh sizes" + (" with " + ", ".join(f"{a}={n}" for a, n in held.items()) if held else "")
        stated = ", ".join(f"{k}={v}" for k, v in sorted((objective or {}).items()))
        out.write(f"proved for {scope}: the traced step of {trace['script']} computes single-device "
                  "training's step" + (f" (the objective stated: {stated})" if stated else "") + "\n\n")
    out.write(render(report, "text", None))
    if lifted.unliftable:
        # a plan that is not the whole step proves and refutes nothing about the script: its last word says so
        what = "; ".join(sorted({u.what for u in lifted.unliftable}))
        out.write(f"\nverdict for {trace['script']}: UNKNOWN (not observed or not lifted: {what})\n")
        return int(Exit.UNKNOWN)
    return report.exit_status
