"""The published measured runs of docs/validation_time.md, read from its table, written as specs.

Each row of the document's table (between the ``<!-- rows -->`` markers) is a run with its
configuration as the source states it; ``spec`` writes it as a spec (GPT shape: MHA, f = 4h,
LayerNorm, biases, vocabulary 51,200, sequence 2,048, fp16 on A100 80GB, tensor parallelism
inside a node, data and pipeline parallelism across nodes); ``predicted`` is the model's step
time in seconds. A run published as achieved TFLOP/s per GPU (Narayanan et al. 2021) is turned
into seconds per iteration with that paper's own FLOP count, its equation (3):
96·B·s·l·h²·(1 + s/6h + V/16lh) over GPUs × TFLOP/s.
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
SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Run:
    source: str  # K22 T5 | N21 T1 | N21 T2 (docs/validation_time.md names them)
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
    ddp: str  # - (no data parallelism) | torch (all-reduce overlapped with backward) | local (after it)
    backward: str  # exposed | overlapped: the tensor-parallel backward's collectives (Megatron-LM's asynchronous one)
    published: str  # as the source prints it: "1.42 s" or "137 TFLOP/s"
    shown_measured: str  # the document's measured column (seconds, 2 decimals)
    shown: Fraction  # the model's figure the document prints
    error: str  # the document's error column

    @property
    def measured(self) -> Fraction:
        """Seconds per iteration, exact: as published, or from the published TFLOP/s per GPU."""
        value, unit = self.published.split()
        if unit == "s":
            return Fraction(value)
        assert unit == "TFLOP/s", unit
        s, h, ll = SEQ, self.hidden, self.layers
        flops = 96 * self.batch * s * ll * h * h * (1 + Fraction(s, 6 * h) + Fraction(VOCAB, 16 * ll * h))
        return flops / (self.gpus * Fraction(value) * 10**12)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


def runs() -> list[Run]:
    text = DOC.read_text()
    body = text.split("<!-- rows -->")[1]
    out = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 19 or not re.fullmatch(r"\d+", cells[0]):
            continue
        (_, source, name, heads, hidden, layers, tp, pp, v, gpus, batch, micro, mode, ddp, backward, published,
         measured, shown, error) = cells[:19]
        num = [int(x.replace(",", "")) for x in (heads, hidden, layers, tp, pp, v, gpus, batch, micro)]
        out.append(Run(source, name, *num, mode, ddp, backward, published, measured, Fraction(shown), error))
    return out


def spec(r: Run, mesh_extra: str = "") -> str:
    tensor = "megatron_tp" if r.mode == "full" else "megatron_sp"
    recompute = "full_recompute" if r.mode == "full" else "selective_recompute"
    pipe = ""
    if r.pp > 1:
        pipe = f"  pp: interleaved_1f1b(v = {r.chunks})\n" if r.chunks > 1 else "  pp: one_f_one_b\n"
    data = r.dp > 1
    overlap = "  overlap = false\n" if r.ddp == "local" else ""
    return (("from std.data import ddp\n" if data else "")
            + f"from std.tensor import {tensor}\nfrom std.pipeline import one_f_one_b, interleaved_1f1b\n"
            f"from std.recompute import {recompute}\n"
            f"model {{\n  transformer {{ hidden = {r.hidden} layers = {r.layers} heads = {r.heads} "
            f"ffn = {4 * r.hidden} vocab = {VOCAB} }}\n  seq = {SEQ}\n  microbatch = {r.micro}\n"
            f"  microbatches = {r.batch // r.micro // r.dp}\n"
            f"  conventions {{ attention_flops = full tensor_backward = {r.backward} }}\n}}\n"
            f"mesh {{\n  device = a100_80gb\n  precision = fp16\n{mesh_extra}{overlap}"
            + (f"  dp = {r.dp} @ inter_node\n" if data else "")
            + f"  tp = {r.tp} @ intra_node\n" + (f"  pp = {r.pp} @ inter_node\n" if r.pp > 1 else "")
            + "}\nplan p {\n" + ("  dp: ddp\n" if data else "")
            + f"  tp: {tensor}\n{pipe}  use {recompute}\n}}\n")


def predicted(r: Run, mesh_extra: str = "") -> Fraction:
    return _predicted(r, mesh_extra)  # one cache key however it is called (lru_cache keys f(r) and f(r, "") apart)


@lru_cache(maxsize=None)  # a pure function of the run, asked for by several tests
def _predicted(r: Run, mesh_extra: str) -> Fraction:
    plan = load_string(spec(r, mesh_extra)).plans[0]
    st = step_time(derive(plan), plan.mesh.hardware)
    sizes = {symbol("tp"): r.tp, symbol("pp"): r.pp, symbol("dp"): r.dp}
    value = st.step.xreplace(sizes)
    return Fraction(int(value.p), int(value.q))

SETS = (("K22 T5", "Korthikanti et al. 2022, Table 5", "in sample: the two fitted factors"),
        ("N21 T1", "Narayanan et al. 2021, Table 1", "held out"),
        ("N21 T2", "Narayanan et al. 2021, Table 2, PTD-P", "held out"))


def errors(rs: list[Run], mesh_extra: str = "") -> list[Fraction]:
    return [abs(predicted(r, mesh_extra) - r.measured) / r.measured for r in rs]


def _pct(x: Fraction) -> str:
    return f"{100 * float(x):.1f} %"


def summary_lines(all_runs: list[Run]) -> list[str]:
    """The summary table's rows: mean and maximum absolute error per set, of the kernel model and
    of the single-MFU convention (MFU 1/2)."""
    groups = [(label, f"{title} ({note})", [r for r in all_runs if r.source == label]) for label, title, note in SETS]
    held = [r for r in all_runs if r.source != "K22 T5"]
    groups += [("held out", "Narayanan et al. 2021, both tables", held), ("all", "every row", list(all_runs))]
    out = []
    for label, title, rs in groups:
        k, m = errors(rs), errors(rs, "  mfu = 1/2\n")
        worst = all_runs.index(rs[k.index(max(k))]) + 1
        out.append(f"| {label} | {title} | {len(rs)} | {_pct(sum(k) / len(k))} | {_pct(max(k))} (row {worst}) | "
                   f"{_pct(sum(m) / len(m))} | {_pct(max(m))} |")
    return out
