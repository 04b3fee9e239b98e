"""``placement import {hf,deepspeed,megatron,torchtitan} FILE``: the arguments parsed and checked,
the spec printed (the logic is ``interop.imports``).

``hf``: a Hugging Face config.json as a formatted model block. ``deepspeed`` (a ds_config.json,
a Hugging Face Trainer one with ``"auto"`` too: ``interop.trainer_auto``), ``megatron`` (a
file of Megatron-LM arguments, a torchrun launch line too) and ``torchtitan`` (a job.toml): a
whole spec for ``--devices N`` devices (DeepSpeed and torchtitan need the model: ``--model
CONFIG.json`` or ``--params N``); see ``interop.frameworks``. Each mesh axis gets a link
class from the devices per node (``--gpus-per-node``, a launch line's ``--nproc_per_node``,
else 8) and the framework's rank order. What was assumed is printed on standard error (and as
``# assumed:`` comments), with the count of keys read and dropped (``--verbose``: each, the
dropped ones with why). What a configuration sets that the language cannot express is
listed on standard error (and as ``# not expressed:`` comments in the spec); the exit
status is then 1.

Input: the path of a model's ``config.json`` (read directly, no network). Output: the
``model { transformer { ... } }`` block the DSL reads for it (the same shape ``model from
"CONFIG.json" { }`` gives), with Ψ as a comment; ``--verbose`` lists the config keys that
change neither memory nor communication. Bad configs are PL140 diagnostics (exit 2).
"""

from __future__ import annotations

from typing import TextIO

from ..diagnostics import Code

IMPORTERS = ("hf: a Hugging Face config.json, printed as a model block; deepspeed: a DeepSpeed ds_config.json "
             "(Hugging Face Trainer configs with \"auto\" too); megatron: a file of Megatron-LM arguments (a "
             "torchrun launch line too); torchtitan: a torchtitan job.toml. The last three print a whole spec "
             "(model, mesh with link classes, plan).")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "import", help="turn a Hugging Face, DeepSpeed, Megatron-LM or torchtitan configuration into a spec",
        description="Read a configuration and print it in the language. " + IMPORTERS + " What was assumed "
        "(devices per node, link classes, what the configuration leaves to the code) is printed on standard error "
        "and as '# assumed:' comments; --verbose lists every key or argument read and every one dropped, with why.")
    p.add_argument("source", choices=("hf", "deepspeed", "megatron", "torchtitan"),
                   help="hf (a Hugging Face config.json), deepspeed (a ds_config.json), megatron (a file of "
                   "Megatron-LM arguments) or torchtitan (a job.toml)")
    p.add_argument("file", metavar="FILE", help="the configuration to read")
    p.add_argument("--verbose", action="store_true", help="list the keys (hf, deepspeed, torchtitan) or arguments "
                   "(megatron) read and those dropped, each dropped one with why")
    p.add_argument("--devices", type=int, metavar="N", help="deepspeed, megatron, torchtitan: the number of devices "
                   "(megatron: else the launch line's --nnodes × --nproc_per_node)")
    p.add_argument("--gpus-per-node", type=int, metavar="N", help="deepspeed, megatron, torchtitan: devices per node, "
                   "which decides the axes' link classes (default: a launch line's --nproc_per_node, else 8)")
    p.add_argument("--model", metavar="CONFIG", help="deepspeed, torchtitan: the model's Hugging Face config.json")
    p.add_argument("--params", type=int, metavar="N", help="deepspeed, torchtitan: the parameter count, without a "
                   "config")
    p.add_argument("--seq", type=int, metavar="N", help="deepspeed: the sequence length (set by the data pipeline, "
                   "not the config)")
    trainer = p.add_argument_group("Hugging Face Trainer values for a DeepSpeed config's \"auto\"")
    trainer.add_argument("--micro-batch", type=int, metavar="N", help="the Trainer's --per_device_train_batch_size "
                         "(train_micro_batch_size_per_gpu)")
    trainer.add_argument("--grad-accum", type=int, metavar="N", help="the Trainer's --gradient_accumulation_steps")
    trainer.add_argument("--global-batch", type=int, metavar="N", help="train_batch_size (micro batch × "
                         "accumulation × devices)")
    prec = trainer.add_mutually_exclusive_group()
    for flag in ("bf16", "fp16", "fp32"):
        prec.add_argument(f"--{flag}", dest="precision", action="store_const", const=flag,
                          help=f"the Trainer's --{flag}" if flag != "fp32" else "neither --bf16 nor --fp16")
    p.set_defaults(run=run)


def run(args, out: TextIO, err: TextIO) -> int:
    from ..frontend.loader import read_source
    from ..interop.imports import hf_block

    text = read_source(args.file)
    if args.source != "hf":
        return _framework(args, text, out, err)
    out.write(hf_block(str(args.file), text, err if args.verbose else None))
    return 0


def _positive(args, name: str) -> None:
    from ..diagnostics import Diagnostic, DiagnosticError
    from .options import command_line_span

    v = getattr(args, name.lstrip("-").replace("-", "_"), None)
    if v is not None and v < 1:
        raise DiagnosticError([Diagnostic(Code.BAD_SET, f"{name} needs a positive integer, not {v}",
                                          command_line_span(f"{name} {v}"))])


def _framework(args, text: str, out: TextIO, err: TextIO) -> int:
    import os
    from pathlib import Path

    from ..diagnostics import Diagnostic, DiagnosticError
    from ..interop.imports import framework_spec, report_lines
    from .options import command_line_span

    for name in ("--devices", "--gpus-per-node", "--micro-batch", "--grad-accum", "--global-batch"):
        _positive(args, name)
    if args.devices is None and args.source != "megatron":
        raise DiagnosticError([Diagnostic(Code.BAD_SET, f"placement import {args.source} needs --devices N (N >= 1)",
                                          command_line_span("--devices"))])
    if args.source in ("deepspeed", "torchtitan"):
        if (args.model is None) == (args.params is None):
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"placement import {args.source} needs the model: --model "
                                              "CONFIG.json or --params N", command_line_span("--model"))])
        if args.model is not None and getattr(args, "output", None):
            # `model from` is read relative to the spec's own folder: from where the spec is written
            args.model = os.path.relpath(os.path.abspath(args.model),
                                         os.path.dirname(os.path.abspath(args.output)))
    trainer = {"micro": args.micro_batch, "accum": args.grad_accum, "global_batch": args.global_batch,
               "precision": args.precision}
    out_dir = Path(os.path.dirname(os.path.abspath(args.output))) if getattr(args, "output", None) else None
    spec, report, problems = framework_spec(
        args.source, text, str(args.file), args.devices, model=args.model, params=args.params, seq=args.seq,
        per_node=args.gpus_per_node, trainer=trainer, base_dir=out_dir)
    out.write(spec)
    for line in report_lines(args.source, report, problems, args.verbose):
        err.write(line + "\n")
    return 1 if problems else 0
