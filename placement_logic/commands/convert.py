"""``placement import hf CONFIG.json``: a Hugging Face config as a formatted model block.

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
    p.add_argument("source", choices=("hf",), help="the kind of input: hf (a Hugging Face config.json)")
    p.add_argument("file", metavar="CONFIG", help="the config.json to read")
    p.add_argument("--verbose", action="store_true", help="list the config keys that change no cost")
    p.set_defaults(run=run)


def run(args, out: TextIO, err: TextIO) -> int:
    from ..frontend import hf
    from ..frontend.canonical import format_source
    from ..frontend.loader import load_string, read_source
    from ..ir.summary import parameter_counts

    text = read_source(args.file)
    shape = hf.parse_config(text, str(args.file))
    block = hf.model_block_text(shape, str(args.file))
    block = format_source(block, "<import>")
    counts = parameter_counts(load_string(block, "<import>"))
    psi = counts["params"] if counts else None
    if psi is not None:
        note = f"# Ψ = {int(psi):,} parameters"
        active = counts["active_params"]
        if active is not None and active != psi:
            note += f" ({int(active):,} active per token)"
        block = block.replace("model {", note + "\nmodel {", 1)
    out.write(block)
    if args.verbose:
        err.write("read: " + ", ".join(shape.used) + "\n")
        err.write("ignored (no effect on memory or communication): " + (", ".join(shape.ignored) or "none") + "\n")
    return 0
