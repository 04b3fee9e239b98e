"""The published measured runs of docs/validation_time.md, read from its table, written as specs.

Each row of the document's table (between the ``<!-- rows -->`` markers) is a run with its
configuration as the source states it; ``spec`` writes it as a spec (GPT shape: MHA, f = 4h,
LayerNorm, biases, vocabulary 51,200, sequence 2,048, fp16 on A100 80GB, tensor parallelism
inside a node, pipeline stages across nodes); ``predicted`` is the model's step time in seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from placement_logic.costs import derive
from placement_logic.costs.steptime import step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string

DOC = Path(__file__).resolve().parent.parent / "docs" / "validation_time.md"


@dataclass(frozen=True)
class Run:
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    chunks: int
    gpus: int
    batch: int
    micro: int
    mode: str  # full (full recompute, tensor parallel) | seqsel (sequence parallel, selective recompute)
    measured: Fraction  # seconds per iteration, as published
    shown: Fraction  # the model's figure the document prints
    error: str  # the document's error column


def runs() -> list[Run]:
    text = DOC.read_text()
    body = text.split("<!-- rows -->")[1]
    out = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 14 or not re.fullmatch(r"\d+", cells[0]):
            continue
        _, name, heads, hidden, layers, tp, pp, v, gpus, batch, micro, mode, measured, shown, error = cells[:15]
        num = [int(x.replace(",", "")) for x in (heads, hidden, layers, tp, pp, v, gpus, batch, micro)]
        out.append(Run(name, *num, mode, Fraction(measured), Fraction(shown), error))
    return out


def spec(r: Run, mesh_extra: str = "") -> str:
    tensor = "megatron_tp" if r.mode == "full" else "megatron_sp"
    recompute = "full_recompute" if r.mode == "full" else "selective_recompute"
    pipe = ""
    if r.pp > 1:
        pipe = f"  pp: interleaved_1f1b(v = {r.chunks})\n" if r.chunks > 1 else "  pp: one_f_one_b\n"
    return (f"from std.tensor import {tensor}\nfrom std.pipeline import one_f_one_b, interleaved_1f1b\n"
            f"from std.recompute import {recompute}\n"
            f"model {{\n  transformer {{ hidden = {r.hidden} layers = {r.layers} heads = {r.heads} "
            f"ffn = {4 * r.hidden} vocab = 51200 }}\n  seq = 2048\n  microbatch = {r.micro}\n"
            f"  microbatches = {r.batch // r.micro // (r.gpus // (r.tp * r.pp))}\n"
            f"  conventions {{ attention_flops = full }}\n}}\n"
            f"mesh {{\n  device = a100_80gb\n  precision = fp16\n{mesh_extra}"
            + (f"  dp = {r.gpus // (r.tp * r.pp)} @ inter_node\n" if r.gpus > r.tp * r.pp else "")
            + f"  tp = {r.tp} @ intra_node\n" + (f"  pp = {r.pp} @ inter_node\n" if r.pp > 1 else "")
            + "}\nplan p {\n" + ("  dp: ddp\n" if r.gpus > r.tp * r.pp else "")
            + f"  tp: {tensor}\n{pipe}  use {recompute}\n}}\n")


@lru_cache(maxsize=None)  # a pure function of the run, asked for by several tests
def predicted(r: Run, mesh_extra: str = "") -> Fraction:
    src = spec(r, mesh_extra)
    if r.gpus > r.tp * r.pp:
        src = "from std.data import ddp\n" + src
    plan = load_string(src).plans[0]
    st = step_time(derive(plan), plan.mesh.hardware)
    sizes = {symbol("tp"): r.tp, symbol("pp"): r.pp, symbol("dp"): r.gpus // (r.tp * r.pp)}
    value = st.step.xreplace(sizes)
    return Fraction(int(value.p), int(value.q))
