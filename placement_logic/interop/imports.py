"""Configurations in, spec text out: the logic behind ``placement import`` (``commands.convert``
parses its arguments and prints what this returns).

``hf_block``: a Hugging Face config.json as the formatted model block the DSL reads for it (the
same shape ``model from "CONFIG.json"`` gives), with Ψ as a comment. ``framework_spec``: a
DeepSpeed ds_config.json (a Hugging Face Trainer one with ``"auto"`` too: ``interop.trainer_auto``),
a file of Megatron-LM arguments (a torchrun launch line too) or a torchtitan job.toml as a whole
spec for ``devices`` devices (``interop.frameworks``, ``interop.torchtitan``), formatted and read
back, with what was assumed, read and dropped (``ImportReport``) and what the language cannot
express. ``report_lines``: the lines the command prints about them on standard error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from .framework_common import ImportReport


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


def framework_spec(source: str, text: str, file: str, devices: int | None, *, model: str | None = None,
                   params: int | None = None, seq: int | None = None, per_node: int | None = None,
                   trainer: dict | None = None, base_dir: Path | None = None
                   ) -> tuple[str, ImportReport, list[str]]:
    """(formatted spec text, report, what the language cannot express) of a ``source`` configuration
    (deepspeed, megatron or torchtitan); the text is read back from ``base_dir``, where its
    ``model from`` is read."""
    from ..frontend.canonical import format_source
    from ..frontend.loader import load_string
    from .frameworks import deepspeed_to_spec, megatron_to_spec
    from .torchtitan import torchtitan_to_spec

    problems: list[str] = []
    report = ImportReport()
    if source == "deepspeed":
        spec = deepspeed_to_spec(text, file, devices, model, params, seq, problems, report=report, per_node=per_node,
                                 trainer=trainer)
    elif source == "torchtitan":
        spec = torchtitan_to_spec(text, file, devices, model, params, problems, report=report, per_node=per_node)
    else:
        spec = megatron_to_spec(text, file, devices, problems, report=report, per_node=per_node)
    spec = format_source(spec, "<import>")
    load_string(spec, "<import>", base_dir)  # what is printed reads back
    return spec, report, problems


def report_lines(source: str, report: ImportReport, problems: list[str], verbose: bool) -> list[str]:
    """What ``placement import`` says on standard error: the assumptions, the count of keys (or
    arguments) read and dropped (``verbose``: each, the dropped ones with why), what is not expressed."""
    lines = [f"assumed: {a}" for a in report.assumed]
    what = "arguments" if source == "megatron" else "keys"
    read = list(dict.fromkeys(report.read))
    lines.append(f"read {len(read)} {what}, dropped {len(report.dropped)}"
                 + ("" if verbose or not report.dropped else " (--verbose lists them, each with why)"))
    if verbose:
        lines.append("read: " + (", ".join(read) or "none"))
        lines += [f"dropped: {key}: {why}" for key, why in report.dropped]
    return lines + [f"not expressed in the plan: {p}" for p in problems]
