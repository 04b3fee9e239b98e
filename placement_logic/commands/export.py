"""``placement export {deepspeed,megatron,torchtitan} FILE --plan P``: a plan as a framework configuration.

Input: a spec and one of its plans. Output: the DeepSpeed config (JSON), the Megatron-LM
arguments (one line) or the torchtitan job config (TOML) that set the plan up; what that framework cannot express for the plan is
listed on standard error, and the exit status is then 1 (0 when everything was expressed).
"""

from __future__ import annotations

import json
import shlex
from typing import TextIO

from ..diagnostics import Code
from .options import add_file


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="a plan as a DeepSpeed config or Megatron-LM arguments",
                              description="Print the DeepSpeed config or the Megatron-LM arguments of a plan, and "
                              "list what the framework cannot express for it.")
    p.add_argument("target", choices=("deepspeed", "megatron", "torchtitan"), help="the framework")
    add_file(p)
    p.add_argument("--plan", required=True, metavar="NAME", help="the plan to export")
    p.set_defaults(run=run)


def run(args, out: TextIO, err: TextIO) -> int:
    from ..diagnostics import Diagnostic, DiagnosticError, did_you_mean
    from ..frontend.loader import load_spec
    from ..interop.frameworks import plan_to_deepspeed, plan_to_megatron
    from ..interop.torchtitan import plan_to_torchtitan
    from .options import command_line_span

    spec = load_spec(args.file)
    try:
        plan = spec.plan(args.plan)
    except KeyError:
        raise DiagnosticError([Diagnostic(Code.UNKNOWN_PLAN, f"no plan named '{args.plan}' in {spec.file}",
                                          command_line_span(f"--plan {args.plan}"),
                                          notes=did_you_mean(args.plan, [p.name for p in spec.plans]))]) from None
    if args.target == "deepspeed":
        cfg, problems = plan_to_deepspeed(spec, plan)
        out.write(json.dumps(cfg, indent=2) + "\n")
    elif args.target == "megatron":
        argv, problems = plan_to_megatron(spec, plan)
        out.write(shlex.join(argv) + "\n")
    else:
        text, problems = plan_to_torchtitan(spec, plan)
        out.write(text)
    for p in problems:
        err.write(f"not expressible in {args.target}: {p}\n")
    return 1 if problems else 0
