"""``placement import {hf,deepspeed,megatron} FILE``: configurations in, as spec text.

``hf``: a Hugging Face config.json as a formatted model block. ``deepspeed`` (a ds_config.json)
and ``megatron`` (a file of Megatron-LM arguments): a whole spec for ``--devices N`` devices
(DeepSpeed needs the model: ``--model CONFIG.json`` or ``--params N``); see
``commands.frameworks``. What a configuration sets that the language cannot express is
listed on standard error (and as ``# not expressed:`` comments in the spec); the exit
status is then 1.

Input: the path of a model's ``config.json`` (read directly, no network). Output: the
``model { transformer { ... } }`` block the DSL reads for it (the same shape ``model from
"CONFIG.json" { }`` gives), with Ψ as a comment; ``--verbose`` lists the config keys that
change neither memory nor communication. Bad configs are PL140 diagnostics (exit 2).
"""

from __future__ import annotations

from typing import TextIO


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("import", help="turn a Hugging Face config.json into a model block",
                              description="Read a Hugging Face config.json and print the equivalent "
                              "model { transformer { ... } } block.")
    p.add_argument("source", choices=("hf", "deepspeed", "megatron", "torchtitan"),
                   help="hf (a Hugging Face config.json), deepspeed (a ds_config.json) or megatron (a file of "
                   "Megatron-LM arguments) or torchtitan (a job.toml)")
    p.add_argument("file", metavar="FILE", help="the configuration to read")
    p.add_argument("--verbose", action="store_true", help="hf: list the config keys that change no cost")
    p.add_argument("--devices", type=int, metavar="N", help="deepspeed, megatron: the number of devices")
    p.add_argument("--model", metavar="CONFIG", help="deepspeed: the model's Hugging Face config.json")
    p.add_argument("--params", type=int, metavar="N", help="deepspeed: the parameter count, without a config")
    p.add_argument("--seq", type=int, metavar="N", help="deepspeed: the sequence length (set by the data pipeline, "
                   "not the config)")
    p.set_defaults(run=run)


def hf_block(path: str, text: str | None = None, verbose_to: TextIO | None = None) -> str:
    """The formatted model block of a Hugging Face config, with Ψ as a comment."""
    from ..frontend import hf
    from ..frontend.canonical import format_source
    from ..frontend.loader import load_string, read_source
    from ..ir.summary import parameter_counts

    text = read_source(path) if text is None else text
    shape = hf.parse_config(text, path)
    block = format_source(hf.model_block_text(shape, path), "<import>")
    counts = parameter_counts(load_string(block, "<import>"))
    psi = counts["params"] if counts else None
    if psi is not None:
        note = f"# Ψ = {int(psi):,} parameters"
        active = counts["active_params"]
        if active is not None and active != psi:
            note += f" ({int(active):,} active per token)"
        block = block.replace("model {", note + "\nmodel {", 1)
    if verbose_to is not None:
        verbose_to.write("read: " + ", ".join(shape.used) + "\n")
        verbose_to.write("ignored (no effect on memory or communication): " + (", ".join(shape.ignored) or "none")
                         + "\n")
    return block


def run(args, out: TextIO, err: TextIO) -> int:
    from ..frontend.loader import read_source

    text = read_source(args.file)
    if args.source != "hf":
        return _framework(args, text, out, err)
    out.write(hf_block(str(args.file), text, err if args.verbose else None))
    return 0


def _framework(args, text: str, out: TextIO, err: TextIO) -> int:
    from ..diagnostics import Diagnostic, DiagnosticError
    from ..frontend.canonical import format_source
    from ..frontend.loader import load_string
    from .frameworks import deepspeed_to_spec, megatron_to_spec
    from .options import command_line_span
    from .torchtitan import torchtitan_to_spec

    problems: list[str] = []
    if args.devices is None or args.devices < 1:
        raise DiagnosticError([Diagnostic("PL301", f"placement import {args.source} needs --devices N (N >= 1)",
                                          command_line_span("--devices"))])
    if args.source in ("deepspeed", "torchtitan"):
        if (args.model is None) == (args.params is None):
            raise DiagnosticError([Diagnostic("PL301", f"placement import {args.source} needs the model: --model "
                                              "CONFIG.json or --params N", command_line_span("--model"))])
        if args.source == "deepspeed":
            spec = deepspeed_to_spec(text, str(args.file), args.devices, args.model, args.params, args.seq, problems)
        else:
            spec = torchtitan_to_spec(text, str(args.file), args.devices, args.model, args.params, problems)
    else:
        spec = megatron_to_spec(text, str(args.file), args.devices, problems)
    spec = format_source(spec, "<import>")
    load_string(spec, "<import>")  # what is printed reads back
    out.write(spec)
    for p in problems:
        err.write(f"not expressed in the plan: {p}\n")
    return 1 if problems else 0
