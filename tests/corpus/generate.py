"""Writes the checker's mutation and equivalence corpus: base plans from the library,
one mutation each (`mutants/`), or restated in an equivalent form (`equivalent/`).

    python tests/corpus/generate.py [OUTDIR]

OUTDIR defaults to this file's directory. The output is deterministic; the test suite
re-generates it into a temporary directory and compares. Every mutant's `# expect:` and
`# root:` lines come from what its mutation operator breaks according to the step
semantics (docs/semantics.md), not from the checker's output. A `# known-gap:` line marks
a file the checker is known to get wrong (KNOWN_GAPS); its test is an expected failure.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------------
# Models and base plans

MODELS = {
    "plain": ("params = 7e9", "microbatches = 4"),
    "pipeline": ("params = 20e9", "microbatches = 16"),
    "dense": (
        "transformer {\n    hidden = 4096\n    layers = 32\n    heads = 32\n    ffn = 16384\n"
        "    vocab = 50304\n  }",
        "seq = 2048",
        "microbatch = 4",
        "microbatches = 4",
    ),
    "tied": (
        "transformer {\n    hidden = 2048\n    layers = 24\n    heads = 16\n    ffn = 8192\n"
        "    vocab = 50304\n    tied_embeddings = true\n  }",
        "seq = 2048",
        "microbatch = 1",
        "microbatches = 8",
    ),
    "mqa": (  # one K/V head (copied on every tensor rank) and query/key norms shared by the heads
        "transformer {\n    hidden = 2048\n    layers = 16\n    heads = 16\n    kv_heads = 1\n    ffn = 8192\n"
        "    vocab = 50304\n    qk_norm\n  }",
        "seq = 2048",
        "microbatch = 2",
        "microbatches = 4",
    ),
    "gqa": (  # two kv heads, each copied on tp/2 tensor ranks when tp > 2
        "transformer {\n    hidden = 2048\n    layers = 16\n    heads = 16\n    kv_heads = 2\n    ffn = 8192\n"
        "    vocab = 50304\n  }",
        "seq = 2048",
        "microbatch = 2",
        "microbatches = 4",
    ),
    "moe": (
        "transformer {\n    hidden = 4096\n    layers = 32\n    heads = 32\n    ffn = 14336\n"
        "    vocab = 32000\n    experts = 8\n    top_k = 2\n  }",
        "seq = 4096",
        "microbatch = 1",
        "microbatches = 4",
    ),
}

# models whose group blocks place a group themselves (docs/language.md, "Parameter groups")
VISION = "group vision {{ count = 100000000  {} }}"
MODELS.update({
    "moe_experts_grads_r": MODELS["moe"] + ("group experts { grads = {ep: R} }",),
    "moe_experts_restated": MODELS["moe"] + ("group experts { params = {ep: S}  optimizer = {ep: S}  grads = {ep: S} }",),
    "moe_vision_grads_s": MODELS["moe"] + (VISION.format("grads = {ep: S}  optimizer = {ep: R}"),),
    "plain_vision_params_r": MODELS["plain"] + (VISION.format("params = {dp: R}"),),
    "plain_vision_ddp": MODELS["plain"] + (VISION.format("placement = {dp: R}"),),
    "plain_vision_zero3": MODELS["plain"] + (VISION.format("params = {dp: S*}  optimizer = {dp: S}  grads = {dp: S}"),),
})

# models with loss terms besides the main loss (docs/language.md, "Loss terms")
MODELS.update({
    "moe_aux": MODELS["moe"] + ("losses {\n    aux = per_microbatch_mean\n  }",),
    # MoE parallel folding with an expert tensor group of its own: the experts split over x, a data axis
    # of the dense layers (examples/bugs/etp_*.place)
    "moe_etp": MODELS["moe"] + ("group experts {\n    role = {ep: expert, x: tensor}\n  }",),
    "dense_mtp": MODELS["dense"] + ("losses {\n    mtp = global_mean\n  }",),
    "plain_mtp": MODELS["plain"] + ("losses {\n    mtp = global_mean\n  }",),
    # the cross entropy with label smoothing and an output z-loss (docs/language.md, "Loss terms")
    "dense_ce": MODELS["dense"] + ("losses {\n    label_smoothing = true\n    logit_z_loss = true\n  }",),
})
# the aux term with the groups of its routing statistics (docs/language.md, "Loss terms")
AUX_STATS = "losses {{\n    aux = {}\n    aux_stats = {}\n  }}"
MODELS.update({
    "moe_aux_global": MODELS["moe"] + (AUX_STATS.format("global_mean", "global_batch"),),
    "moe_aux_micro": MODELS["moe"] + (AUX_STATS.format("per_microbatch_mean", "per_microbatch"),),
    "moe_aux_seq": MODELS["moe"] + (AUX_STATS.format("per_microbatch_mean", "per_sequence"),),
    "moe_aux_seq2": tuple("microbatch = 2" if line == "microbatch = 1" else line for line in MODELS["moe"])
    + (AUX_STATS.format("per_microbatch_mean", "per_sequence"),),
})
MODELS["gqa12"] = (  # two kv heads, 12 query heads: tensor sizes 3 x 4 give copy groups crossing the axes
    "transformer {\n    hidden = 1536\n    layers = 16\n    heads = 12\n    kv_heads = 2\n    ffn = 6144\n"
    "    vocab = 50304\n  }", "seq = 2048", "microbatch = 2", "microbatches = 4")
# packed rows: several documents of free lengths per row, a sequence of the objective one document (check.auxpacked)
AUX_PACKED = "losses {{\n    aux = per_microbatch_mean\n    aux_stats = {}\n    aux_packed = true\n  }}"
MODELS["moe_aux_seq_packed"] = MODELS["moe"] + (AUX_PACKED.format("per_sequence"),)
MODELS["moe_aux_micro_packed"] = MODELS["moe"] + (AUX_PACKED.format("per_microbatch"),)
MODELS["moe_aux_global_k8"] = tuple(line.replace("top_k = 2", "top_k = 8") for line in MODELS["moe_aux_global"])
# sliding-window attention (docs/language.md, "The model"; check.cpwindow): a window of 512 of 2048 positions, and one
# as long as the sequence (it never binds)
MODELS["moe_drop_renorm"] = tuple(line.replace("top_k = 2\n", "top_k = 2\n    drop_renormalise\n") for line in MODELS["moe"])
MODELS["dense_window"] = MODELS["dense"] + ("attention {\n    window = 512\n  }",)
MODELS["dense_window_whole"] = MODELS["dense"] + ("attention {\n    window = 2048\n  }",)
# chunked (local) attention (check.cpchunk): chunks of 512 of 2048 positions, and one chunk as long as the sequence
MODELS["dense_chunk"] = MODELS["dense"] + ("attention {\n    chunk = 512\n  }",)
MODELS["dense_chunk_whole"] = MODELS["dense"] + ("attention {\n    chunk = 2048\n  }",)

GROUPS = {
    "plain": ("dense", "norms", "biases", "embedding"),
    "pipeline": ("dense", "norms", "biases", "embedding"),
    "dense": ("dense", "norms", "biases", "embedding"),
    "tied": ("dense", "norms", "biases", "embedding"),
    "moe": ("dense", "norms", "biases", "experts", "embedding"),
    "moe_etp": ("dense", "norms", "biases", "experts", "embedding"),
    "mqa": ("dense", "kv", "norms", "qk_norms", "biases", "embedding"),
    "gqa": ("dense", "kv", "norms", "biases", "embedding"),
    "gqa12": ("dense", "kv", "norms", "biases", "embedding"),
}


@dataclass(frozen=True)
class Base:
    name: str
    title: str
    imports: tuple[str, ...]
    model: str
    mesh: tuple[tuple[str, int], ...]
    bind: tuple[str, ...]

    def all_groups(self) -> tuple[str, ...]:
        return GROUPS[self.model]


def base(name, title, imports, model, mesh, bind):
    return Base(name, title, tuple(imports), model, tuple(mesh), tuple(bind))


D = "from std.data import "
BASES = {b.name: b for b in [
    base("ddp", "DDP", [D + "ddp"], "plain", [("dp", 8)], ["dp: ddp"]),
    base("zero1", "ZeRO-1", [D + "zero1"], "plain", [("dp", 8)], ["dp: zero1"]),
    base("zero2", "ZeRO-2", [D + "zero2"], "plain", [("dp", 8)], ["dp: zero2"]),
    base("zero3", "ZeRO-3", [D + "zero3"], "plain", [("dp", 8)], ["dp: zero3"]),
    base("fsdp", "FSDP FULL_SHARD", [D + "fsdp_full_shard"], "plain", [("dp", 8)],
         ["dp: fsdp_full_shard"]),
    base("fsdp_sgo", "FSDP SHARD_GRAD_OP", [D + "fsdp_shard_grad_op"], "plain", [("dp", 8)],
         ["dp: fsdp_shard_grad_op"]),
    base("hsdp", "FSDP HYBRID_SHARD", [D + "hybrid_shard"], "plain", [("nodes", 4), ("gpus", 8)],
         ["[nodes, gpus]: hybrid_shard"]),
    base("zero_offload", "ZeRO-Offload", ["from std.offload import zero_offload"], "plain", [("dp", 8)],
         ["dp: zero_offload"]),
    base("zero_infinity", "ZeRO-Infinity", ["from std.offload import zero_infinity"], "plain",
         [("dp", 8)], ["dp: zero_infinity"]),
    base("tp", "DDP x Megatron TP", [D + "ddp", "from std.tensor import megatron_tp"], "dense",
         [("dp", 8), ("tp", 8)], ["dp: ddp", "tp: megatron_tp"]),
    base("mqa_tp", "DDP x Megatron TP, one kv head and query/key norms", [D + "ddp", "from std.tensor import megatron_tp"],
         "mqa", [("dp", 8), ("tp", 2)], ["dp: ddp", "tp: megatron_tp"]),
    base("gqa_tp", "DDP x Megatron TP, two kv heads each copied on two tensor ranks",
         [D + "ddp", "from std.tensor import megatron_tp"], "gqa", [("dp", 8), ("tp", 4)], ["dp: ddp", "tp: megatron_tp"]),
    base("gqa_tp2", "DDP x Megatron TP over two tensor axes, two kv heads each copied on a run of four of their "
         "joint ranks", [D + "ddp", "from std.tensor import megatron_tp"], "gqa", [("dp", 8), ("tp", 4), ("tl", 2)],
         ["dp: ddp", "tp: megatron_tp", "tl: megatron_tp"]),
    base("gqa_tp3x4", "DDP x Megatron TP over tp = 3 x tl = 4, two kv heads each copied on a run of six joint ranks "
         "(crossing the axes' blocks)", [D + "ddp", "from std.tensor import megatron_tp"], "gqa12",
         [("dp", 8), ("tp", 3), ("tl", 4)], ["dp: ddp", "tp: megatron_tp", "tl: megatron_tp"]),
    base("mqa_sp", "ZeRO-1 x Megatron TP with SP, one kv head and query/key norms",
         [D + "zero1", "from std.tensor import megatron_sp"], "mqa", [("dp", 8), ("tp", 4)],
         ["dp: zero1", "tp: megatron_sp"]),
    base("sp", "ZeRO-1 x Megatron TP with sequence parallelism", [D + "zero1", "from std.tensor import megatron_sp"],
         "dense", [("dp", 8), ("tp", 4)], ["dp: zero1", "tp: megatron_sp"]),
    base("fsdp_tp", "FSDP x Megatron TP", [D + "fsdp_full_shard", "from std.tensor import megatron_tp"],
         "dense", [("dp", 8), ("tp", 8)], ["dp: fsdp_full_shard", "tp: megatron_tp"]),
    base("gpipe", "DDP x GPipe (tied embeddings)", [D + "ddp", "from std.pipeline import gpipe"], "tied",
         [("dp", 8), ("pp", 4)], ["dp: ddp", "pp: gpipe"]),
    base("1f1b", "ZeRO-1 x 1F1B (tied embeddings)", [D + "zero1", "from std.pipeline import one_f_one_b"],
         "tied", [("dp", 8), ("pp", 4)], ["dp: zero1", "pp: one_f_one_b"]),
    base("interleaved", "ZeRO-1 x interleaved 1F1B (tied embeddings)",
         [D + "zero1", "from std.pipeline import interleaved_1f1b"], "tied", [("dp", 8), ("pp", 4)],
         ["dp: zero1", "pp: interleaved_1f1b(v = 2)"]),
    base("zero2_pp", "ZeRO-2 x 1F1B", [D + "zero2", "from std.pipeline import one_f_one_b"], "pipeline",
         [("dp", 8), ("pp", 4)], ["dp: zero2", "pp: one_f_one_b"]),
    base("zero3_pp", "ZeRO-3 x GPipe", [D + "zero3", "from std.pipeline import gpipe"], "pipeline",
         [("dp", 8), ("pp", 4)], ["dp: zero3", "pp: gpipe"]),
    base("cp", "DDP x context parallelism", [D + "ddp", "from std.context import context_parallel"], "dense",
         [("dp", 8), ("cp", 4)], ["dp: ddp", "cp: context_parallel"]),
    base("cp_zero3", "ZeRO-3 x context parallelism", [D + "zero3", "from std.context import context_parallel"],
         "dense", [("dp", 8), ("cp", 4)], ["dp: zero3", "cp: context_parallel"]),
    base("ep", "DDP x expert parallelism", [D + "ddp", "from std.expert import expert_parallel"], "moe",
         [("dp", 4), ("ep", 8)], ["dp: ddp", "ep: expert_parallel"]),
    base("zeropp_dp", "ZeroPP with DDP across nodes", ["from std.zeropp import zeropp_dp"], "pipeline",
         [("stage", 4), ("intra", 8), ("inter", 4)], ["[stage, intra, inter]: zeropp_dp(v = 2, U = 4)"]),
    base("zeropp_zero1", "ZeroPP with ZeRO-1 across nodes", ["from std.zeropp import zeropp_zero1"],
         "pipeline", [("stage", 4), ("intra", 8), ("inter", 4)],
         ["[stage, intra, inter]: zeropp_zero1(v = 2, U = 4)"]),
    base("3d", "Megatron 3D: ZeRO-1 x TP with SP x interleaved 1F1B (tied embeddings)",
         [D + "zero1", "from std.tensor import megatron_sp", "from std.pipeline import interleaved_1f1b"],
         "tied", [("dp", 4), ("tp", 8), ("pp", 4)],
         ["dp: zero1", "tp: megatron_sp", "pp: interleaved_1f1b(v = 2)"]),
    base("4d", "4D: ZeRO-1 x CP x TP with SP x interleaved 1F1B (tied embeddings)",
         [D + "zero1", "from std.context import context_parallel", "from std.tensor import megatron_sp",
          "from std.pipeline import interleaved_1f1b"],
         "tied", [("dp", 4), ("cp", 2), ("tp", 8), ("pp", 4)],
         ["dp: zero1", "cp: context_parallel", "tp: megatron_sp", "pp: interleaved_1f1b(v = 2)"]),
    base("fsdp_4d", "4D: FSDP x CP x TP x interleaved 1F1B (tied embeddings)",
         [D + "fsdp_full_shard", "from std.context import context_parallel", "from std.tensor import megatron_tp",
          "from std.pipeline import interleaved_1f1b"],
         "tied", [("dp", 4), ("cp", 2), ("tp", 8), ("pp", 4)],
         ["dp: fsdp_full_shard", "cp: context_parallel", "tp: megatron_tp", "pp: interleaved_1f1b(v = 2)"]),
    base("moe_3d", "MoE 3D: DDP x Megatron TP x expert parallelism",
         [D + "ddp", "from std.tensor import megatron_tp", "from std.expert import expert_parallel"], "moe",
         [("dp", 4), ("tp", 4), ("ep", 8)], ["dp: ddp", "tp: megatron_tp", "ep: expert_parallel"]),
    base("moe_etp", "MoE folding: ZeRO-1 x Megatron TP with SP, experts on expert ep x expert tensor x",
         [D + "zero1", "from std.tensor import megatron_sp"], "moe_etp",
         [("dp", 4), ("x", 2), ("ep", 4), ("tp", 2)], ["dp: zero1", "x: zero1", "ep: zero1", "tp: megatron_sp"]),
]}


def merged_imports(lines) -> list[str]:
    """`from M import a` lines merged per module, in first-seen order."""
    names: dict[str, list[str]] = {}
    for line in lines:
        module, imported = line.removeprefix("from ").split(" import ")
        for n in imported.split(", "):
            if n not in names.setdefault(module, []):
                names[module].append(n)
    return [f"from {m} import {', '.join(ns)}" for m, ns in names.items()]


def spec_text(header: list[str], imports, model: str, mesh, strategies: list[str], plan: str, body: list[str]) -> str:
    """`header` lines become comments; prose lines (those without a `key: ` tag the tests read) are wrapped."""
    out = []
    for h in header:
        tagged = h.split(": ", 1)[0] in ("expect", "root", "known-gap", "equivalent to")
        out += [f"# {h}"] if tagged else textwrap.wrap(h, 96, initial_indent="# ", subsequent_indent="#   ")
    out += merged_imports(imports)
    out += ["", "model {"] + [f"  {x}" for x in MODELS[model]] + ["}", "", "mesh {"]
    out += [f"  {a} = {n}" for a, n in mesh] + ["}", ""]
    for s in strategies:
        out += [s, ""]
    out += [f"plan {plan} {{"] + [f"  {x}" for x in body] + ["}"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Mutants


@dataclass(frozen=True)
class Mutant:
    name: str
    base: Base
    what: str  # the mutation, one sentence
    lines: tuple[str, ...]  # plan lines added to the base's bindings
    expect: tuple[str, ...]
    root: str
    mirrors: str = ""  # the real-world bug it mirrors, where one exists
    bind: tuple[str, ...] | None = None  # replaces the base's bindings
    imports: tuple[str, ...] = ()
    known_gap: str = ""  # filled from KNOWN_GAPS
    model: str | None = None  # replaces the base's model (one whose groups place themselves)

    def text(self) -> str:
        b = self.base
        header = [f"Mutant of {b.title}: {self.what}"]
        if self.mirrors:
            header.append(f"Mirrors: {self.mirrors}")
        header.append(f"expect: {', '.join(self.expect)}")
        header.append(f"root: {self.root}")
        if self.known_gap:
            header.append(f"known-gap: {self.known_gap}")
        body = list(self.bind if self.bind is not None else b.bind) + list(self.lines)
        return spec_text(header, b.imports + self.imports, self.model or b.model, b.mesh, [], "mutant", body)


MUTANTS: list[Mutant] = []

# Mutants on which the checker departs from the step semantics, with the reason.
KNOWN_GAPS: dict[str, str] = {}


def mutant(name, base_name, what, lines, expect, root=None, **kw):
    expect = tuple(dict.fromkeys(expect))
    root = root or expect[0]
    assert root in expect, (name, root)
    MUTANTS.append(Mutant(name, BASES[base_name], what, tuple(lines), expect, root,
                          known_gap=KNOWN_GAPS.get(name, ""), **kw))


def gi(groups, aspect):
    """The GI obligations of a departure on one aspect: the aspect's and the whole plan's."""
    return [f"GI grads[{g}] {aspect}" for g in groups] + [f"GI grads[{g}]" for g in groups]


def gi_root(groups, aspect):
    return f"GI grads[{groups[0]}] {aspect}"


# Real-world bugs, as named by the catalogue in examples/bugs/.
SP_NORMS = ("Megatron-LM all-reduces sequence-parallel LayerNorm grads over tp (NVIDIA/Megatron-LM#443); "
            "GPT-NeoX's first SP port did not (EleutherAI/gpt-neox#1257)")
SP_BIASES = "NeMo's SP port missed row-parallel biases (NVIDIA-NeMo/NeMo#7184)"
TWICE = "a DDP wrapper's hooks plus a hand-written all-reduce (examples/bugs/grad_reduced_twice.place)"
CLIP_FSDP = "clip_grad_norm_ on a local FSDP shard (pytorch/pytorch#72548, pytorch/pytorch#170862)"
CLIP_PP = "clipping per pipeline stage (meta-pytorch/torchtune#2169)"
MEAN_OF_MEANS = "per-device token means (verl-project/verl#5983, PrimeIntellect-ai/prime-rl#2562)"
MB_MEANS = "per-microbatch means in gradient accumulation (huggingface/transformers#34191, karpathy/nanochat#59)"
CP_TOKENS = "token count reduced over the pure DP group under CP (verl-project/verl#5983, #6049)"
EXPERT_DIV = "expert grads divided by the expert-data size (deepspeedai/DeepSpeed#6546, NVIDIA/Megatron-LM#5956)"
TIED_SUM = "tied embedding copies not summed across stages (NVIDIA/Megatron-LM#299, uw-syfi/piper#13)"
CLIP_FILTER = ("a model-parallel grad norm without Megatron-LM's duplicate filter: tensor-parallel duplicates "
               "(param_is_not_tensor_parallel_duplicate) are counted on tensor rank 0 only")
TIED_NORM = "tied embedding counted twice in the grad norm (NVIDIA/Megatron-LM#7227, #7228)"
NO_BUFFER = "ZeRO-2/3 under pipeline accumulation (deepspeedai/DeepSpeed#823, #1629)"
REGATHER = "Megatron's distributed optimizer all-gathers the updated params after every step"
DROPOUT = "Megatron-LM's model_parallel_cuda_manual_seed keeps tp seeds equal outside partitioned regions"
SP_DROPOUT = "Megatron-LM forks the tensor-parallel RNG tracker around SP dropout"
OVERFLOW = "Megatron-LM and DeepSpeed ZeRO-2 all-reduce found_inf across the sharded group"
QK_NORMS = "Megatron-LM all-reduces q_layernorm/k_layernorm grads over tp (finalize_model_grads)"
KV_COPIES = "a K/V head copied on every tensor rank (MQA, kv_heads < tp) sees only its rank's query heads"

# -- placement-only bugs ------------------------------------------------------------------

# params S on a data axis, never gathered: the forward runs with 1/n of the weights
for b, ax, line in [
    ("ddp", "dp", "params: {dp: S}"),
    ("zero1", "dp", "params: {dp: S}"),
    ("zero2", "dp", "params: {dp: S}"),
    ("zero3", "dp", "params: {dp: S}"),
    ("fsdp_sgo", "dp", "params: {dp: S}"),
    ("hsdp", "gpus", "params: {gpus: S}"),
    ("hsdp", "nodes", "params: {nodes: S}"),
    ("tp", "dp", "params: {dp: S}"),
    ("gpipe", "dp", "params: {dp: S}"),
    ("zeropp_dp", "intra", "params: {intra: S}"),
    ("3d", "dp", "params: {dp: S}"),
]:
    mutant(f"params_s_unsharded_{b}_{ax}", b,
           f"params placed S on data axis {ax} with no gather, so every forward sees 1/{ax} of the weights.",
           [line], [f"SC params usable over {ax}"])

# params S on a context axis
for b in ["cp", "cp_zero3", "4d"]:
    mutant(f"params_s_context_{b}", b,
           "params placed S on the context axis cp: context ranks split the sequence, not the weights, "
           "so each runs with 1/cp of them.",
           ["params: {cp: S}"], ["SC params usable over cp"])

# grads sharded (S, M, O) with the optimizer state replicated on a data axis
for b, ax, mode in [
    ("ddp", "dp", "S"), ("ddp", "dp", "M"), ("ddp", "dp", "O"),
    ("tp", "dp", "S"), ("hsdp", "nodes", "S"), ("cp", "cp", "S"), ("gpipe", "dp", "M"),
    ("zeropp_dp", "inter", "S"),
]:
    mutant(f"grads_{mode.lower()}_optimizer_r_{b}_{ax}", b,
           f"grads placed {mode} on {ax} while the optimizer state is R there: every replica steps the full "
           "parameters with only its shard of the gradient.",
           [f"grads: {{{ax}: {mode}}}"], [f"SC optimizer step over {ax}"])

mutant("optimizer_r_sharded_grads_zero2", "zero2",
       "optimizer state placed R on dp while the grads stay S (reduce-scattered): every replica "
       "steps the full parameters with only its shard of the gradient.",
       ["optimizer: {dp: R}"], ["SC optimizer step over dp"])

# S* params whose gather is dropped, misdirected or doubled
for b, ax, gather, extra, what in [
    ("zero3", "dp", "()", [], "never all-gathered"),
    ("fsdp", "dp", "()", [], "never all-gathered"),
    ("zero_infinity", "dp", "()", [], "never fetched by a gather"),
    ("zero3", "dp", "(dp, dp)", [], "all-gathered twice (two concatenated copies)"),
    ("fsdp_sgo", "dp", "(dp, dp)", [], "all-gathered twice (two concatenated copies)"),
    ("hsdp", "gpus", "(nodes)", ["CR03"], "gathered over the replicated axis nodes instead of gpus"),
    ("hsdp", "gpus", "(gpus, gpus)", [], "all-gathered twice over gpus"),
    ("fsdp_tp", "dp", "()", [], "never all-gathered over dp"),
    ("cp_zero3", "dp", "(cp)", ["CR03"], "gathered over the replicated context axis instead of dp"),
    ("zeropp_dp", "intra", "(inter)", ["CR03"], "gathered over the replicated axis inter instead of intra"),
    ("zero3_pp", "dp", "(dp, dp)", [], "all-gathered twice over dp"),
]:
    mutant(f"gather_{'none' if gather == '()' else 'twice' if gather.count(ax) == 2 else 'wrong_axis'}_{b}", b,
           f"S* params on {ax} {what} (`override params: gather over {gather}`).",
           [f"override params: gather over {gather}"], [f"SC params gathered over {ax}"] + extra)

# params R with a sharded optimizer step and no re-gather
for b in ["zero1", "zero2", "sp", "interleaved", "zeropp_zero1"]:
    mutant(f"no_regather_{b}", b,
           "params R over a data axis with a sharded optimizer step and `override params: no_regather`: "
           "each rank's copies of the shards it does not own go stale.",
           ["override params: no_regather"], ["SC params re-gather"], mirrors=REGATHER)
mutant("no_regather_optimizer_s_ddp", "ddp",
       "DDP with the optimizer state moved to S on dp (ZeRO-1 by placement) and `override params: no_regather`.",
       ["optimizer: {dp: S}", "override params: no_regather"], ["SC params re-gather"], mirrors=REGATHER)

# offloaded params never fetched
mutant("no_fetch_zero_infinity", "zero_infinity",
       "ZeRO-Infinity with `override params: no_fetch`: NVMe-resident params never reach the device.",
       ["override params: no_fetch"], ["CR04"])
mutant("no_fetch_offloaded_params", "zero_offload",
       "ZeRO-Offload with params placed O on dp and `override params: no_fetch`.",
       ["params: {dp: O}", "override params: no_fetch"], ["CR04"])

# a group's own modes, read as the same modes at plan level would be
mutant("group_experts_grads_r_ep", "ep",
       "the experts' own gradients placed R on ep (`group experts { grads = {ep: R} }`): the schedule all-reduces "
       "them over ep, adding different experts' gradients, as `grads: {ep: R}` at plan level does.",
       [], gi(["experts"], "over ep") + ["CR02", "CR07"], model="moe_experts_grads_r")
mutant("group_grads_s_optimizer_r_ep", "ep",
       "a dense group's own gradients sharded over ep with its optimizer state replicated there "
       "(`group vision { grads = {ep: S}  optimizer = {ep: R} }`): every ep replica steps the group's whole "
       "params with a shard of its gradient.",
       [], ["SC optimizer step over ep"], model="moe_vision_grads_s")
mutant("group_params_r_no_regather_zero3", "zero3",
       "a group's own params replicated over dp beside ZeRO-3's sharded optimizer (`group vision { params = "
       "{dp: R} }`) and `override params: no_regather`: the group's updated shards are never all-gathered.",
       ["override params: no_regather"], ["SC params re-gather"], mirrors=REGATHER, model="plain_vision_params_r")

# -- override bugs: gradient reductions -------------------------------------------------

for b, line, groups, ax, extra, mirrors in [
    ("ddp", "override grads: reduce over ()", None, "dp", [], ""),
    ("zero2", "override grads: reduce over ()", None, "dp", [], ""),
    ("tp", "override grads: reduce over ()", None, "dp", [], ""),
    ("hsdp", "override grads: reduce over (gpus)", None, "nodes", [], ""),
    ("hsdp", "override grads: reduce over (nodes)", None, "gpus", [], ""),
    ("cp", "override grads: reduce over (dp)", None, "cp", [], ""),
    ("cp_zero3", "override grads[dense]: reduce over (dp)", ["dense"], "cp", [], ""),
    ("ep", "override grads: reduce over (dp)", ["dense", "norms", "biases", "embedding"], "ep", ["CR07"], ""),
    ("4d", "override grads[dense]: reduce over (dp)", ["dense"], "cp", [], ""),
    ("zeropp_dp", "override grads: reduce over (intra)", None, "inter", [], ""),
    ("sp", "override grads[norms]: reduce over (dp)", ["norms"], "tp", ["CR05"], SP_NORMS),
    ("mqa_tp", "override grads[kv]: reduce over (dp)", ["kv"], "tp", [], KV_COPIES),
    ("mqa_tp", "override grads[qk_norms]: reduce over (dp)", ["qk_norms"], "tp", [], QK_NORMS),
    ("mqa_sp", "override grads[kv]: reduce over (dp)", ["kv"], "tp", [], KV_COPIES),
    ("mqa_sp", "override grads[qk_norms]: reduce over (dp)", ["qk_norms"], "tp", [], QK_NORMS),
    ("3d", "override grads[norms]: reduce over (dp)", ["norms"], "tp", ["CR05"], SP_NORMS),
    ("4d", "override grads[norms]: reduce over (dp, cp)", ["norms"], "tp", ["CR05"], SP_NORMS),
    ("sp", "override grads[biases]: reduce over (dp)", ["biases"], "tp", ["CR05"], SP_BIASES),
    ("3d", "override grads[biases]: reduce over (dp)", ["biases"], "tp", ["CR05"], SP_BIASES),
]:
    bb = BASES[b]
    gs = tuple(groups or bb.all_groups())
    slug = "_".join(gs) if groups and len(gs) == 1 else "non_expert" if groups else "all"
    mutant(f"grads_missing_{ax}_{slug}_{b}", b,
           f"gradients of {', '.join(gs)} not reduced over {ax}, where their contributions are partial "
           f"(`{line.removeprefix('override ')}`).",
           [line], gi(gs, f"over {ax}") + ["CR02"] + extra, gi_root(gs, f"over {ax}"), mirrors=mirrors)

for b, line, groups, ax, extra, what, mirrors in [
    ("ddp", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("zero1", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("zero2", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("fsdp", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("hsdp", "override grads: reduce over (nodes, gpus, nodes)", None, "nodes", [], "a repeated axis", TWICE),
    ("cp", "override grads: reduce over (dp, cp, cp)", None, "cp", [], "a repeated axis", ""),
    ("gpipe", "override grads[dense]: reduce over (dp, dp)", ["dense"], "dp", [], "a repeated axis", TWICE),
    ("3d", "override grads[norms]: reduce over (dp, tp, tp)", ["norms"], "tp", [], "a repeated axis", ""),
    ("tp", "override grads[dense]: reduce over (dp, tp)", ["dense"], "tp", [],
     "an extra tensor axis on which dense grads are sharded", ""),
    ("tp", "override grads[norms]: reduce over (dp, tp)", ["norms"], "tp", [],
     "an extra tensor axis on which norm grads are replicated (no sequence parallelism)",
     "the sequence-parallel all-reduce applied without SP (NVIDIA/Megatron-LM#443)"),
    ("moe_3d", "override grads[biases]: reduce over (dp, ep, tp)", ["biases"], "tp", [],
     "an extra tensor axis on which bias grads are replicated (no sequence parallelism)", ""),
    ("gpipe", "override grads[dense]: reduce over (dp, pp)", ["dense"], "pp", [],
     "the pipeline axis, on which each stage holds its own layers", ""),
    ("ep", "override grads[experts]: reduce over (dp, ep)", ["experts"], "ep", ["CR07"],
     "the expert axis, where the all-to-all already summed the expert grads", ""),
    ("moe_3d", "override grads[experts]: reduce over (dp, ep)", ["experts"], "ep", ["CR07"],
     "the expert axis, where the all-to-all already summed the expert grads", ""),
]:
    bb = BASES[b]
    gs = tuple(groups or bb.all_groups())
    slug = "_".join(gs) if groups else "all"
    kind = "twice" if "repeated" in what else "extra"
    mutant(f"grads_{kind}_{ax}_{slug}_{b}", b,
           f"gradients of {', '.join(gs)} reduced over {what} (`{line.removeprefix('override ')}`).",
           [line], gi(gs, f"over {ax}") + ["CR02"] + extra, gi_root(gs, f"over {ax}"), mirrors=mirrors)

# wrong divisor
for b, line, groups, extra, what, mirrors in [
    ("ddp", "override grads: divide by dp", None, [], "the global token mean divided again by dp", ""),
    ("zero3", "override grads: divide by 2", None, [], "the global token mean divided by 2", ""),
    ("tp", "override grads[dense]: divide by tp", ["dense"], [], "dense grads divided by tp", ""),
    ("ep", "override grads[experts]: divide by dp", ["experts"], ["CR07"],
     "a per-device mean loss with expert grads divided by dp instead of dp*ep", EXPERT_DIV),
    ("moe_3d", "override grads[experts]: divide by dp", ["experts"], ["CR07"],
     "a per-device mean loss with expert grads divided by dp instead of dp*ep", EXPERT_DIV),
    ("ddp", "override grads: divide by dp", None, [],
     "a sum loss (reduction='sum') whose gradients DDP still averages over dp",
     "a summed loss averaged by DDP's default gradient division"),
    ("zero2", "override grads: divide by dp", None, [],
     "a sum loss whose reduce-scattered gradients are still averaged over dp", ""),
]:
    bb = BASES[b]
    gs = tuple(groups or bb.all_groups())
    lines = [line]
    if "per-device" in what:
        lines = ["override loss: per_device_mean", "override tokens: equal", line]
    if "sum loss" in what:
        lines = ["override loss: sum", line]
    mutant(f"wrong_divisor_{'_'.join(gs) if groups else 'all'}_{b}" + ("_sum_loss" if "sum loss" in what else ""), b, f"{what} (`{line.removeprefix('override ')}`).",
           lines, gi(gs, "normalisation") + extra, gi_root(gs, "normalisation"), mirrors=mirrors)

# -- override bugs: loss normalisation and token counts ----------------------------------

for b, line, what, mirrors in [
    ("ddp", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("zero3", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("hsdp", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("cp", "override loss: per_device_mean", "a mean of per-device means over dp and cp with unequal token counts",
     MEAN_OF_MEANS),
    ("3d", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("zero2", "override loss: per_microbatch_mean", "a mean of per-microbatch means with unequal token counts",
     MB_MEANS),
    ("1f1b", "override loss: per_microbatch_mean", "a mean of per-microbatch means with unequal token counts",
     MB_MEANS),
    ("zeropp_zero1", "override loss: per_microbatch_mean", "a mean of per-microbatch means with unequal token counts",
     MB_MEANS),
    ("cp", "override tokens: reduce over (dp)", "the token count summed over dp only, cp times too small", CP_TOKENS),
    ("4d", "override tokens: reduce over (dp)", "the token count summed over dp only, cp times too small", CP_TOKENS),
    ("ddp", "override tokens: reduce over ()", "the token count never summed over dp (a local count)", ""),
    ("hsdp", "override tokens: reduce over (gpus)", "the token count summed over gpus only", ""),
    ("ddp", "override tokens: reduce over (dp, dp)", "the token count summed twice over dp, dp times too large", ""),
    ("cp_zero3", "override tokens: reduce over (dp, cp, cp)", "the token count summed twice over cp", ""),
]:
    bb = BASES[b]
    gs = bb.all_groups()
    target, verb = line.removeprefix("override ").split(": ", 1)
    kind = verb.replace("()", "none").replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
    mutant(f"{target}_{kind}_{b}", b, f"{what} (`{line.removeprefix('override ')}`).",
           [line], gi(gs, "normalisation"), gi_root(gs, "normalisation"), mirrors=mirrors)

# -- override bugs: global reductions ----------------------------------------------------

for b, line, what, mirrors in [
    ("zero3", "override clip_norm: reduce over ()", "the grad norm of the local shard", CLIP_FSDP),
    ("fsdp", "override clip_norm: reduce over ()", "the grad norm of the local shard", CLIP_FSDP),
    ("hsdp", "override clip_norm: reduce over (nodes)", "the grad norm summed over the replicated axis only",
     CLIP_FSDP),
    ("tp", "override clip_norm: reduce over ()", "the grad norm of the local tensor shard",
     "Megatron-LM's clip_grad_norm all-reduces over the model-parallel group"),
    ("3d", "override clip_norm: reduce over (tp)", "the grad norm not summed across pipeline stages", CLIP_PP),
    ("zero3_pp", "override clip_norm: reduce over (dp)", "the grad norm not summed across pipeline stages", CLIP_PP),
    ("fsdp_tp", "override clip_norm[dense]: reduce over (dp)", "the dense grad norm not summed over tp", ""),
    ("fsdp", "override clip_norm[norms]: reduce over ()", "the norms' grad norm of the local shard only", ""),
    ("ddp", "override clip_norm: double_count", "every group counted twice in the grad norm", ""),
    ("zero2", "override clip_norm[norms]: double_count", "the norm weights counted twice in the grad norm", ""),
    ("gpipe", "override clip_norm[embedding]: double_count", "the tied embedding counted twice in the grad norm",
     TIED_NORM),
    ("3d", "override clip_norm[embedding]: double_count", "the tied embedding counted twice in the grad norm",
     TIED_NORM),
    ("zero2", "override overflow: reduce over ()", "the overflow flag of the local gradient shard", OVERFLOW),
    ("tp", "override overflow: reduce over (dp)", "the overflow flag not or-reduced over tp", OVERFLOW),
    ("zero3_pp", "override overflow: reduce over (dp)", "the overflow flag not or-reduced over pipeline stages",
     OVERFLOW),
    ("tp", "override dropout_seed: vary over (tp)", "dropout seeds varying over tp in a replicated region", DROPOUT),
    ("fsdp_tp", "override dropout_seed: vary over (tp)", "dropout seeds varying over tp in a replicated region",
     DROPOUT),
    ("sp", "override dropout_seed: same", "one dropout seed on every sequence-parallel slice", SP_DROPOUT),
    ("3d", "override dropout_seed: same", "one dropout seed on every sequence-parallel slice", SP_DROPOUT),
]:
    target = line.split(":", 1)[0].split()[1].split("[")[0]
    ob = {"clip_norm": "SC clip_norm", "overflow": "SC overflow", "dropout_seed": "SC dropout_seed"}[target]
    verb = line.split(": ", 1)[1].split()[0]
    group = line.split("[", 1)[1].split("]")[0] + "_" if "[" in line.split(":", 1)[0] else ""
    mutant(f"{target}_{group}{verb}_{b}", b, f"{what} (`{line.removeprefix('override ')}`).",
           [line], [ob], mirrors=mirrors)

# -- override bugs: tied embedding and accumulation ---------------------------------------

for b in ["gpipe", "interleaved", "3d"]:
    mutant(f"tie_not_summed_{b}", b,
           "tied embedding copies on the first and last stage never summed (`embedding: tie_reduce over ()`).",
           ["override embedding: tie_reduce over ()"],
           gi(["embedding"], "over pp") + ["SC grads[embedding]", "CR08"], mirrors=TIED_SUM)
for b in ["1f1b", "4d"]:
    mutant(f"tie_summed_twice_{b}", b,
           "tied embedding copies summed twice across the stage pair (`embedding: tie_reduce over (pp, pp)`).",
           ["override embedding: tie_reduce over (pp, pp)"], gi(["embedding"], "over pp") + ["CR08"])

for b in ["zero2_pp", "zero3_pp", "fsdp_4d", "zeropp_dp"]:
    bb = BASES[b]
    mutant(f"no_accumulation_buffer_{b}", b,
           "sharded grads under pipeline accumulation with neither a full buffer nor a reduce-scatter per "
           "microbatch (`grads: no_accumulation_buffer`): all but the last microbatch are lost.",
           ["override grads: no_accumulation_buffer"], gi(bb.all_groups(), "over microbatches") + ["CR06"],
           mirrors=NO_BUFFER)


# -- subtler departures ------------------------------------------------------------------

mutant("experts_replicated_not_reduced_ep", "ep",
       "experts placed R on ep (every rank holds every expert and sees only its own tokens) with expert "
       "grads reduced over dp only (`grads[experts]: reduce over (dp)`): their ep contributions are partial.",
       ["params: {ep: R}", "optimizer: {ep: R}", "grads: {ep: R}", "override grads[experts]: reduce over (dp)"],
       gi(["experts"], "over ep") + ["CR02"])
mutant("grads_extra_tp_dense_replicated_tp", "tp",
       "dense params placed R on tp (every tp rank computes the whole layer on the same tokens) and dense "
       "grads all-reduced over tp anyway (`grads[dense]: reduce over (dp, tp)`), multiplying them by tp.",
       ["params: {tp: R}", "optimizer: {tp: R}", "grads: {tp: R}", "override grads[dense]: reduce over (dp, tp)"],
       gi(["dense"], "over tp") + ["CR02"])
mutant("grads_twice_inter_all_zeropp_zero1", "zeropp_zero1",
       "gradients reduced twice over the inter-node axis (`grads: reduce over (intra, inter, inter)`).",
       ["override grads: reduce over (intra, inter, inter)"],
       gi(BASES["zeropp_zero1"].all_groups(), "over inter") + ["CR02"], mirrors=TWICE)
mutant("tokens_reduce_over_dp_ep", "ep",
       "the token count summed over dp only, although the expert axis splits the batch too "
       "(`tokens: reduce over (dp)`).",
       ["override tokens: reduce over (dp)"], gi(BASES["ep"].all_groups(), "normalisation"), mirrors=CP_TOKENS)
mutant("wrong_divisor_pdm_undivided_ddp", "ddp",
       "a per-device mean loss with equal token counts and the divisor overridden to 1 "
       "(`grads: divide by 1`): the sum of dp device means is dp times the mean.",
       ["override tokens: equal", "override loss: per_device_mean", "override grads: divide by 1"],
       gi(BASES["ddp"].all_groups(), "normalisation"))
mutant("wrong_divisor_pmm_no_microbatches_zero2", "zero2",
       "a per-microbatch mean loss with equal token counts divided by dp only (`grads: divide by dp`), "
       "not by dp times the number of microbatches.",
       ["override tokens: equal", "override loss: per_microbatch_mean", "override grads: divide by dp"],
       gi(BASES["zero2"].all_groups(), "normalisation"))
mutant("wrong_divisor_pdm_missing_cp", "cp",
       "a per-device mean loss with equal token counts divided by dp only (`grads: divide by dp`), "
       "not by dp times cp.",
       ["override tokens: equal", "override loss: per_device_mean", "override grads: divide by dp"],
       gi(BASES["cp"].all_groups(), "normalisation"))
mutant("no_accumulation_buffer_ddp", "ddp",
       "gradient accumulation that keeps the last microbatch only (`grads: no_accumulation_buffer`) "
       "without a pipeline.",
       ["override grads: no_accumulation_buffer"], gi(BASES["ddp"].all_groups(), "over microbatches"))
mutant("clip_norm_reduce_replicated_ddp", "ddp",
       "the grad norm summed over dp although DDP grads are replicated there (`clip_norm: reduce over (dp)`): "
       "every element counted dp times.",
       ["override clip_norm: reduce over (dp)"], ["SC clip_norm"])
mutant("clip_norm_reduce_replicated_tp", "tp",
       "the grad norm summed over dp and tp (`clip_norm: reduce over (dp, tp)`): DDP grads are replicated over "
       "dp, so every element is counted dp times.",
       ["override clip_norm: reduce over (dp, tp)"], ["SC clip_norm"])
for name, b, lines, what in [
    ("clip_norm_norms_reduce_unfiltered_tp", "tp", ["override clip_norm[norms]: reduce over (tp)"],
     "the norm weights' squared norm summed over tp with no duplicate filter (`clip_norm[norms]: reduce over "
     "(tp)`): they are replicated over tp, so every tp rank's copy is counted"),
    ("clip_norm_reduce_unfiltered_tp", "tp", ["override clip_norm: reduce over (tp)"],
     "the grad norm summed over tp with no duplicate filter (`clip_norm: reduce over (tp)`): the norm weights "
     "and biases, replicated over tp, are counted tp times"),
    ("clip_norm_reduce_unfiltered_fsdp_tp", "fsdp_tp", ["override clip_norm: reduce over (dp, tp)"],
     "the grad norm summed over dp and tp with no duplicate filter (`clip_norm: reduce over (dp, tp)`): the "
     "norm weights and biases, replicated over tp, are counted tp times"),
    ("clip_norm_reduce_filter_norms_only_tp", "tp",
     ["override clip_norm: reduce over (tp)", "override clip_norm[norms]: dedupe over (tp)"],
     "the grad norm summed over tp with the duplicate filter stated for the norm weights only "
     "(`clip_norm[norms]: dedupe over (tp)`): the biases, replicated over tp too, are counted tp times"),
]:
    mutant(name, b, what + ".", lines, ["SC clip_norm"], mirrors=CLIP_FILTER)
mutant("dropout_seed_vary_data_only_sp", "sp",
       "dropout seeds varying over dp only (`dropout_seed: vary over (dp)`): sequence-parallel slices on tp "
       "repeat one mask.", ["override dropout_seed: vary over (dp)"], ["SC dropout_seed"], mirrors=SP_DROPOUT)
mutant("gather_replicated_zero1", "zero1",
       "ZeRO-1 params, replicated over dp, all-gathered over dp anyway (`params: gather over (dp)`): dp "
       "identical copies concatenated.", ["override params: gather over (dp)"], ["CR03"])

# loss terms: a term's path against the objective the model states once (docs/semantics.md, "Loss terms")
AUX_ACC = "the MoE aux loss without the accumulation normalisation (NVIDIA-NeMo/Automodel#3359)"
MTP_CP = "the MTP loss scaled by a microbatch count inflated by cp (NVIDIA/Megatron-LM#3959)"
MTP_LOCAL = "the MTP per-token loss normalised by local token counts (NVIDIA/Megatron-LM#7452)"
AUX = ["GI loss[aux] grads[router]", "GI loss[aux]"]
MTP = ["GI loss[mtp] grads[embedding]", "GI loss[mtp] grads[dense]", "GI loss[mtp]"]
mutant("aux_no_microbatch_divisor_ep", "ep",
       "the MoE auxiliary loss (one value per device and microbatch, averaged) divided by the data and expert "
       "sizes but not by the microbatches (`loss[aux]: divide by dp * ep`).",
       ["override loss[aux]: divide by dp * ep"], AUX, mirrors=AUX_ACC, model="moe_aux")
mutant("aux_token_mean_ep", "ep",
       "the MoE auxiliary loss, a value per device and microbatch, divided by the step's token count as a "
       "per-token loss (`loss[aux]: global_mean`).", ["override loss[aux]: global_mean"], AUX, model="moe_aux")
# a loss term on some ranks only (check.termranks)
TERM_RANKS = ("the MoE auxiliary loss added, or scaled, only where the main loss is formed (pytorch/torchtitan#3000, "
              "NVIDIA-NeMo/Automodel#1408)")
mutant("aux_on_dp_rank0_ep", "ep",
       "the MoE auxiliary loss added to the objective on the first data rank only (`if rank == 0: loss = loss + aux`, "
       "`loss[aux]: on_ranks over (dp) ranks (0)`): the other data ranks' contributions are dropped.",
       ["override loss[aux]: on_ranks over (dp) ranks (0)"], AUX, mirrors=TERM_RANKS, model="moe_aux")
mutant("aux_on_last_ep_rank_ep", "ep",
       "the MoE auxiliary loss added on the last expert rank only (`loss[aux]: on_ranks over (ep) ranks (ep - 1)`).",
       ["override loss[aux]: on_ranks over (ep) ranks (ep - 1)"], AUX, model="moe_aux")
mutant("aux_microbatch_divisor_on_rank0_ep", "ep",
       "the MoE auxiliary loss divided by the data and expert sizes on every rank and by the microbatches on "
       "rank 0 of (dp, ep) only (`loss[aux]: divide_on_ranks over (dp, ep) ranks (0) by 4`, the model's 4 microbatches).",
       ["override loss[aux]: divide by dp * ep", "override loss[aux]: divide_on_ranks over (dp, ep) ranks (0) by 4"],
       AUX, mirrors=TERM_RANKS, model="moe_aux")
mutant("aux_stats_per_microbatch_ep", "ep",
       "a global-batch load-balancing loss whose routing statistics are gathered over the data and expert ranks "
       "but taken microbatch by microbatch (`loss[aux]: stats_per_microbatch over (dp, ep)`).",
       ["override loss[aux]: stats_per_microbatch over (dp, ep)"], ["GI aux_stats"],
       mirrors="a batch-wise aux loss under gradient accumulation (pytorch/torchtitan#3000)", model="moe_aux_global")
mutant("aux_stats_local_ep", "ep",
       "a global-batch load-balancing loss computed from each rank's own microbatch (`loss[aux]: stats_per_microbatch "
       "over ()`).", ["override loss[aux]: stats_per_microbatch over ()"], ["GI aux_stats"], model="moe_aux_global")
mutant("aux_stats_over_dp_ep", "ep",
       "a per-microbatch load-balancing loss whose routing statistics are summed over the data ranks, balancing "
       "their union (`loss[aux]: stats_per_microbatch over (dp)`).",
       ["override loss[aux]: stats_per_microbatch over (dp)"], ["GI aux_stats"], model="moe_aux_micro")
mutant("aux_stats_pack_ep", "ep",
       "a sequence-wise load-balancing loss computed over the two packed sequences of a microbatch at once "
       "(`loss[aux]: stats_per_microbatch over ()`).", ["override loss[aux]: stats_per_microbatch over ()"],
       ["GI aux_stats"], mirrors="seq_aux_loss scoring a pack as one sequence (NVIDIA/Megatron-LM#5996)",
       model="moe_aux_seq2")
mutant("aux_stats_count_padding_ep", "ep",
       "a per-microbatch load-balancing loss computed from the router outputs of every position of the padded "
       "microbatch, padding included (`loss[aux]: stats_count_padding`).",
       ["override loss[aux]: stats_count_padding"], ["GI aux_stats"],
       mirrors="load_balancing_loss_func without the attention mask (huggingface/transformers#28505)",
       model="moe_aux_micro")
mutant("aux_probs_over_dp_ep", "ep",
       "a per-microbatch load-balancing loss whose mean router probabilities alone are all-reduced over the data "
       "ranks, the token counts kept per rank: the loss of the data ranks' union "
       "(`loss[aux]: probs_per_microbatch over (dp)`).",
       ["override loss[aux]: probs_per_microbatch over (dp)"], ["GI aux_stats"], model="moe_aux_micro")
mutant("aux_counts_per_microbatch_probs_local_ep", "ep",
       "a global-batch load-balancing loss whose token counts are all-reduced over the data and expert ranks "
       "microbatch by microbatch and whose probabilities stay each rank's own: no statistic spans the step's "
       "microbatches (`loss[aux]: stats_per_microbatch over (dp, ep)`, `probs_per_microbatch over ()`).",
       ["override loss[aux]: stats_per_microbatch over (dp, ep)", "override loss[aux]: probs_per_microbatch over ()"],
       ["GI aux_stats"], model="moe_aux_global")
for name, lines, why in [
    ("aux_counts_global_probs_local_padded_ep",
     ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: probs_per_sequence over ()"],
     "a global-batch load-balancing loss from global token counts times each rank's own mean probabilities per "
     "sequence, the cells' values averaged with equal weights"),
    ("aux_counts_per_microbatch_probs_per_step_padded_ep",
     ["override loss[aux]: stats_per_microbatch over (dp, ep)", "override loss[aux]: probs_per_step over ()"],
     "a global-batch load-balancing loss from token counts all-reduced per microbatch times each rank's mean "
     "probabilities over the step, the cells' values averaged with equal weights"),
]:
    mutant(name, "ep", why + ", on batches whose shards may hold unequal real-token counts (no `tokens: equal`): "
           "the mean of the cells' local factor is not the pooled one.", lines, ["GI aux_stats"],
           mirrors="global_aux_loss's local probabilities under the router's padding mask (NVIDIA/Megatron-LM#1561, "
           "#2121)", model="moe_aux_global")
mutant("aux_equal_microbatch_weights_ep", "ep",
       "a global-batch load-balancing loss whose counts are all-reduced over the data and expert ranks and "
       "accumulated over the step, each microbatch's fractions weighted equally whatever its real tokens "
       "(`loss[aux]: stats_equal_microbatch_weights`).",
       ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: stats_equal_microbatch_weights"],
       ["GI aux_stats"], mirrors="global_aux_loss's running counts over the current microbatch's tokens "
       "(NVIDIA/Megatron-LM#7197)", model="moe_aux_global")
mutant("aux_equal_rank_weights_ep", "ep",
       "a global-batch load-balancing loss whose data ranks' fractions are averaged with equal weights instead of "
       "their counts summed (`loss[aux]: stats_equal_cell_weights over (dp)`).",
       ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: stats_equal_cell_weights over (dp)"],
       ["GI aux_stats"], model="moe_aux_global")
mutant("aux_after_capacity_ep", "ep",
       "a sequence-wise load-balancing loss whose fractions are counted on the routing map after the capacity step, "
       "the dropped tokens missing (`loss[aux]: stats_after_capacity`).", ["override loss[aux]: stats_after_capacity"],
       ["GI aux_stats"], mirrors="seq_aux_loss on the capacity mask (NVIDIA/Megatron-LM#1513)", model="moe_aux_seq")
mutant("aux_capacity_padded_ep", "ep",
       "a per-microbatch load-balancing loss whose fractions are counted on the routing map padded to capacity "
       "(`loss[aux]: stats_capacity_padded`).", ["override loss[aux]: stats_capacity_padded"], ["GI aux_stats"],
       mirrors="seq_aux_loss with pad_to_capacity (NVIDIA/Megatron-LM#1617)", model="moe_aux_micro")
mutant("capacity_counts_padding_ep", "ep",
       "a dropping MoE layer (capacity factor 1, top-2 of 8) whose router runs without the padding mask before "
       "dispatch: the padded positions take expert slots by their scores and count in the capacity "
       "(`capacity: counts_padding`).", ["override capacity: counts_padding"], ["GI capacity"],
       mirrors="padding consuming expert capacity (NVIDIA/Megatron-LM#5542, marin-community/marin#8953)", model="moe")
mutant("capacity_counts_padding_aux_masked_ep", "ep",
       "padding masked in the load-balancing loss's statistics but not before the capacity step "
       "(`capacity: counts_padding` beside a per-microbatch aux_stats objective).", ["override capacity: counts_padding"],
       ["GI capacity"], mirrors="the aux-loss padding mask alone (NVIDIA/Megatron-LM#2121, then #5542)",
       model="moe_aux_micro")
# what the capacity step's dropped pairs add to the combine (check.encode_capdrop)
for name, model, line, what, mirrors in [
    ("capacity_dropped_weighted_ep", "moe", "dropped_weighted", "a dropping MoE layer whose combine buffer starts "
     "from the hidden states: a dropped pair adds its gate weight times the token", "huggingface/transformers#37017"),
    ("capacity_dropped_uninitialised_ep", "moe_drop_renorm", "dropped_uninitialised", "a dropping MoE layer whose "
     "unpermute buffer is allocated empty: a dropped pair's row keeps a stale value, weighted into the combine",
     "PrimeIntellect-ai/prime-rl#2035, AMD-AGI/Primus-Turbo#345"),
    ("capacity_renormalise_dropped_ep", "moe_drop_renorm", "renormalise_dropped", "the kept experts' gate weights "
     "divided by the sum over all k chosen, the dropped ones too, where the model renormalises over the kept",
     "no public report: the dropped weights in the denominator"),
    ("capacity_renormalise_kept_ep", "moe", "renormalise_kept", "the kept experts' gate weights renormalised after "
     "the capacity step where the model keeps them as the router gave them", "no public report"),
]:
    mutant(name, "ep", what + f" (`capacity: {line}`).", [f"override capacity: {line}"], ["GI capacity dropped"],
           mirrors=mirrors, model=model)
# the MoE router's top-k choice on the tensor ranks that hold the same tokens (check.router)
PARTIALS = "a nonlinear operation on per-rank partials (vllm-project/vllm-ascend#14345)"
for name, base_name, stmt, what, mirrors in [
    ("router_jitter_per_tp_rank_moe_3d", "moe_3d", "vary over (tp)", "a tensor-parallel MoE layer without sequence "
     "parallelism whose router jitter is drawn with a per-rank seed over tp: the tensor ranks route one token to "
     "different experts", "router jitter drawn per tensor rank (databricks/megablocks#118, pytorch/pytorch#103235)"),
    ("router_sampling_per_rank_moe_3d", "moe_3d", "vary over (dp, tp)", "the second expert sampled with noise seeded "
     "per data and tensor rank: the data ranks hold different tokens, the tensor ranks the same ones",
     "DeepSpeed's sampled second expert (deepspeedai/Megatron-DeepSpeed#362)"),
    ("router_input_partial_moe_3d", "moe_3d", "input_partial over (tp)", "a router reading the row-parallel "
     "linear's partial sums over tp, before their all-reduce", PARTIALS),
    ("router_input_partial_sp_moe_etp", "moe_etp", "input_partial over (tp)", "under sequence parallelism, a router "
     "reading the partial sums before their reduce-scatter: each rank scores its summand of its own tokens", PARTIALS),
]:
    mutant(name, base_name, f"{what} (`router: {stmt}`).", [f"override router: {stmt}"], ["GI router"],
           mirrors=mirrors)
mutant("aux_expert_ranks_not_averaged_ep", "ep",
       "the MoE auxiliary loss averaged over dp and the microbatches only: the expert ranks' values, each from "
       "its own tokens, are summed (`loss[aux]: divide by dp * 4`).",
       ["override loss[aux]: divide by dp * 4"], AUX, model="moe_aux")
mutant("mtp_tokens_over_tp", "tp",
       "the MTP loss's token count summed over tp as well as dp (`tokens[mtp]: reduce over (dp, tp)`): every tp "
       "rank counts the same tokens, so the count is tp times too large.",
       ["override tokens[mtp]: reduce over (dp, tp)"], MTP, model="dense_mtp")
mutant("mtp_tokens_dp_only_cp", "cp",
       "the MTP loss's token count summed over dp only under context parallelism (`tokens[mtp]: reduce over "
       "(dp)`): each cp rank counts its slice.", ["override tokens[mtp]: reduce over (dp)"], MTP,
       mirrors=CP_TOKENS, model="dense_mtp")
mutant("mtp_local_token_means_ddp", "ddp",
       "the MTP loss, per token over the global batch, normalised by each microbatch's local token count "
       "(`loss[mtp]: per_microbatch_mean`).", ["override loss[mtp]: per_microbatch_mean"], MTP,
       mirrors=MTP_LOCAL, model="plain_mtp")
mutant("mtp_extra_cp_divisor_cp", "cp",
       "the MTP loss, per token over the global batch, divided by cp as well as the step's token count "
       "(`loss[mtp]: divide by cp`).", ["override loss[mtp]: divide by cp"], MTP, mirrors=MTP_CP,
       model="dense_mtp")

# how the ranks' squared norms are combined: an average or a max over shards, a root taken before the sum
CLIP_MAX = "a sharded optimizer's partition norms combined by max (facebookresearch/fairscale#167)"
CLIP_ROOT = "expert norms all-reduced as norms, not squares (laekov/fastmoe#65)"
mutant("clip_max_zero2", "zero2",
       "the ranks' squared norms of their gradient shards combined by max over dp (`clip_norm: max over (dp)`).",
       ["override clip_norm: max over (dp)"], ["SC clip_norm"], mirrors=CLIP_MAX)
mutant("clip_average_fsdp", "fsdp",
       "the ranks' squared norms of their gradient shards averaged over dp (`clip_norm: average over (dp)`, an "
       "all-reduce with AVG): 1/dp of the global value.", ["override clip_norm: average over (dp)"], ["SC clip_norm"])
mutant("clip_sqrt_before_reduce_tp", "tp",
       "each rank's norm (the root of its squared norm) all-reduced over tp and squared after "
       "(`clip_norm: sqrt_before_reduce`): the tp shards' roots are added.",
       ["override clip_norm: sqrt_before_reduce"], ["SC clip_norm"])
mutant("clip_sqrt_before_reduce_experts_ep", "ep",
       "the experts' norm, not its square, summed over the expert-parallel group "
       "(`clip_norm[experts]: sqrt_before_reduce`).", ["override clip_norm[experts]: sqrt_before_reduce"],
       ["SC clip_norm"], mirrors=CLIP_ROOT)

# K >= 2 kv heads copied over the tensor ranks: the norm counts each head once (check.kvnorm)
KV_MARKED = ("copied K/V weights marked tensor-parallel, so the duplicate filter counts every copy "
             "(InternLM/InternEvo#349 copies kv heads; ROCm/TransformerEngine#715)")
KV_RANK0 = "copied K/V weights left unmarked, counted on tp rank 0 only (ROCm/TransformerEngine#715, NVIDIA/Megatron-LM#7452)"
KV_SHARD = "copied K/V weights reduced as shards over the tensor mesh (huggingface/transformers#47811, #46113)"
mutant("kv_copies_counted_gqa_tp", "gqa_tp",
       "the duplicate filter takes the copied kv heads for tensor-parallel shards (`clip_norm[kv]: count_copies over "
       "(tp)`): each head counted tp/2 times.", ["override clip_norm[kv]: count_copies over (tp)"], ["SC clip_norm"],
       mirrors=KV_MARKED)
mutant("kv_copies_rank0_gqa_tp", "gqa_tp",
       "the copied kv heads counted on tp rank 0 only (`clip_norm[kv]: rank0_only over (tp)`): the other head is "
       "dropped from the norm.", ["override clip_norm[kv]: rank0_only over (tp)"], ["SC clip_norm"], mirrors=KV_RANK0)
mutant("kv_copies_filter_skips_kv_gqa_tp", "gqa_tp",
       "a written sum over tp filtering the layer norms and biases but not the copied kv heads.",
       ["override clip_norm: reduce over (tp)", "override clip_norm[norms]: dedupe over (tp)",
        "override clip_norm[biases]: dedupe over (tp)"], ["SC clip_norm"], mirrors=KV_SHARD)

# K >= 2 kv heads copied over a product of tensor axes: each copy group a run of the joint index (check.kvproduct)
KV_UNSUMMED = ("copied K/V weights whose gradients are never summed over the tensor group "
               "(bigcode-project/Megatron-LM#37, NVIDIA-NeMo/RL#3716)")
KV_LOCAL = "a K/V replication group built from one mesh dimension, not the flattened tensor mesh (huggingface/transformers#47811)"
KV_WHOLE = "copied K/V weights all-reduced over the whole tensor group like replicated weights (NVIDIA-NeMo/Automodel#3822)"
mutant("kv_copies_not_summed_gqa_tp2", "gqa_tp2",
       "the copied kv heads' gradients reduced over dp only (`grads[kv]: reduce over (dp)`): each copy keeps the part "
       "from its rank's query heads.", ["override grads[kv]: reduce over (dp)"],
       gi(["kv"], "over tp copy groups") + ["GI grads[kv] over tl copy groups", "SC grads[kv]", "CR02"],
       mirrors=KV_UNSUMMED)
mutant("kv_copies_group_one_axis_gqa_tp2", "gqa_tp2",
       "the copy groups' sum taken over tl alone (`grads[kv]: reduce over (dp, tl)`): each group also spans 2 tp ranks, "
       "whose parts never meet.", ["override grads[kv]: reduce over (dp, tl)"],
       gi(["kv"], "over tp copy groups") + ["SC grads[kv]", "CR02"], mirrors=KV_LOCAL)
mutant("kv_copies_whole_group_gqa_tp2", "gqa_tp2",
       "the copied kv heads all-reduced over the whole tensor group (`grads[kv]: reduce over (dp, tp, tl)`): the two "
       "heads' gradients added.", ["override grads[kv]: reduce over (dp, tp, tl)"],
       gi(["kv"], "over tp") + ["CR02"], mirrors=KV_WHOLE)
mutant("kv_copies_counted_gqa_tp2", "gqa_tp2",
       "every copy of the kv heads counted in the norm (`clip_norm[kv]: count_copies over (tp, tl)`): each head 4 "
       "times.", ["override clip_norm[kv]: count_copies over (tp, tl)"], ["SC clip_norm"], mirrors=KV_MARKED)

# copy groups crossing the tensor axes' blocks: runs of 6 of the 12 joint ranks of tp = 3 x tl = 4 (check.kvjoint)
mutant("kv_joint_not_summed_gqa_tp3x4", "gqa_tp3x4",
       "the copied kv heads' gradients reduced over dp only (`grads[kv]: reduce over (dp)`): each copy keeps the part "
       "from its rank's query heads.", ["override grads[kv]: reduce over (dp)"],
       gi(["kv"], "over tp×tl copy groups") + ["SC grads[kv]", "CR02"], mirrors=KV_UNSUMMED)
mutant("kv_joint_group_one_axis_gqa_tp3x4", "gqa_tp3x4",
       "the copy groups' sum taken over tl alone (`grads[kv]: reduce over (dp, tl)`): tl rank 1's host holds copies of "
       "both heads, whose gradients are added.", ["override grads[kv]: reduce over (dp, tl)"],
       gi(["kv"], "over tp×tl") + ["CR02"], mirrors=KV_LOCAL)
mutant("kv_joint_counted_gqa_tp3x4", "gqa_tp3x4",
       "every copy of the kv heads counted in the norm (`clip_norm[kv]: count_copies over (tp, tl)`): each head 6 "
       "times.", ["override clip_norm[kv]: count_copies over (tp, tl)"], ["SC clip_norm"], mirrors=KV_MARKED)

# per-rank ownership in the norm; the token count clamped before its reduction (a partial value)
SINKS = "attention sinks not marked tensor-parallel, counted on tp rank 0 (NVIDIA/Megatron-LM#7452, #7530)"
EXPERT_TP = "expert weights split over tp counted on tp rank 0 only (NVIDIA/Megatron-LM#5916)"
CLAMP = "a token count clamped to >= 1 per piece before its sum (radixark/miles#2796, redai-studio/Relax#205)"
mutant("clip_rank0_dense_tp", "tp",
       "the dense weights, sharded over tp, counted in the norm on tp rank 0 only (`clip_norm[dense]: rank0_only "
       "over (tp)`): the other tp shards are missing.", ["override clip_norm[dense]: rank0_only over (tp)"],
       ["SC clip_norm"], mirrors=SINKS)
mutant("clip_rank0_experts_moe_3d", "moe_3d",
       "the experts' tp slices counted in the norm on tp rank 0 only (`clip_norm[experts]: rank0_only over (tp)`).",
       ["override clip_norm[experts]: rank0_only over (tp)"], ["SC clip_norm"], mirrors=EXPERT_TP)
mutant("clip_rank0_zero2_dp", "zero2",
       "every group's dp shard counted in the norm on dp rank 0 only under ZeRO-2 (`clip_norm: rank0_only over "
       "(dp)`).", ["override clip_norm: rank0_only over (dp)"], ["SC clip_norm"])
# a group's squared norm counted on a set of one axis's ranks (check.rankcount)
SHARED = "a tied embedding counted on the first and the last stage (NVIDIA/Megatron-LM#7227, #7228)"
OWN_RANK = "every rank reading rank 0 for itself in the duplicate filter (NVIDIA/Megatron-LM#7359)"
ETP_OWNER = "expert gradients filtered with the dense tensor group's rank (NVIDIA/Megatron-LM#6470)"
mutant("count_ranks_tied_first_last_1f1b", "1f1b",
       "the tied embedding counted in the norm on the first and the last pipeline stage (`clip_norm[embedding]: "
       "count_on_ranks over (pp) ranks (0, pp - 1)`): two copies from pp = 2 on.",
       ["override clip_norm[embedding]: count_on_ranks over (pp) ranks (0, pp - 1)"], ["SC clip_norm"], mirrors=SHARED)
mutant("count_ranks_norms_every_rank_tp", "tp",
       "the layer norms, whole on every tp rank, counted on tp ranks 0-7 beside a written sum over tp "
       "(`clip_norm[norms]: count_on_ranks over (tp) ranks (0, 1, 2, 3, 4, 5, 6, 7)`): a copy per named rank.",
       ["override clip_norm[norms]: reduce over (tp)",
        "override clip_norm[norms]: count_on_ranks over (tp) ranks (0, 1, 2, 3, 4, 5, 6, 7)"], ["SC clip_norm"],
       mirrors=OWN_RANK)
mutant("count_ranks_experts_rank0_ep", "ep",
       "the experts, split over ep, counted in the norm on ep rank 0 only (`clip_norm[experts]: count_on_ranks over "
       "(ep) ranks (0)`): the other ranks' experts are dropped.",
       ["override clip_norm[experts]: count_on_ranks over (ep) ranks (0)"], ["SC clip_norm"], mirrors=ETP_OWNER)
mutant("count_ranks_dense_last_ranks_tp", "tp",
       "the dense weights, sharded over tp, counted on tp ranks 1 and tp - 1 only (`clip_norm[dense]: count_on_ranks "
       "over (tp) ranks (1, tp - 1)`): rank 0's shard is dropped, and from tp = 4 on the middle ranks' too.",
       ["override clip_norm[dense]: count_on_ranks over (tp) ranks (1, tp - 1)"], ["SC clip_norm"])
# ... on a rank set of the process group over several axes (check.encode_rankcount_multi): each piece once
MANY_COUNTS = ("replicated weights counted on every rank of a grid of axes (NVIDIA-NeMo/RL#3788, "
               "ROCm/TransformerEngine#715, NVIDIA/Megatron-LM#7359)")
mutant("count_ranks_norms_two_ranks_dp_tp", "tp",
       "the layer norms, whole on every rank, counted on ranks 0 and 1 of the (dp, tp) group beside a written sum "
       "over both (`clip_norm[norms]: count_on_ranks over (dp, tp) ranks (0, 1)`): two copies.",
       ["override clip_norm[norms]: reduce over (dp, tp)",
        "override clip_norm[norms]: count_on_ranks over (dp, tp) ranks (0, 1)"], ["SC clip_norm"], mirrors=MANY_COUNTS)
mutant("count_ranks_dense_rank0_dp_tp", "tp",
       "the dense weights, sharded over tp, counted on rank 0 of the (dp, tp) group only (`clip_norm[dense]: "
       "count_on_ranks over (dp, tp) ranks (0)`): the other tp ranks' shards are dropped.",
       ["override clip_norm[dense]: reduce over (dp, tp)",
        "override clip_norm[dense]: count_on_ranks over (dp, tp) ranks (0)"], ["SC clip_norm"])
mutant("count_ranks_dense_diagonal_dp_tp", "tp",
       "the dense weights counted on ranks 0, tp + 1 and 2 * tp + 2 of the (dp, tp) group (`clip_norm[dense]: "
       "count_on_ranks over (dp, tp) ranks (0, tp + 1, 2 * tp + 2)`): tp shards 0, 1, 2 once each, the others "
       "dropped.", ["override clip_norm[dense]: reduce over (dp, tp)",
                    "override clip_norm[dense]: count_on_ranks over (dp, tp) ranks (0, tp + 1, 2 * tp + 2)"],
       ["SC clip_norm"], mirrors=MANY_COUNTS)
mutant("tokens_clamped_ddp", "ddp",
       "each microbatch's token count clamped to >= 1 on its rank before the sum over microbatches and the "
       "all-reduce over dp (`tokens: clamp_before_reduce`).", ["override tokens: clamp_before_reduce"],
       gi(["dense", "norms", "biases", "embedding"], "normalisation"), mirrors=CLAMP)
mutant("tokens_clamped_cp", "cp",
       "each context rank's token count clamped to >= 1 before the all-reduce over dp and cp "
       "(`tokens: clamp_before_reduce`).", ["override tokens: clamp_before_reduce"],
       gi(["dense", "norms", "biases", "embedding"], "normalisation"), mirrors=CLAMP)
EPS = "an epsilon added to each piece's token count before its sum (vllm-project/speculators#942)"
mutant("tokens_eps_ddp", "ddp",
       "each microbatch's token count plus an epsilon on its rank before the sum over microbatches and the "
       "all-reduce over dp (`tokens: eps_before_reduce by 1e-6`): T + P·ε, not T + ε.",
       ["override tokens: eps_before_reduce by 1e-6"],
       gi(["dense", "norms", "biases", "embedding"], "normalisation"), mirrors=EPS)
mutant("tokens_eps_cp", "cp",
       "each context rank's token count plus an epsilon before the all-reduce over dp and cp "
       "(`tokens: eps_before_reduce by 1e-8`).", ["override tokens: eps_before_reduce by 1e-8"],
       gi(["dense", "norms", "biases", "embedding"], "normalisation"), mirrors=EPS)

# per-rank operations on the update and the loss scale; an epsilon on each rank's squared norm (check.rankupdate)
SCALERS = "per-module loss scalers updated before the world-wide found-inf consensus (NVIDIA-NeMo/Megatron-Bridge#5591)"
ALL4 = ["dense", "norms", "biases", "embedding"]
mutant("update_clip_rank0_ddp", "ddp",
       "the clip coefficient applied on dp rank 0 only (`grads: clip_rank0_only over (dp)`): the other replicas "
       "step with the unclipped gradient.", ["override grads: clip_rank0_only over (dp)"],
       [f"SC update[{g}]" for g in ALL4])
mutant("update_divide_rank0_tp", "tp",
       "the dense gradient divided by 2 on tp rank 0 only (`grads[dense]: divide_rank0_only over (tp) by 2`): the "
       "other tp shards are stepped undivided.", ["override grads[dense]: divide_rank0_only over (tp) by 2"],
       ["SC update[dense]"])
STAGE_SCALED = "gradient accumulation scaling applied again at every earlier pipeline stage (deepspeedai/DeepSpeed#8152)"
mutant("update_divide_rank0_pp", "1f1b",
       "the first pipeline stage dividing its gradient by the microbatches again (`grads: divide_rank0_only over "
       "(pp) by 4`): the stages' gradients are scaled unlike one another.",
       ["override grads: divide_rank0_only over (pp) by 4"], [f"SC update[{g}]" for g in ALL4], mirrors=STAGE_SCALED)
# a divisor or a clip on ranks of the process group over two axes (check.rankset: the first axis most significant)
SCALER = "a GradScaler scale that differs across processes (pytorch/pytorch#136009)"
mutant("update_divide_global_ranks_pp", "1f1b",
       "a division again on global ranks 0 and 1 of the (pp, dp) topology (`grads: divide_on_ranks over (pp, dp) "
       "ranks (0, 1) by 4`: two replicas of stage 0 at dp = 8, stages 0 and 1 at dp = 1).",
       ["override grads: divide_on_ranks over (pp, dp) ranks (0, 1) by 4"],
       [f"SC update[{g}]" for g in ALL4], mirrors=STAGE_SCALED)
mutant("update_divide_last_process_tp", "tp",
       "the last process of a (dp, tp) mesh unscaling by half the others' loss scale (`grads: divide_on_ranks over "
       "(dp, tp) ranks (dp * tp - 1) by 1 / 2`).",
       ["override grads: divide_on_ranks over (dp, tp) ranks (dp * tp - 1) by 1 / 2"],
       [f"SC update[{g}]" for g in ALL4], mirrors=SCALER)
# two or more divisors on sets of one axis's ranks: each rank applies their product (check.encode_rankproduct)
mutant("update_divisor_product_pp", "1f1b",
       "every stage but the last dividing by 4 and stage 0 by 4 again (`grads: divide_except_last over (pp) by 4` "
       "and `divide_on_ranks over (pp) ranks (0) by 4`): products 16, 4, ..., 1 along the pipeline.",
       ["override grads: divide_except_last over (pp) by 4", "override grads: divide_on_ranks over (pp) ranks (0) by 4"],
       [f"SC update[{g}]" for g in ALL4], mirrors=STAGE_SCALED)
mutant("update_divisor_product_ddp", "ddp",
       "the last two dp ranks unscaling by half the scale and the last by half again (`grads: divide_on_ranks over "
       "(dp) ranks (dp - 2, dp - 1) by 1 / 2` and `divide_last_only over (dp) by 1 / 2`).",
       ["override grads: divide_on_ranks over (dp) ranks (dp - 2, dp - 1) by 1 / 2",
        "override grads: divide_last_only over (dp) by 1 / 2"], [f"SC update[{g}]" for g in ALL4], mirrors=SCALER)
# divisors on sets of ranks of different axes: each device applies their product (check.encode_rankproduct_axes)
mutant("update_divisors_pp_and_dp", "1f1b",
       "every stage but the last dividing by 4 and the last dp rank by 2 (`grads: divide_except_last over (pp) by 4` "
       "and `divide_last_only over (dp) by 2`): products 8, 4, 2 and 1 over the (pp, dp) grid.",
       ["override grads: divide_except_last over (pp) by 4", "override grads: divide_last_only over (dp) by 2"],
       [f"SC update[{g}]" for g in ALL4], mirrors=STAGE_SCALED)
mutant("update_divisors_cancel_off_the_corner_1f1b", "1f1b",
       "process 0 of the (dp, pp) group dividing by 2 and pipeline rank 0 multiplying by 2 (`grads: divide_on_ranks "
       "over (dp, pp) ranks (0) by 2` and `divide_rank0_only over (pp) by 1 / 2`): they cancel on device (0, 0) "
       "only, the other replicas of stage 0 multiplied.",
       ["override grads: divide_on_ranks over (dp, pp) ranks (0) by 2",
        "override grads: divide_rank0_only over (pp) by 1 / 2"], [f"SC update[{g}]" for g in ALL4])
# a reduction over blocks of an axis's ranks; divisors on every rank but the last or the last only (check.subgroups)
NODE_GROUP = "the data-parallel gradient sync given the in-node group (laekov/fastmoe#105, #106)"
MP_BLOCKS = "expert norms all-reduced over the model-parallel blocks, not every expert rank (laekov/fastmoe#169)"
mutant("grads_blocks_ddp", "ddp",
       "the gradients all-reduced within blocks of 4 consecutive dp ranks (`grads: reduce_blocks over (dp) by 4`, "
       "one process group per node): each block holds a partial sum of its own.",
       ["override grads: reduce_blocks over (dp) by 4"], [f"GI grads[{g}] blocks" for g in ALL4], mirrors=NODE_GROUP)
mutant("clip_blocks_zero2", "zero2",
       "the squared norms of the dp shards summed within blocks of 2 consecutive dp ranks (`clip_norm: "
       "reduce_blocks over (dp) by 2`): each block's norm misses the others' shards.",
       ["override clip_norm: reduce_blocks over (dp) by 2"], ["SC clip_norm"], mirrors=MP_BLOCKS)
PERPENDICULAR = "the dense gradient sync given the perpendicular (strided) group (laekov/fastmoe#105, #106)"
EXPERT_DATA = "non-MoE gradients all-reduced over the strided expert-data-parallel group (deepspeedai/DeepSpeed#1838)"
FIRST_GROUP = "a reduction only the first group performs (pytorch/pytorch#10003, allenai/OLMo#551)"
mutant("grads_strided_ddp", "ddp",
       "the gradients all-reduced within strided groups of dp ranks r, r+2, r+4 ... (`grads: reduce_strided over "
       "(dp) by 2`, groups built with another axis's stride): each group holds a partial sum of its own.",
       ["override grads: reduce_strided over (dp) by 2"], [f"GI grads[{g}] blocks" for g in ALL4],
       mirrors=PERPENDICULAR)
mutant("grads_strided_norms_hsdp", "hsdp",
       "the norms' gradient all-reduce over the nodes run in strided groups of stride 2 (`grads[norms]: "
       "reduce_strided over (nodes) by 2`): nodes 0 and 2, 1 and 3 hold different sums; the other groups reduce "
       "over every node.", ["override grads[norms]: reduce_strided over (nodes) by 2"], ["GI grads[norms] blocks"],
       mirrors=EXPERT_DATA)
mutant("grads_first_ddp", "ddp",
       "the gradients all-reduced over the first 2 dp ranks only (`grads: reduce_first over (dp) by 2`): the "
       "other ranks reduce nothing and step with their own contribution.",
       ["override grads: reduce_first over (dp) by 2"], [f"GI grads[{g}] blocks" for g in ALL4], mirrors=FIRST_GROUP)
mutant("clip_strided_zero2", "zero2",
       "the squared norms of the dp shards summed within strided groups of stride 2 (`clip_norm: reduce_strided "
       "over (dp) by 2`): each group's norm misses the other groups' shards.",
       ["override clip_norm: reduce_strided over (dp) by 2"], ["SC clip_norm"], mirrors=EXPERT_DATA)
mutant("clip_first_zero2", "zero2",
       "the squared norms of the dp shards summed over the first 2 dp ranks only (`clip_norm: reduce_first over "
       "(dp) by 2`): every other rank clips by its own shard's norm.",
       ["override clip_norm: reduce_first over (dp) by 2"], ["SC clip_norm"], mirrors=FIRST_GROUP)
# consecutive groups of unequal sizes (check.subgroups: reduce_groups)
UNEQUAL_NODES = ("a per-node group on nodes of unequal GPU counts (huggingface/accelerate#2780, "
                 "Oneflow-Inc/oneflow#5119, deepspeedai/DeepSpeedExamples#575)")
mutant("grads_groups_ddp", "ddp",
       "the gradients all-reduced within consecutive groups of 5 and 3 dp ranks (`grads: reduce_groups over (dp) by "
       "(5, 3)`, a process group per node on nodes of 5 and 3 GPUs): each group holds a partial sum of its own.",
       ["override grads: reduce_groups over (dp) by (5, 3)"], [f"GI grads[{g}] blocks" for g in ALL4],
       mirrors=UNEQUAL_NODES)
mutant("grads_groups_norms_ddp", "ddp",
       "the norms' gradient all-reduced within consecutive groups of 1, 3 and 4 dp ranks (`grads[norms]: "
       "reduce_groups over (dp) by (1, 3, 4)`): the other groups reduce over every rank.",
       ["override grads[norms]: reduce_groups over (dp) by (1, 3, 4)"], ["GI grads[norms] blocks"],
       mirrors=UNEQUAL_NODES)
mutant("clip_groups_zero2", "zero2",
       "the squared norms of the dp shards summed within consecutive groups of 6 and 2 dp ranks (`clip_norm: "
       "reduce_groups over (dp) by (6, 2)`): each group's norm misses the other group's shards.",
       ["override clip_norm: reduce_groups over (dp) by (6, 2)"], ["SC clip_norm"], mirrors=UNEQUAL_NODES)
# process groups given by a list of rank sets, one new_group per set (check.subgroups: reduce_sets): two sets or
# more are a defect at the axis's size, and one set is a no-op (PL506), so none has an equivalent
RANK_SETS = ("process groups given by a list of rank sets (verl-project/verl#7493, deepspeedai/DeepSpeed#3521, "
             "ml-explore/mlx#4283)")
mutant("grads_sets_ddp", "ddp",
       "the gradients all-reduced within the rank sets [0, 2, 4, 5] and [1, 3, 6, 7] of dp (`grads: reduce_sets "
       "over (dp) ranks ([0, 2, 4, 5], [1, 3, 6, 7])`, two hand-written new_group lists): each set holds a partial "
       "sum of its own.", ["override grads: reduce_sets over (dp) ranks ([0, 2, 4, 5], [1, 3, 6, 7])"],
       [f"GI grads[{g}] blocks" for g in ALL4], mirrors=RANK_SETS)
mutant("grads_sets_norms_ddp", "ddp",
       "the norms' gradient all-reduced within the rank sets [7] and [6, 0, 1, 2, 3, 4, 5] (`grads[norms]: "
       "reduce_sets over (dp) ranks ([7], [6, 0, 1, 2, 3, 4, 5])`): rank 7 keeps its own; the other groups reduce "
       "over every rank.", ["override grads[norms]: reduce_sets over (dp) ranks ([7], [6, 0, 1, 2, 3, 4, 5])"],
       ["GI grads[norms] blocks"], mirrors=RANK_SETS)
mutant("clip_sets_zero2", "zero2",
       "the squared norms of the dp shards summed within the rank sets [0, 3, 5] and [1, 2, 4, 6, 7] (`clip_norm: "
       "reduce_sets over (dp) ranks ([0, 3, 5], [1, 2, 4, 6, 7])`): each set's norm misses the other's shards.",
       ["override clip_norm: reduce_sets over (dp) ranks ([0, 3, 5], [1, 2, 4, 6, 7])"], ["SC clip_norm"],
       mirrors=RANK_SETS)
# rank sets over several axes (check.encode_ranksets): the flattened ranks of (dp, tp), row-major; every set must
# be a derived reduction group (the dense gradient's: one tensor shard on every dp rank)
TP_GROUPS = ", ".join("[" + ", ".join(str(8 * d + t) for t in range(8)) + "]" for d in range(8))
DP_GROUPS = ", ".join("[" + ", ".join(str(8 * d + t) for d in range(8)) + "]" for t in range(8))
SETS_AXES = ("data parallel groups listed by hand over a data x model parallel grid (facebookresearch/fairscale#1189, "
             "laekov/fastmoe#106)")
mutant("grads_sets_axes_tp", "tp",
       "the dense gradient all-reduced within the tensor parallel groups listed as the data parallel ones (`grads"
       "[dense]: reduce_sets over (dp, tp) ranks ([0 .. 7], [8 .. 15], ...)`): each set sums the eight shards of "
       "one replica and never meets another replica.", [f"override grads[dense]: reduce_sets over (dp, tp) ranks "
                                                        f"({TP_GROUPS})"], ["GI grads[dense] blocks"],
       mirrors=SETS_AXES)
# the grad norm's all-reduce within rank sets over several axes (check.encode_normsets): the flattened ranks of
# (nodes, gpus) of the HSDP base, node-major; every set must count each gpu shard's squared norm once
HSDP_WORLD = ", ".join(str(r) for r in range(32))
HSDP_REPLICAS = ", ".join("[" + ", ".join(str(8 * n + g) for n in range(4)) + "]" for g in range(8))
HSDP_NORM = "an HSDP grad norm all-reduced over the wrong group of the (replicate, shard) mesh (ByteDance-Seed/VeOmni#184)"
mutant("clip_sets_axes_world_hsdp", "hsdp",
       "the squared norms all-reduced over the whole (nodes, gpus) group (`clip_norm: reduce_sets over (nodes, gpus) "
       "ranks ([0 .. 31])`): every gpu shard's squared norm is counted once per node, four times.",
       [f"override clip_norm: reduce_sets over (nodes, gpus) ranks ([{HSDP_WORLD}])"], ["SC clip_norm"],
       mirrors=HSDP_NORM)
mutant("clip_sets_axes_replicas_hsdp", "hsdp",
       "the squared norms all-reduced within the replicate groups listed by hand (`clip_norm: reduce_sets over "
       "(nodes, gpus) ranks ([0, 8, 16, 24], ...)`): each set sums the four copies of one shard and misses the "
       "others.", [f"override clip_norm: reduce_sets over (nodes, gpus) ranks ({HSDP_REPLICAS})"], ["SC clip_norm"],
       mirrors=HSDP_NORM)
mutant("update_divide_except_last_pp", "1f1b",
       "every pipeline stage but the last dividing its gradient by the microbatches again (`grads: "
       "divide_except_last over (pp) by 4`).", ["override grads: divide_except_last over (pp) by 4"],
       [f"SC update[{g}]" for g in ALL4], mirrors=STAGE_SCALED)
mutant("update_divide_last_only_pp", "1f1b",
       "the last pipeline stage alone dividing its gradient by 4 (`grads: divide_last_only over (pp) by 4`).",
       ["override grads: divide_last_only over (pp) by 4"], [f"SC update[{g}]" for g in ALL4])
# a clip or a divisor on any set of one axis's ranks (check.rankset): each a defect at some size of the axis, so
# none has an equivalent; ranks (0) and ranks (pp - 1) are the rank-0 and last-rank verbs' mutants restated
SCALER_RANKS = "each process unscaling by its own GradScaler scale after DDP's all-reduce (pytorch/pytorch#136009)"
mutant("update_divide_on_ranks_pp", "1f1b",
       "pipeline stages 0 and 1 dividing their gradient by the microbatches again (`grads: divide_on_ranks over "
       "(pp) ranks (0, 1) by 4`): with 3 or more stages the stages' gradients are scaled unlike one another.",
       ["override grads: divide_on_ranks over (pp) ranks (0, 1) by 4"], [f"SC update[{g}]" for g in ALL4],
       mirrors=STAGE_SCALED)
mutant("update_divide_on_ranks_last_pp", "1f1b",
       "the last pipeline stage alone dividing its gradient by 4, named by its index (`grads: divide_on_ranks over "
       "(pp) ranks (pp - 1) by 4`): the mutant of `divide_last_only` restated.",
       ["override grads: divide_on_ranks over (pp) ranks (pp - 1) by 4"], [f"SC update[{g}]" for g in ALL4])
mutant("update_divide_on_ranks_ddp", "ddp",
       "dp ranks 4 to 7 unscaling by half the others' loss scale (`grads: divide_on_ranks over (dp) ranks (4, 5, 6, "
       "7) by 1 / 2`): their replicas step twice as far.", ["override grads: divide_on_ranks over (dp) ranks (4, 5, 6, 7) by 1 / 2"],
       [f"SC update[{g}]" for g in ALL4], mirrors=SCALER_RANKS)
mutant("update_clip_on_ranks_tp", "tp",
       "the clip coefficient applied to the dense gradient on tp ranks 1 and 3 only (`grads[dense]: clip_on_ranks "
       "over (tp) ranks (1, 3)`): the other tp shards are stepped unclipped.",
       ["override grads[dense]: clip_on_ranks over (tp) ranks (1, 3)"], ["SC update[dense]"])
mutant("grads_two_kinds_hsdp", "hsdp",
       "the gradient reduced within blocks of 4 GPUs and within strided groups of nodes (`grads: reduce_blocks over "
       "(gpus) by 4`, `grads: reduce_strided over (nodes) by 2`): one reduction in two kinds of group, neither "
       "holding the mesh.", ["override grads: reduce_blocks over (gpus) by 4",
                              "override grads: reduce_strided over (nodes) by 2"],
       [f"GI grads[{g}] blocks" for g in ALL4] + [f"GI grads[{g}]" for g in ALL4])
mutant("grads_first_nodes_and_gpu_sets_hsdp", "hsdp",
       "the gradient's all-reduce across nodes on the first 2 nodes only and within a node on the rank sets [0, 2, 4, "
       "6] and [1, 3, 5, 7] (`grads: reduce_first over (nodes) by 2`, `grads: reduce_sets over (gpus) ranks (...)`).",
       ["override grads: reduce_first over (nodes) by 2",
        "override grads: reduce_sets over (gpus) ranks ([0, 2, 4, 6], [1, 3, 5, 7])"],
       [f"GI grads[{g}] blocks" for g in ALL4] + [f"GI grads[{g}]" for g in ALL4])
mutant("update_clip_twice_pp", "1f1b",
       "the clip applied in two code paths, the first stage's (`grads: clip_rank0_only over (pp)`) and the last "
       "stage's (`grads: clip_on_ranks over (pp) ranks (pp - 1)`): one stage clips twice at pp = 1, a middle stage "
       "never at pp >= 3 (each device clips once per statement naming it).",
       ["override grads: clip_rank0_only over (pp)", "override grads: clip_on_ranks over (pp) ranks (pp - 1)"],
       [f"SC update[{g}]" for g in ALL4])
mutant("update_clip_rank0_tp_and_dp", "tp",
       "the clip put back by hand on tensor rank 0 and again on data rank 0 (`grads: clip_rank0_only over (tp)`, "
       "`grads: clip_rank0_only over (dp)`): device (dp 0, tp 0) clips twice, (dp 1, tp 1) never.",
       ["override grads: clip_rank0_only over (tp)", "override grads: clip_rank0_only over (dp)"],
       [f"SC update[{g}]" for g in ALL4])
mutant("update_clip_same_ranks_twice_ddp", "ddp",
       "the same clip stated twice for the dense gradient on dp ranks 0 to 7 (`grads[dense]: clip_on_ranks over (dp) "
       "ranks (0, 1, 2, 3, 4, 5, 6, 7)`, twice): every named rank applies the coefficient twice.",
       ["override grads[dense]: clip_on_ranks over (dp) ranks (0, 1, 2, 3, 4, 5, 6, 7)",
        "override grads[dense]: clip_on_ranks over (dp) ranks (0, 1, 2, 3, 4, 5, 6, 7)"], ["SC update[dense]"])
mutant("clip_eps_tp", "tp",
       "each rank's squared norm plus an epsilon before the all-reduce over tp (`clip_norm: eps_before_reduce by "
       "1e-6`): S + tp·ε, not S + ε.", ["override clip_norm: eps_before_reduce by 1e-6"], ["SC clip_norm"])
mutant("clip_eps_on_two_ranks_tp", "tp",
       "an epsilon added to the squared norm on tensor ranks 0 and 1 before the all-reduce over tp (`clip_norm: "
       "eps_on_ranks over (tp) ranks (0, 1) by 1e-6`): S + 2·ε, not S + ε.",
       ["override clip_norm: eps_on_ranks over (tp) ranks (0, 1) by 1e-6"], ["SC clip_norm"])
mutant("clip_eps_on_tp_rank0_3d", "3d",
       "an epsilon added to the squared norm on tensor rank 0 of every pipeline stage before the norm's all-reduce "
       "over tp and pp (`clip_norm: eps_on_ranks over (tp) ranks (0) by 1e-6`): S + pp·ε, not S + ε.",
       ["override clip_norm: eps_on_ranks over (tp) ranks (0) by 1e-6"], ["SC clip_norm"])
mutant("loss_scale_local_zero2", "zero2",
       "the loss scale updated from each dp rank's own found-inf flag under ZeRO-2 (`loss_scale: local over (dp)`): "
       "the rank whose shard overflows halves its scale alone.", ["override loss_scale: local over (dp)"],
       ["SC loss_scale"])
mutant("loss_scale_local_pp", "zero2_pp",
       "the loss scale updated from each pipeline stage's own found-inf flag (`loss_scale: local over (pp)`).",
       ["override loss_scale: local over (pp)"], ["SC loss_scale"], mirrors=SCALERS)
mutant("loss_scale_growth_local_zero2", "zero2",
       "the loss scaler's growth tracker and hysteresis counter updated from each dp rank's own found-inf flag under "
       "ZeRO-2, the step skipped on the reduced flag (`loss_scale: growth_local over (dp)`): the scales part on a later "
       "step.", ["override loss_scale: growth_local over (dp)"], ["SC loss_scale_state"])
mutant("loss_scale_growth_local_pp", "zero2_pp",
       "each pipeline stage's scaler counters updated from its own found-inf flag (`loss_scale: growth_local over "
       "(pp)`).", ["override loss_scale: growth_local over (pp)"], ["SC loss_scale_state"], mirrors=SCALERS)
AMAX_SP = "the fp8 amax reduction skipped under sequence parallelism (NVIDIA/TransformerEngine#74)"
mutant("amax_local_sp", "sp",
       "the fp8 amax not all-reduced over the tensor group under sequence parallelism (`amax: local over (tp)`): "
       "each rank casts its sequence slice with its own scale before the fp8 all-gather.",
       ["override amax: local over (tp)"], ["SC amax"], mirrors=AMAX_SP)
mutant("amax_reduced_over_dp_only_tp", "tp",
       "the fp8 amax all-reduced over the data group only (`amax: reduce over (dp)`, fp8_group the data-parallel "
       "group, NVIDIA/TransformerEngine#656): the tensor ranks' weight slices cast with different scales.",
       ["override amax: reduce over (dp)"], ["SC amax"])
mutant("amax_local_dp", "ddp",
       "the fp8 amax of the dense layers kept per data rank (`amax[dense]: local over (dp)`): each replica casts its "
       "own tokens with its own scale.", ["override amax[dense]: local over (dp)"], ["SC amax[dense]"])
mutant("amax_blockwise_sp_sequence", "sp",
       "fp8 scales per block of 128 taken from each tensor rank's shard (`amax[dense]: blockwise over (tp) by 128`): "
       "at tp = 32 a sequence-parallel slice holds 64 tokens, half a block.",
       ["override amax[dense]: blockwise over (tp) by 128"], ["SC amax[dense]"],
       mirrors="MXFP8 with sequence parallelism on slices of partial blocks (modelscope/ms-swift#9723)")
mutant("amax_rowwise_tp", "tp",
       "fp8 rowwise scales taken from each tensor rank's shard (`amax[dense]: rowwise over (tp)`): a row-parallel "
       "linear's rows are cut between the tensor ranks.", ["override amax[dense]: rowwise over (tp)"],
       ["SC amax[dense]"], mirrors="float8 rowwise scaling under tensor parallelism (pytorch/ao#1718)")
mutant("loss_scale_growth_local_tp", "tp",
       "each tensor rank's scaler counters updated from the found-inf flag of its own weight slices (`loss_scale: "
       "growth_local over (tp)`, facebookresearch/fairseq2#1374).", ["override loss_scale: growth_local over (tp)"],
       ["SC loss_scale_state"])

# nested accumulation: rounds of a pipeline schedule inside an outer gradient accumulation
RESCALED = "a pipeline schedule rescaling the accumulated buffer every run (pytorch/torchtitan#1733)"
PIPE_SUMMED = "a pipeline engine summing its micro-batches under accumulation (deepspeedai/DeepSpeed#7773)"
PMM = ["override loss: per_microbatch_mean", "override tokens: equal"]
mutant("accumulation_rescaled_zero2_pp", "zero2_pp",
       "the schedule's 1/M scale applied to the accumulated buffer after every round of 2 "
       "(`accumulation: rescaled_every_round by 2`).", PMM + ["override accumulation: rescaled_every_round by 2"],
       gi(["dense", "norms", "biases", "embedding"], "over microbatches"), mirrors=RESCALED)
mutant("accumulation_inner_undivided_1f1b", "1f1b",
       "the schedule sums its 2 microbatches and the outer loop divides by its rounds "
       "(`accumulation: inner_undivided by 2`).", PMM + ["override accumulation: inner_undivided by 2"],
       gi(["dense", "norms", "biases", "embedding"], "normalisation"), mirrors=PIPE_SUMMED)
mutant("accumulation_outer_undivided_gpipe", "gpipe",
       "the outer accumulation sums its rounds of 2 microbatches (`accumulation: outer_undivided by 2`).",
       PMM + ["override accumulation: outer_undivided by 2"],
       gi(["dense", "norms", "biases", "embedding"], "normalisation"))

# ---------------------------------------------------------------------------------------
# Equivalents


@dataclass(frozen=True)
class Equivalent:
    name: str
    of: str  # the plan it is equivalent to
    why: str
    imports: tuple[str, ...]
    model: str
    mesh: tuple[tuple[str, int], ...]
    body: tuple[str, ...]
    strategies: tuple[str, ...] = ()
    known_gap: str = ""  # filled from KNOWN_GAPS

    def text(self) -> str:
        header = [f"equivalent to: {self.of}", f"why: {self.why}"]
        if self.known_gap:
            header.append(f"known-gap: {self.known_gap}")
        return spec_text(header, self.imports, self.model, self.mesh, list(self.strategies), "equivalent",
                         list(self.body))


EQUIVALENTS: list[Equivalent] = []


def equivalent(name, of, why, body, base_name=None, imports=(), model=None, mesh=None, strategies=()):
    b = BASES[base_name] if base_name else None
    EQUIVALENTS.append(Equivalent(
        name, of, why, tuple((b.imports if b else ()) + tuple(imports)), model or b.model,
        tuple(mesh or b.mesh), tuple(body), tuple(strategies), KNOWN_GAPS.get(name, "")))


def with_base(name, base_name, why, lines, of=None):
    b = BASES[base_name]
    equivalent(name, of or b.title, why, list(b.bind) + list(lines), base_name)


# a group block restating the plan's own modes, or placing itself as a correct plan would
for name, b, model, why in [
    ("group_restates_ddp", "ddp", "plain_vision_ddp", "a group restating DDP's modes (`placement = {dp: R}`)"),
    ("group_restates_experts_ep", "ep", "moe_experts_restated", "the experts restating expert parallelism's "
     "modes on ep"),
    ("group_zero3_beside_ddp", "ddp", "plain_vision_zero3", "a group placing itself as ZeRO-3 beside DDP: its "
     "buffer is gathered, reduce-scattered and stepped by its own collectives"),
    ("group_params_r_beside_zero3", "zero3", "plain_vision_params_r", "a group's params replicated over dp "
     "beside ZeRO-3: its updated shards are all-gathered after the step by its own buffer's re-gather"),
]:
    bb = BASES[b]
    equivalent(name, bb.title, why + "; the plan computes what single-device training computes.", list(bb.bind), b,
               model=model)

# renamed and reordered axes
for b, mesh, bind in [
    ("ddp", [("replicas", 8)], ["replicas: ddp"]),
    ("zero3", [("shards", 16)], ["shards: zero3"]),
    ("tp", [("tp", 8), ("dp", 8)], ["tp: megatron_tp", "dp: ddp"]),
    ("sp", [("mp", 4), ("batch", 8)], ["batch: zero1", "mp: megatron_sp"]),
    ("hsdp", [("gpus", 8), ("nodes", 4)], ["[nodes, gpus]: hybrid_shard"]),
    ("hsdp", [("inner", 8), ("outer", 4)], ["[outer, inner]: hybrid_shard"]),
    ("3d", [("pp", 4), ("tp", 8), ("dp", 4)], ["pp: interleaved_1f1b(v = 2)", "tp: megatron_sp", "dp: zero1"]),
    ("4d", [("stages", 4), ("ctx", 2), ("tensor", 8), ("batch", 4)],
     ["batch: zero1", "ctx: context_parallel", "tensor: megatron_sp", "stages: interleaved_1f1b(v = 2)"]),
    ("ep", [("experts", 8), ("data", 4)], ["experts: expert_parallel", "data: ddp"]),
    ("cp", [("seq", 4), ("batch", 8)], ["batch: ddp", "seq: context_parallel"]),
    ("zeropp_zero1", [("nodes", 4), ("gpus", 8), ("stages", 4)],
     ["[stages, gpus, nodes]: zeropp_zero1(v = 2, U = 4)"]),
]:
    bb = BASES[b]
    equivalent(f"renamed_{b}_{'_'.join(a for a, _ in mesh)}", bb.title,
               "the same plan with its mesh axes renamed and/or declared in another order; "
               "nothing depends on axis names or order.",
               bind, b, mesh=mesh)

# long forms and shorthands of library strategies
LONG = {
    "ddp": ("data", "R", "R", "R", "R"),
    "zero1": ("data", "R", "S", "R", "R"),
    "zero2": ("data", "R", "S", "S", "R"),
    "zero3": ("data", "S*", "S", "S", "R"),
    "megatron_tp": ("tensor", "S", "S", "S", "S"),
    "context_parallel": ("context", "R", "R", "R", "S"),
    "expert_parallel": ("expert", "S", "S", "S", "R"),
}


def block(name, role, p, o, g, a, extra=()):
    lines = [f"strategy {name} {{", f"  role = {role}"] + [f"  {x}" for x in extra]
    lines += [f"  params: {p}", f"  optimizer: {o}", f"  grads: {g}", f"  activations: {a}", "}"]
    return "\n".join(lines)


for lib, (role, *modes) in LONG.items():
    b = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3", "megatron_tp": "tp",
         "context_parallel": "cp", "expert_parallel": "ep"}[lib]
    bb = BASES[b]
    bind = [x.replace(f": {lib}", ": my_" + lib) for x in bb.bind]
    imports = [i for i in bb.imports if not i.endswith(" " + lib)]
    equivalent(f"long_form_{lib}", bb.title,
               f"std {lib} restated as a block strategy with role = {role} and one line per state.",
               bind, None, imports=imports, model=bb.model, mesh=bb.mesh,
               strategies=[block("my_" + lib, role, *modes)])
    equivalent(f"shorthand_{lib}", bb.title,
               f"std {lib} restated as the 4-tuple shorthand {role}({', '.join(modes)}).",
               bind, None, imports=imports, model=bb.model, mesh=bb.mesh,
               strategies=[f"strategy my_{lib} = {role}({', '.join(modes)})"])

equivalent("shorthand_default_role_zero1", "ZeRO-1", "the shorthand without a role prefix defaults to data.",
           ["dp: my_zero1"], None, model="plain", mesh=[("dp", 8)], strategies=["strategy my_zero1 = (R, S, R, R)"])
equivalent("long_form_megatron_sp", BASES["sp"].title,
           "std megatron_sp restated as a block strategy with the sequence_parallel setting.",
           ["dp: zero1", "tp: my_sp"], None, imports=[D + "zero1"], model="dense", mesh=BASES["sp"].mesh,
           strategies=[block("my_sp", "tensor", "S", "S", "S", "S", ["sequence_parallel"])])
equivalent("extends_megatron_tp_sp", BASES["sp"].title,
           "a strategy extending std megatron_tp with sequence_parallel is std megatron_sp.",
           ["dp: zero1", "tp: my_sp"], None, imports=[D + "zero1", "from std.tensor import megatron_tp"],
           model="dense", mesh=BASES["sp"].mesh,
           strategies=["strategy my_sp extends megatron_tp {\n  sequence_parallel\n}"])
equivalent("long_form_gpipe", BASES["gpipe"].title, "std gpipe restated as a block strategy with its schedule.",
           ["dp: ddp", "pp: my_gpipe"], None, imports=[D + "ddp"], model="tied", mesh=BASES["gpipe"].mesh,
           strategies=[block("my_gpipe", "pipeline", "S", "S", "S", "S", ["schedule = gpipe"])])
equivalent("long_form_hybrid_shard", "FSDP HYBRID_SHARD",
           "std hybrid_shard restated as a two-axis block strategy with per-axis modes.",
           ["[nodes, gpus]: my_hsdp"], None, model="plain", mesh=BASES["hsdp"].mesh,
           strategies=["strategy my_hsdp over (replicate, shard) {\n  role = {replicate: data, shard: data}\n"
                       "  params: {replicate: R, shard: S*}\n  optimizer: {replicate: R, shard: S}\n"
                       "  grads: {replicate: R, shard: S}\n  activations: R\n}"])

# per-axis split of a multi-axis strategy
equivalent("split_hybrid_shard", "FSDP HYBRID_SHARD",
           "hybrid_shard split into its per-axis parts: DDP over nodes and ZeRO-3 over gpus.",
           ["nodes: ddp", "gpus: zero3"], None, imports=[D + "ddp, zero3"], model="plain", mesh=BASES["hsdp"].mesh)
equivalent("split_zeropp_dp", "ZeroPP with DDP across nodes",
           "zeropp_dp split per axis: a pipeline axis, ZeRO-3 over intra and DDP over inter "
           "(the schedule differs only in cost).",
           ["stage: interleaved_1f1b(v = 2)", "intra: zero3", "inter: ddp"], None,
           imports=[D + "ddp, zero3", "from std.pipeline import interleaved_1f1b"], model="pipeline",
           mesh=BASES["zeropp_dp"].mesh)
equivalent("split_zeropp_zero1", "ZeroPP with ZeRO-1 across nodes",
           "zeropp_zero1 split per axis: a pipeline axis, ZeRO-3 over intra and ZeRO-1 over inter "
           "(the schedule differs only in cost).",
           ["stage: gpipe", "intra: zero3", "inter: zero1"], None,
           imports=[D + "zero1, zero3", "from std.pipeline import gpipe"], model="pipeline",
           mesh=BASES["zeropp_zero1"].mesh)

# per-state, per-axis placements written in the plan
with_base("per_axis_zero1_from_ddp", "ddp", "DDP with the optimizer placed S on dp is ZeRO-1.",
          ["optimizer: {dp: S}"], of="ZeRO-1")
with_base("per_axis_zero2_from_ddp", "ddp", "DDP with optimizer and grads placed S on dp is ZeRO-2.",
          ["optimizer: {dp: S}", "grads: {dp: S}"], of="ZeRO-2")
with_base("per_axis_zero3_from_zero2", "zero2", "ZeRO-2 with params placed S* on dp is ZeRO-3.",
          ["params: {dp: S*}"], of="ZeRO-3")
with_base("per_axis_ddp_from_zero3", "zero3", "ZeRO-3 with every state placed R on dp is DDP.",
          ["params: {dp: R}", "optimizer: {dp: R}", "grads: {dp: R}"], of="DDP")
with_base("per_axis_restated_3d", "3d", "the 3D plan's own placements restated per axis.",
          ["params: {dp: R, tp: S, pp: S}", "optimizer: {dp: S, tp: S, pp: S}", "grads: {dp: R, tp: S, pp: S}"])
with_base("per_axis_zero3_tp", "tp", "DDP x TP with ZeRO-3 placements on dp is FSDP x TP.",
          ["params: {dp: S*}", "optimizer: {dp: S}", "grads: {dp: S}"], of=BASES["fsdp_tp"].title)

# explicit overrides that restate the derived behaviour
for name, b, lines, why in [
    ("reduce_dp_ddp", "ddp", ["override grads: reduce over (dp)"], "DDP reduces every group over dp."),
    ("reduce_dp_zero2", "zero2", ["override grads: reduce over (dp)"], "ZeRO-2 reduce-scatters every group over dp."),
    ("reduce_dp_cp", "cp", ["override grads: reduce over (dp, cp)"], "gradients vary over dp and cp."),
    ("reduce_norms_sp", "sp", ["override grads[norms]: reduce over (dp, tp)", "override grads[biases]: reduce over (dp, tp)"],
     "under sequence parallelism norm and bias grads are reduced over dp and tp."),
    ("reduce_heads_mqa", "mqa_tp", ["override grads[kv]: reduce over (dp, tp)",
                                    "override grads[qk_norms]: reduce over (dp, tp)"],
     "the copied K/V head and the query/key norms see each rank's heads only: reduced over dp and tp."),
    ("reduce_heads_mqa_sp", "mqa_sp", ["override grads[kv]: reduce over (dp, tp)",
                                       "override grads[qk_norms]: reduce over (dp, tp)"],
     "with sequence parallelism too, the copied K/V head and the query/key norms are reduced over dp and tp."),
    ("clip_filter_kv_copies_gqa", "gqa_tp", ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)"],
     "a written sum over tp with the duplicate filter over tp: the layer norms, the biases and each copied kv head "
     "counted once, as the derived norm does."),
    ("clip_filter_kv_copies_gqa_tp2", "gqa_tp2", ["override clip_norm: reduce over (tp, tl)",
                                                   "override clip_norm: dedupe over (tp, tl)"],
     "over two tensor axes, a written sum with the duplicate filter over both: each copy group (a run of the joint "
     "index) counted once, as the derived norm does."),
    ("clip_filter_kv_joint_gqa_tp3x4", "gqa_tp3x4", ["override clip_norm: reduce over (tp, tl)",
                                                     "override clip_norm: dedupe over (tp, tl)"],
     "copy groups crossing tp and tl, a written sum with the duplicate filter over both: each copy group (a run of "
     "6 joint ranks) counted once, as the derived norm does."),
    ("clip_filter_names_kv_gqa", "gqa_tp", ["override clip_norm: reduce over (tp)",
                                            "override clip_norm[norms]: dedupe over (tp)",
                                            "override clip_norm[biases]: dedupe over (tp)",
                                            "override clip_norm[kv]: dedupe over (tp)"],
     "the duplicate filter stated group by group, the copied kv heads named: each copy group counted once."),
    ("reduce_experts_ep", "ep", ["override grads[experts]: reduce over (dp)",
                                 "override grads[dense]: reduce over (dp, ep)"],
     "expert grads are reduced over the expert-data axis only, the others over dp and ep."),
    ("tokens_dp", "ddp", ["override tokens: reduce over (dp)"], "the token count is summed over dp."),
    ("tokens_dp_cp", "cp", ["override tokens: reduce over (dp, cp)"], "the token count is summed over dp and cp."),
    ("global_mean", "zero1", ["override loss: global_mean"], "the global token mean is the default loss."),
    ("clip_norm_zero3", "zero3", ["override clip_norm: reduce over (dp)"],
     "ZeRO-3 grads are sharded over dp, so the squared norms are summed over dp."),
    ("clip_norm_dense_3d", "3d", ["override clip_norm[dense]: reduce over (tp, pp)"],
     "dense grads are sharded over tp and pp and replicated over dp (ZeRO-1)."),
    ("overflow_zero3", "zero3", ["override overflow: reduce over (dp)"], "the overflow flag or-reduced over dp."),
    ("dropout_vary_sp", "sp", ["override dropout_seed: vary over (tp)"],
     "sequence-parallel slices take distinct dropout seeds."),
    ("dropout_same_tp", "tp", ["override dropout_seed: same"], "without SP the replicated region takes one seed."),
    ("tie_reduce_pp", "gpipe", ["override embedding: tie_reduce over (pp)"],
     "the tied embedding is summed once over the stage pair."),
    ("gather_dp_zero3", "zero3", ["override params: gather over (dp)"], "ZeRO-3 gathers params once over dp."),
    ("gather_gpus_hsdp", "hsdp", ["override params: gather over (gpus)"],
     "HYBRID_SHARD gathers params once over the shard axis."),
    ("overflow_local_ddp", "ddp", ["override overflow: reduce over ()"],
     "after DDP's all-reduce every rank holds the same full gradient, so a local overflow check agrees."),
]:
    with_base(f"restated_{name}", b, "explicit override restating the derived behaviour: " + why, lines)

# two kv heads on tp = 2 x tl = 2 tensor ranks: each copy group is the whole tl axis (tp holds whole heads), so a
# reduction over (dp, tl) is the sum over each copy group (check.kvproduct)
equivalent("kv_copy_group_whole_tl_gqa", BASES["gqa_tp2"].title,
           "with tp = 2 and tl = 2 each kv head is copied on both tl ranks of one tp rank: `grads[kv]: reduce over "
           "(dp, tl)` sums each copy group once, as the derived collective does.",
           list(BASES["gqa_tp2"].bind) + ["override grads[kv]: reduce over (dp, tl)"], "gqa_tp2",
           mesh=[("dp", 8), ("tp", 2), ("tl", 2)])

# cancelling errors and exact means
for name, b, lines, why in [
    ("twice_divided_ddp", "ddp", ["override grads: reduce over (dp, dp)", "override grads: divide by dp"],
     "a second all-reduce over dp multiplies by dp; dividing by dp cancels it."),
    ("twice_divided_zero1", "zero1", ["override grads: reduce over (dp, dp)", "override grads: divide by dp"],
     "a second all-reduce over dp multiplies by dp; dividing by dp cancels it."),
    ("tokens_twice_grads_twice", "ddp", ["override grads: reduce over (dp, dp)", "override tokens: reduce over (dp, dp)"],
     "reducing the token count twice multiplies it by dp, which cancels the gradient's second reduction."),
    ("pdm_equal_ddp", "ddp", ["override tokens: equal", "override loss: per_device_mean"],
     "packed equal-length batches make a mean of per-device means exact."),
    ("pdm_equal_cp", "cp", ["override tokens: equal", "override loss: per_device_mean"],
     "packed equal-length batches make a mean of per-device means over dp and cp exact."),
    ("pmm_equal_zero2", "zero2", ["override tokens: equal", "override loss: per_microbatch_mean"],
     "equal-token microbatches make a mean of per-microbatch means exact."),
    ("pmm_equal_1f1b", "1f1b", ["override tokens: equal", "override loss: per_microbatch_mean"],
     "equal-token microbatches make a mean of per-microbatch means exact."),
    ("pdm_equal_divisor_ddp", "ddp",
     ["override tokens: equal", "override loss: per_device_mean", "override grads: divide by dp"],
     "with equal tokens a per-device mean divided explicitly by dp is the global mean."),
    ("sum_loss_ddp", "ddp", ["override loss: sum"],
     "a sum loss reduced by summation and never divided is the global sum-loss gradient."),
    ("sum_loss_1f1b", "1f1b", ["override loss: sum"],
     "a sum loss over microbatches and stages: accumulation adds, nothing divides."),
    ("pdm_equal_experts_ep", "ep",
     ["override tokens: equal", "override loss: per_device_mean", "override grads[experts]: divide by dp * ep"],
     "with equal tokens, expert grads of per-device means divided by the whole data group are exact."),
]:
    with_base(f"cancel_{name}", b, why, lines)

# overrides that are harmless under the semantics (an override the step cannot read at all, such as
# no_regather where nothing is re-gathered, is an input error, PL506, and is not in the corpus)
for name, b, lines, why in [
    ("overflow_twice_zero2", "zero2", ["override overflow: reduce over (dp, dp)"],
     "the overflow flag is or-reduced, and an or is idempotent: a second reduction changes nothing."),
    ("overflow_replicated_hsdp", "hsdp", ["override overflow: reduce over (nodes, gpus)"],
     "or-reducing the overflow flag over the replicated axis too changes nothing."),
    ("amax_world_tp", "tp", ["override amax: reduce over (dp, tp)"],
     "the fp8 amax all-reduced over the data and tensor groups, every axis whose ranks hold different pieces: the "
     "derived reduction restated."),
    ("amax_mx_blocks_sp", "sp", ["override amax[dense]: blockwise over (tp) by 32"],
     "MX fp8 scales per block of 32 from each tensor rank's shard: the MLP width, the query width and the "
     "sequence-parallel slices are whole blocks at every tensor size the model takes."),
    ("overflow_world_zero2_pp", "zero2_pp", ["override overflow: reduce over (dp, pp)"],
     "the found-inf flag the loss scaler reads reduced over every axis a gradient is sharded on, as derived: every "
     "rank's scale, growth tracker and hysteresis counter follow single-device training's."),
    ("divide_by_one_ddp", "ddp", ["override grads: divide by 1"], "dividing the global token mean by 1."),
    ("dropout_vary_data_tp", "tp", ["override dropout_seed: vary over (dp)"],
     "dropout seeds are constrained only along the tensor axis; data replicas see different samples anyway."),
    ("tokens_dp_ep", "ep", ["override tokens: reduce over (dp, ep)"],
     "the token count is summed over every axis that splits the batch."),
    ("clip_norm_gpus_hsdp", "hsdp", ["override clip_norm: reduce over (gpus)"],
     "HYBRID_SHARD grads are sharded over gpus and replicated over nodes."),
]:
    with_base(f"harmless_{name}", b, why, lines)

# the duplicate filter stated beside a written norm reduction (Megatron-LM's clip_grad_norm: the
# squared norm of the parameters that are not tensor-parallel duplicates, and of a shared embedding
# on one stage, all-reduced over the model-parallel group)
for name, b, lines, why in [
    ("tp", "tp", ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)"],
     "the grad norm summed over tp, the norm weights and biases (replicated over tp) counted on one tp rank."),
    ("norms_tp", "tp", ["override clip_norm[norms]: reduce over (tp)", "override clip_norm[norms]: dedupe over (tp)"],
     "the norm weights' squared norm summed over tp and counted on one tp rank."),
    ("fsdp_tp", "fsdp_tp", ["override clip_norm: reduce over (dp, tp)", "override clip_norm: dedupe over (tp)"],
     "the grad norm summed over the dp shards and over tp, the tp-replicated groups counted on one tp rank."),
    ("sp", "sp", ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)"],
     "under sequence parallelism the reduced norm-weight and bias gradients are replicated over tp: filtered."),
    ("3d", "3d", ["override clip_norm: reduce over (tp, pp)", "override clip_norm: dedupe over (tp, pp)"],
     "Megatron-LM's norm: tensor-parallel duplicates on one tp rank, the tied embedding on one stage, summed "
     "over tp and pp."),
]:
    with_base(f"filtered_clip_norm_{name}", b, "a written norm reduction with the duplicate filter stated: " + why,
              lines)

with_base("experts_replicated_ep", "ep",
          "experts placed R on ep: every rank holds every expert, so expert grads are partial over ep and the "
          "derived schedule reduces them over it; the plan is DDP over both axes.",
          ["params: {ep: R}", "optimizer: {ep: R}", "grads: {ep: R}"], of="DDP x DDP")
with_base("tensor_replicated_tp", "tp",
          "every state placed R on tp without sequence parallelism: each tp rank computes the whole model on "
          "the same tokens, a redundant copy of DDP.",
          ["params: {tp: R}", "optimizer: {tp: R}", "grads: {tp: R}"], of="DDP")

# checkpoint save, load and reshard (check/checkpoint.py; docs/semantics.md, "Checkpoints")
CKPT_EP = "expert-parallel checkpoints written by one ep rank (KempnerInstitute/KempnerForge#202)"
CKPT_REPLICA = "a replica id that ignores the tp rank: every tp rank writes (NVIDIA/Megatron-LM#4801)"
CKPT_SKIP = "optimizer state not saved with bf16 and ZeRO stage 0 (deepspeedai/DeepSpeed#7786)"
CKPT_RESHARD = "optimizer shards not remapped on a new dp size (ServiceNow/Fast-LLM#436, deepspeedai/DeepSpeed#5105)"
CKPT_RNG = "RNG state of tp rank 0 restored on every tp rank (NVIDIA-NeMo/Automodel#3437, NVIDIA/Megatron-LM#6858)"
RESUME = "override checkpoint: resume"
for b, lines, what, mirrors in [
    ("zero3", ["override checkpoint: save_rank0 over (dp)"], "ZeRO-3 state, sharded over dp, written by dp rank 0 "
     "only: the other shards are lost.", CKPT_EP),
    ("ddp", ["override checkpoint: save_from over (dp)"], "DDP state, replicated over dp, written by every dp rank: "
     "dp writes of each key.", CKPT_REPLICA),
    ("tp", ["override checkpoint[norms]: save_from over (tp)"], "LayerNorm weights, replicated over tp, written by "
     "every tp rank.", CKPT_REPLICA),
    ("ep", ["override checkpoint[experts]: save_rank0 over (ep)"], "the experts, split over ep, written by ep rank "
     "0 only.", CKPT_EP),
    ("moe_3d", ["override checkpoint[experts]: save_rank0 over (ep)"], "the experts of a TP x EP plan written by ep "
     "rank 0 only.", CKPT_EP),
    ("zero1", ["override checkpoint: skip_optimizer"], "the optimizer state left out of the checkpoint.", CKPT_SKIP),
    ("3d", ["override checkpoint[dense]: save_rank0 over (pp)"], "the dense layers of every pipeline stage written "
     "by stage 0 only.", CKPT_EP),
]:
    mutant(f"ckpt_save_{b}_{lines[0].split(': ')[1].split()[0]}", b, what, [RESUME] + lines,
           ["SC checkpoint save"], mirrors=mirrors)
for b in ["zero1", "sp", "interleaved"]:
    mutant(f"ckpt_no_regather_after_load_{b}", b, "params replicated over dp over a sharded optimizer, not "
           "all-gathered from the loaded master shards after a load.",
           [RESUME, "override checkpoint: no_regather_after_load"], ["SC checkpoint load re-gather"], mirrors=REGATHER)
for b, axes in [("zero1", "dp"), ("fsdp", "dp"), ("tp", "tp"), ("3d", "pp"), ("ep", "ep")]:
    group = "[experts]" if b == "ep" else ""
    mutant(f"ckpt_reshard_by_rank_{b}_{axes}", b, f"resumed on a new {axes} size with the shards read by rank index.",
           [f"override checkpoint: reshard over ({axes})", f"override checkpoint{group}: load_by_rank over ({axes})"],
           ["SC checkpoint reshard"], mirrors=CKPT_RESHARD)
for b in ["sp", "3d"]:
    mutant(f"ckpt_rng_shared_{b}", b, "one RNG state, tp rank 0's, restored on every sequence-parallel tp rank.",
           [RESUME, "override checkpoint: rng_shared"], ["SC checkpoint rng"], mirrors=CKPT_RNG)
for b in ["ddp", "zero1", "zero3", "hsdp", "tp", "sp", "ep", "3d", "moe_3d"]:
    with_base(f"ckpt_resume_{b}", b, "a checkpoint saved and loaded on the same mesh as derived: sharded states "
              "written by every rank, replicated ones by rank 0, params re-gathered from a sharded optimizer.", [RESUME])
for b, axes in [("zero1", "dp"), ("zero3", "dp"), ("3d", "dp, tp, pp"), ("ep", "dp, ep")]:
    with_base(f"ckpt_reshard_{b}", b, f"a checkpoint loaded on new sizes of ({axes}), every shard remapped by its "
              "global offset.", [f"override checkpoint: reshard over ({axes})"])
# loss terms whose path, stated, is the objective's own
for name, b, model, line, why in [
    ("aux_stats_global_stated_ep", "ep", "moe_aux_global", "override loss[aux]: stats_per_step over (ep, dp)",
     "the aux loss's routing statistics gathered over every data and expert rank and the step's microbatches"),
    ("aux_stats_micro_local_ep", "ep", "moe_aux_micro", "override loss[aux]: stats_per_microbatch over ()",
     "the aux loss's routing statistics of each rank's microbatch, no rank splitting a sequence"),
    ("aux_stats_seq_tp_moe_3d", "moe_3d", "moe_aux_seq", "override loss[aux]: stats_per_sequence over ()",
     "the aux loss's routing statistics per sequence, the tensor ranks (no sequence parallelism) routing the same "
     "tokens"),
    ("aux_stats_one_sequence_ep", "ep", "moe_aux_seq", "override loss[aux]: stats_per_microbatch over ()",
     "the aux loss's routing statistics of each microbatch, which holds one sequence: its sequence's"),
    ("aux_path_stated_ep", "ep", "moe_aux", "override loss[aux]: per_microbatch_mean",
     "the MoE aux loss's path stated as its objective's own"),
    ("mtp_tokens_stated_cp", "cp", "dense_mtp", "override tokens[mtp]: reduce over (dp, cp)",
     "the MTP loss's token count summed over every axis that splits the tokens"),
    ("mtp_tokens_dp_tp", "tp", "dense_mtp", "override tokens[mtp]: reduce over (dp)",
     "the MTP loss's token count summed over dp, not over tp where every rank sees the same tokens"),
]:
    bb = BASES[b]
    equivalent(name, bb.title, why + "; the term's contributions are weighted as the objective states.",
               list(bb.bind) + [line], b, model=model)

# the aux loss's statistics over packed rows (check.auxpacked): per row pools a row's documents
mutant("aux_stats_packed_row_ep", "ep",
       "a sequence-wise load-balancing loss over packed rows whose router sees each flattened pack as one sequence: "
       "one f and one P per row, its documents pooled (`loss[aux]: stats_per_row over ()`).",
       ["override loss[aux]: stats_per_row over ()"], ["GI aux_stats"],
       mirrors="seq_aux_loss on a variable-length THD pack (NVIDIA/Megatron-LM#6108)", model="moe_aux_seq_packed")
mutant("aux_stats_packed_doc_for_micro_ep", "ep",
       "a per-microbatch load-balancing loss over packed rows computed per document instead "
       "(`loss[aux]: stats_per_sequence over ()`).", ["override loss[aux]: stats_per_sequence over ()"],
       ["GI aux_stats"], model="moe_aux_micro_packed")
mutant("aux_stats_packed_length_weighted_ep", "ep",
       "a sequence-wise load-balancing loss over packed rows whose per-document values are averaged over the tokens, "
       "each document weighted by its length (`loss[aux]: stats_length_weighted`).",
       ["override loss[aux]: stats_length_weighted"], ["GI aux_stats"], model="moe_aux_seq_packed")
for name, model, line, why in [
    ("aux_stats_packed_doc_stated_ep", "moe_aux_seq_packed", "override loss[aux]: stats_per_sequence over ()",
     "the sequence-wise aux loss's statistics per document of the packed rows, no rank splitting a row"),
    ("aux_stats_packed_one_row_ep", "moe_aux_micro_packed", "override loss[aux]: stats_per_row over ()",
     "the per-microbatch aux loss's statistics per packed row, each microbatch one row: its microbatch's"),
]:
    equivalent(name, BASES["ep"].title, why + "; the term's contributions are weighted as the objective states.",
               list(BASES["ep"].bind) + [line], "ep", model=model)

# the aux loss's f and P over groups of their own: the path computes the loss of their union where every shard
# holds as many real tokens (`tokens: equal`), and not where the counts may differ
AUX_SPLIT = [
    ("aux_counts_global_probs_local_ep",
     ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: probs_per_sequence over ()"],
     "a global-batch load-balancing loss from token counts all-reduced over every data and expert rank and "
     "accumulated over the step, times each rank's own mean probabilities per sequence"),
    ("aux_counts_per_microbatch_probs_per_step_ep",
     ["override loss[aux]: stats_per_microbatch over (dp, ep)", "override loss[aux]: probs_per_step over ()"],
     "a global-batch load-balancing loss from token counts all-reduced over the ranks per microbatch and mean "
     "probabilities accumulated over the step per rank"),
]
for name, lines, why in AUX_SPLIT:
    bb = BASES["ep"]
    equivalent(name, bb.title, why + ", every rank and microbatch holding as many tokens, none padded (`tokens: "
               "equal`): the mean over the cells of f·P, one factor common to them, is that factor times the "
               "cells' mean of the other, the pooled one at equal counts, so the path computes the loss of the two "
               "groups' union, the step (NVIDIA/Megatron-LM#1561).",
               list(bb.bind) + lines + ["override tokens: equal"], "ep", model="moe_aux_global")

# the capacity step on each router call's real tokens, the padding masked before it
for name, model, why in [
    ("capacity_masks_padding_ep", "moe", "a dropping MoE layer whose router clears the padded positions before the "
     "capacity step (`capacity: masks_padding`, NVIDIA/Megatron-LM#5542's fix): the objective's step"),
    ("capacity_masks_padding_aux_micro_ep", "moe_aux_micro", "padding masked both in the load-balancing loss's "
     "statistics and before the capacity step (`capacity: masks_padding`)"),
]:
    bb = BASES["ep"]
    equivalent(name, bb.title, why + ".", list(bb.bind) + ["override capacity: masks_padding"], "ep", model=model)

# the dropped pairs zeroed, and the kept weights renormalised as the model states
for name, model, lines, why in [
    ("capacity_drops_zeroed_ep", "moe", ["override capacity: drops_zeroed"], "a dropping MoE layer whose dropped "
     "pairs add nothing to the combine (`capacity: drops_zeroed`, huggingface/transformers#37123's fix)"),
    ("capacity_renormalise_kept_as_model_ep", "moe_drop_renorm", ["override capacity: drops_zeroed",
     "override capacity: renormalise_kept"], "dropped pairs zeroed and the kept weights renormalised over the kept "
     "experts where the model states drop_renormalise: the objective's combine"),
]:
    bb = BASES["ep"]
    equivalent(name, bb.title, why + ".", list(bb.bind) + lines, "ep", model=model)

# the router's choice: one shared noise draw on the reduced activation; per-rank noise on sequence shards
with_base("router_same_moe_3d", "moe_3d",
          "a tensor-parallel MoE layer whose router reads the reduced activation and draws its jitter from a "
          "generator shared over tp (`router: same`): the derived routing.", ["override router: same"])
with_base("router_jitter_sp_shards_moe_etp", "moe_etp",
          "router jitter drawn with a per-rank seed over a sequence-parallel tensor axis (`router: vary over "
          "(tp)`): each tensor rank routes its own sequence shard, so no token is routed by two ranks "
          "(NVIDIA/Megatron-LM#1039).", ["override router: vary over (tp)"])

# the calls weighted equally, the map padded to capacity: nothing changes where every token routes to every expert
for name, line, why in [
    ("aux_equal_weights_every_expert_ep", "override loss[aux]: stats_equal_microbatch_weights",
     "a global-batch load-balancing loss over microbatches weighted equally with top-8 of 8 experts: every call's "
     "f and P are 1/E per expert whatever its tokens, so any weighting of them gives the value 1"),
    ("aux_capacity_padded_every_expert_ep", "override loss[aux]: stats_capacity_padded",
     "a global-batch load-balancing loss counted on the map padded to capacity with top-8 of 8 experts: every "
     "token already marks every expert, so no column is padded"),
]:
    bb = BASES["ep"]
    equivalent(name, bb.title, why + ".", list(bb.bind) + ["override loss[aux]: stats_per_step over (dp, ep)", line],
               "ep", model="moe_aux_global_k8")

# copies combined by an average or a max: the value itself
with_base("clip_average_copies_ddp", "ddp",
          "DDP's squared norms averaged over dp (an all-reduce with AVG): every dp rank holds the whole reduced "
          "gradient, so the average of the copies is the norm itself.", ["override clip_norm: average over (dp)"])
with_base("clip_max_copies_ddp", "ddp",
          "DDP's squared norms combined by max over dp: every dp rank holds the same value, its own maximum.",
          ["override clip_norm: max over (dp)"])
with_base("clip_sqrt_filtered_copies_tp", "tp",
          "the norms' and biases' roots taken before the tp sum, which counts their tp copies on one rank only "
          "(the duplicate filter): one rank contributes, so the root of the sum is the sum of the roots.",
          ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)",
           "override clip_norm[norms]: sqrt_before_reduce", "override clip_norm[biases]: sqrt_before_reduce"])
with_base("clip_rank0_filtered_copies_tp", "tp",
          "the norms and biases, whole on every tp rank, counted on tp rank 0 only beside a written sum over tp "
          "(`clip_norm[g]: rank0_only over (tp)`): the duplicate filter, so each is counted once.",
          ["override clip_norm: reduce over (tp)", "override clip_norm[norms]: rank0_only over (tp)",
           "override clip_norm[biases]: rank0_only over (tp)"])
with_base("grads_blocks_of_the_whole_axis_ddp", "ddp",
          "the gradient reduction run in blocks of dp ranks (`grads: reduce_blocks over (dp) by dp`): one block "
          "holds the whole axis.", ["override grads: reduce_blocks over (dp) by dp"])
with_base("clip_blocks_of_the_whole_axis_zero2", "zero2",
          "the norm's reduction over dp run in blocks of dp ranks (`clip_norm: reduce_blocks over (dp) by dp`): one "
          "block holds the whole axis.", ["override clip_norm: reduce_blocks over (dp) by dp"])
with_base("grads_first_of_the_whole_axis_ddp", "ddp",
          "the gradient reduction run over the first dp ranks (`grads: reduce_first over (dp) by dp`): the group "
          "holds the whole axis.", ["override grads: reduce_first over (dp) by dp"])
with_base("clip_first_of_the_whole_axis_zero2", "zero2",
          "the norm's reduction over dp run over the first dp ranks (`clip_norm: reduce_first over (dp) by dp`): the "
          "group holds the whole axis.", ["override clip_norm: reduce_first over (dp) by dp"])
with_base("grads_strided_by_the_whole_axis_ddp", "ddp",
          "the gradient reduction run in strided groups of stride 1 written as a size (`grads: reduce_strided over "
          "(dp) by dp / dp`): one group holds every rank.", ["override grads: reduce_strided over (dp) by dp / dp"])
with_base("clip_rank0_copies_ddp", "ddp",
          "DDP's squared norms summed over dp with every group counted on dp rank 0 only: each dp rank holds the "
          "whole reduced gradient, so rank 0's copy is the norm.",
          ["override clip_norm: reduce over (dp)", "override clip_norm: rank0_only over (dp)"])
with_base("count_ranks_tied_last_stage_1f1b", "1f1b",
          "the tied embedding counted in the norm on the last pipeline stage only (`clip_norm[embedding]: "
          "count_on_ranks over (pp) ranks (pp - 1)`): one copy at every pipeline size, as the derived filter's.",
          ["override clip_norm[embedding]: count_on_ranks over (pp) ranks (pp - 1)"])
with_base("update_divisors_cancel_on_the_corner_1f1b", "1f1b",
          "rank 0 of dp and of pp dividing by 2 and process 0 of the (pp, dp) group multiplying by 2 "
          "(`grads: divide_rank0_only over (dp, pp) by 2`, `divide_on_ranks over (pp, dp) ranks (0) by 1 / 2`): both "
          "name the one device (0, 0) at every size, so every device's product is 1.",
          ["override grads: divide_rank0_only over (dp, pp) by 2",
           "override grads: divide_on_ranks over (pp, dp) ranks (0) by 1 / 2"])
with_base("count_ranks_norms_rank0_dp_tp", "tp",
          "the layer norms and biases summed over (dp, tp) and counted on rank 0 of that group, as a rank set over "
          "both axes (`clip_norm[g]: count_on_ranks over (dp, tp) ranks (0)`): one copy at every size.",
          ["override clip_norm[norms]: reduce over (dp, tp)",
           "override clip_norm[norms]: count_on_ranks over (dp, tp) ranks (0)",
           "override clip_norm[biases]: reduce over (dp, tp)",
           "override clip_norm[biases]: count_on_ranks over (dp, tp) ranks (0)"])
with_base("count_ranks_norms_rank0_tp", "tp",
          "the layer norms and biases counted on tp rank 0 beside a written sum over tp, as a rank set "
          "(`clip_norm[g]: count_on_ranks over (tp) ranks (0)`): rank0_only over (tp), the duplicate filter.",
          ["override clip_norm: reduce over (tp)", "override clip_norm[norms]: count_on_ranks over (tp) ranks (0)",
           "override clip_norm[biases]: count_on_ranks over (tp) ranks (tp - 1)"])
with_base("divisor_product_cancels_pp", "1f1b",
          "pipeline rank 0 dividing by 2 and by 1/2 (`grads: divide_on_ranks over (pp) ranks (0) by 2` and "
          "`divide_rank0_only over (pp) by 1 / 2`): the product on every rank is 1.",
          ["override grads: divide_on_ranks over (pp) ranks (0) by 2", "override grads: divide_rank0_only over (pp) by 1 / 2"])
with_base("clip_eps_averaged_ddp", "ddp",
          "each rank's squared norm plus an epsilon before an all-reduce with AVG over dp: the average of "
          "s + ε over copies is s + ε, single-device training's value.",
          ["override clip_norm: average over (dp)", "override clip_norm: eps_before_reduce by 1e-6"])
with_base("clip_eps_on_rank0_3d", "3d",
          "an epsilon added to the squared norm on rank 0 of the group over tp and pp only, before the norm's "
          "all-reduce over them (`clip_norm: eps_on_ranks over (tp, pp) ranks (0) by 1e-6`): S + ε, single-device "
          "training's value.", ["override clip_norm: eps_on_ranks over (tp, pp) ranks (0) by 1e-6"])
with_base("clip_eps_max_ddp", "ddp",
          "each rank's squared norm plus an epsilon before a MAX all-reduce over dp: max(s + ε) = max(s) + ε.",
          ["override clip_norm: max over (dp)", "override clip_norm: eps_before_reduce by 1e-6"])
# -- initial state, optimizer identity and RNG state ------------------------------------

INIT = "replicas never broadcast at init (pytorch/torchtitan#166, mosaicml/llm-foundry#830, allenai/OLMo-core#319)"
STALE = "an optimizer built before FSDP wrapping (huggingface/accelerate#3256, intelligent-machine-learning/dlrover#585)"
TRACKER = "dropout outside the model-parallel RNG tracker (NVIDIA/Megatron-LM#26)"
RESTORED = "one rank's RNG state restored on every rank (NVIDIA/Megatron-LM#6858, NVIDIA-NeMo/Automodel#3437)"
OFFSET = "a data loader drawing on tensor rank 0 only (bigscience-workshop/Megatron-DeepSpeed#276)"
RECOMPUTE = "activation checkpointing with preserve_rng_state=False (allenai/OLMo-core#828)"
REC = ("from std.recompute import full_recompute",)
for name, b, lines, what, ob, mirrors, imports in [
    ("init_no_broadcast_ddp", "ddp", ["override params: no_init_broadcast over (dp)"],
     "every dp rank initialises its own params, never broadcast", "SC params initial", INIT, ()),
    ("init_no_broadcast_hsdp_replicas", "hsdp", ["override params: no_init_broadcast over (nodes, gpus)"],
     "per-rank init over both HSDP axes: the shards over gpus are distinct, the copies over nodes start apart",
     "SC params initial", INIT, ()),
    ("init_no_broadcast_norms_tp", "tp", ["override params[norms]: no_init_broadcast over (tp)"],
     "the norm weights, whole on every tp rank, initialised per tp rank", "SC params initial", INIT, ()),
    ("init_no_broadcast_dense_ep", "ep", ["override params[dense]: no_init_broadcast over (ep)"],
     "the dense weights, whole on every expert rank, initialised per expert rank", "SC params initial", INIT, ()),
    ("optimizer_stale_fsdp", "fsdp", ["override optimizer: stale_params"],
     "the optimizer holds the params as they were before FSDP wrapping", "SC optimizer holds the params", STALE, ()),
    ("optimizer_stale_experts_ep", "ep", ["override optimizer[experts]: stale_params"],
     "the optimizer holds stale copies of the expert weights only", "SC optimizer holds the params", "", ()),
    ("rng_same_tp", "tp", ["override rng: same over (tp)"],
     "the model-parallel RNG tracker not forked over tp", "SC rng split regions", TRACKER, ()),
    ("rng_same_sp", "sp", ["override rng: same over (tp)"],
     "the tracker not forked over tp under sequence parallelism: every slice repeats one mask",
     "SC rng split regions", TRACKER, ()),
    ("rng_restored_ep", "ep", ["override rng: restored_from_one over (ep)"],
     "expert ranks resume on one rank's tracker state", "SC rng split regions", RESTORED, ()),
    ("rng_restored_3d", "3d", ["override rng: restored_from_one over (dp, tp, pp)"],
     "every rank resumes on rank 0's RNG states", "SC rng split regions", RESTORED, ()),
    ("rng_advance_tp", "tp", ["override rng: advance over (tp)"],
     "the default generator advanced on some tp ranks only", "SC rng replicated region", OFFSET, ()),
    ("rng_advance_moe_3d", "moe_3d", ["override rng: advance over (tp, ep)"],
     "the default generator advanced apart over tp (and ep)", "SC rng replicated region", "", ()),
    ("rng_not_preserved_ddp", "ddp", ["use full_recompute", "override rng: not_preserved"],
     "full recomputation without the forward's RNG state", "SC rng recompute", RECOMPUTE, REC),
]:
    mutant(f"state_{name}", b, what + f" (`{lines[-1].removeprefix('override ')}`).", lines, [ob],
           mirrors=mirrors, imports=imports)

for name, b, lines, why in [
    ("rng_same_dp_tp", "tp", ["override rng: same over (dp)"],
     "data-parallel ranks may share the tracker's seed (Megatron-LM seeds them alike): they hold other samples."),
    ("rng_advance_sp", "sp", ["override rng: advance over (tp)"],
     "under sequence parallelism no dropout region is replicated over tp, so default offsets may differ there."),
    ("rng_advance_restored_dp_ep", "ep", ["override rng: advance over (dp)", "override rng: restored_from_one over (dp)"],
     "over the data axis the RNG states carry no condition: restored or advanced apart, dp ranks draw for "
     "other samples."),
    ("rng_same_nodes_hsdp", "hsdp", ["override rng: same over (nodes)"],
     "the RNG tracker shared over a data axis of HSDP: nothing there is split."),
]:
    with_base(f"harmless_state_{name}", b, why, lines)
SYNC = "the gradient sync armed on the wrong micro-step (modelscope/FunASR#3472, karpathy/build-nanogpt#30)"
for b, groups in [("ddp", ["dense", "norms", "biases", "embedding"]), ("zero1", ["dense", "norms", "biases", "embedding"]),
                  ("tp", ["dense", "norms", "biases", "embedding"]), ("gpipe", ["dense", "norms", "biases", "embedding"])]:
    mutant(f"state_sync_before_last_{b}", b, "the once-per-step gradient all-reduce armed on a micro-step before the "
           "last (`grads: sync_before_last`): the later micro-steps' gradients are never reduced.",
           ["override grads: sync_before_last"],
           gi(groups, "over microbatches") + [f"SC grads[{g}]" for g in groups] + ["SC clip_norm", "SC overflow"],
           root=gi_root(groups, "over microbatches"), mirrors=SYNC)
equivalent("restated_recompute_preserved", BASES["tp"].title,
           "full recomputation replaying the forward's RNG state (preserve_rng_state, the tracker's states) is "
           "the derived step.", list(BASES["tp"].bind) + ["use full_recompute"], "tp", imports=REC)

# -- gradient bucket layout per rank (check.buckets) --------------------------------------

ORDER = "gradients bucketed in a rank-dependent order (deepspeedai/DeepSpeed#2343, pytorch/pytorch#64629)"
TIE_OFFSETS = "the tied embedding at different buffer offsets on its stages (NVIDIA/Megatron-LM#844)"
for name, b, line, what, mirrors in [
    ("ddp", "ddp", "override grads: bucket_order over (dp)", "DDP buckets in another parameter order on dp ranks "
     "other than 0: every bucket's all-reduce sums elements of different parameters", ORDER),
    ("zero2_dense", "zero2", "override grads[dense]: bucket_order over (dp)", "ZeRO-2's reduce-scatter of the "
     "dense weights' flat buffer, laid out differently per dp rank", ORDER),
    ("hsdp_gpus", "hsdp", "override grads: bucket_order over (gpus)", "HSDP's flat parameters laid out "
     "differently over the shard group", ORDER),
    ("hsdp_nodes", "hsdp", "override grads: bucket_order over (nodes)", "HSDP's replica all-reduce over nodes "
     "pairing shards laid out differently on each node", ORDER),
    ("sp_norms", "sp", "override grads[norms]: bucket_order over (tp)", "the sequence-parallel all-reduce of the "
     "norm weights over tp, bucketed in a different order per tp rank", ORDER),
    ("cp", "cp", "override grads: bucket_order over (cp)", "the gradient reduction over the context ranks, "
     "bucketed in a different order per cp rank", ORDER),
    ("tied_fsdp_4d", "fsdp_4d", "override grads[embedding]: bucket_order over (pp)", "the tied embedding first in "
     "the first stage's buffer and last in the last stage's, reduce-scattered over dp before the tie's all-reduce",
     TIE_OFFSETS),
]:
    mutant(f"buckets_{name}", b, what + f" (`{line.removeprefix('override ')}`).", [line],
           ["GI grads bucket layout"], mirrors=mirrors)
with_base("harmless_buckets_tie_restated_fsdp_4d", "fsdp_4d",
          "the tied embedding's gradient all-reduced over the stages as derived, on the same elements of every "
          "data rank before the reduce-scatter: Megatron-LM's fix (NVIDIA/Megatron-LM#844).",
          ["override embedding: tie_reduce over (pp)"])
with_base("harmless_buckets_restated_reduce_zero2", "zero2",
          "the reduce-scatter over dp restated, every rank's flat buffer in registration order "
          "(deepspeedai/DeepSpeed#2343's fix).", ["override grads: reduce over (dp)"])

# -- activations and activation gradients of tensor-parallel layer regions ---------------

NO_DGRAD = "a column-parallel input gradient never all-reduced (pytorch/torchtitan#1805, NovaSky-AI/SkyRL#1886)"
FULL_TENSOR = "full_tensor()'s gradient declared Replicate (NVIDIA-NeMo/Automodel#1260)"
WORLD = "an all-gather on the world group under TP x DP (huggingface/transformers#43932)"
for name, b, line, expect, what, mirror in [
    ("act_grad_no_reduce_mlp_tp", "tp", "override activation_grads[mlp]: no_reduce", ["GI activation_grads[mlp]"],
     "the MLP's input gradient (Megatron's f in backward) never all-reduced over tp: the layers before it get "
     "one rank's summand.", NO_DGRAD),
    ("act_grad_reduce_copy_head_tp", "tp", "override activation_grads[head]: reduce_copy",
     ["GI activation_grads[head]"], "the output layer's input gradient all-reduced on a copy: the reduction runs "
     "and the gradient that flows on stays partial.", NO_DGRAD),
    ("act_grad_reduce_dp_attention_tp", "tp", "override activation_grads[attention]: reduce over (dp)",
     ["GI activation_grads[attention]"], "the attention input gradient all-reduced over dp instead of tp: "
     "different samples' gradients summed and the tp summands left apart.", WORLD),
    ("act_grad_no_reduce_all_sp", "sp", "override activation_grads: no_reduce",
     [f"GI activation_grads[{r}]" for r in ("attention", "mlp", "head")], "no reduce-scatter of any region's "
     "input gradient under sequence parallelism.", NO_DGRAD),
    ("act_grad_assert_replicate_mlp_sp", "sp", "override activation_grads[mlp]: assert_replicate over (tp)",
     ["GI activation_grads[mlp]"], "the input all-gather's gradient declared Replicate: its backward slices the "
     "partial gradient instead of reduce-scattering it.", FULL_TENSOR),
    ("act_grad_gather_dp_mlp_sp", "sp", "override activation_grads[mlp]: gather over (dp)",
     ["GI activation_grads[mlp]"], "the MLP's output gradient all-gathered over dp, not tp, before the "
     "row-parallel linear's backward.", WORLD),
    ("act_gather_world_mlp_sp", "sp", "override activations[mlp]: gather over (dp, tp)", ["GI activations[mlp]"],
     "the all-gather before the column-parallel linear on the world group: other data ranks' samples gathered "
     "in.", WORLD),
    ("act_gather_missing_attention_sp", "sp", "override activations[attention]: gather over ()",
     ["GI activations[attention]"], "no all-gather of the sequence slices before the QKV projection.", ""),
    ("act_reduce_missing_mlp_sp", "sp", "override activations[mlp]: reduce over ()", ["GI activations[mlp]"],
     "no reduce-scatter after the row-parallel linear: each rank keeps its partial sum.", ""),
    ("act_reduce_twice_mlp_tp", "tp", "override activations[mlp]: reduce over (tp, tp)", ["GI activations[mlp]"],
     "the row-parallel output all-reduced twice over tp: multiplied by tp.", ""),
    ("act_assert_replicate_attention_tp", "tp", "override activations[attention]: assert_replicate over (tp)",
     ["GI activations[attention]"], "the row-parallel output wrapped as DTensor.from_local(..., [Replicate()]) "
     "while it is Partial: no all-reduce, each rank's summand taken for the value.", FULL_TENSOR),
    ("act_assert_shard_mlp_sp", "sp", "override activations[mlp]: assert_shard over (tp)", ["GI activations[mlp]"],
     "the row-parallel output declared Shard while it is Partial: no reduce-scatter.", FULL_TENSOR),
]:
    mutant(name, b, what, [line], expect, mirrors=mirror)
with_base("act_restated_tp", "tp", "Megatron's f and g stated as they are: the row-parallel outputs all-reduced "
          "and the column-parallel input gradients all-reduced over tp.",
          ["override activations: reduce over (tp)", "override activation_grads: reduce over (tp)"])
with_base("act_restated_sp", "sp", "sequence parallelism stated as it is: all-gather before the column-parallel "
          "linears, reduce-scatter after the row-parallel ones, and their conjugates in backward.",
          ["override activations: gather over (tp)", "override activations[mlp]: reduce over (tp)",
           "override activation_grads: gather over (tp)", "override activation_grads: reduce over (tp)"])
with_base("act_from_local_partial_sp", "sp", "the row-parallel output wrapped as DTensor.from_local(..., "
          "[Partial()]) and the input gradient declared Partial: redistributing to the shard the next operation "
          "needs is the reduce-scatter the derivation has.",
          ["override activations: assert_partial over (tp)", "override activation_grads: assert_partial over (tp)"])
# -- the vocabulary-parallel embedding's output reduction --------------------------------

EMB_REPL = "a masked vocabulary-parallel lookup wrapped as Replicate, not Partial (pytorch/pytorch#130725)"
EMB_SLICE = "the embedding's output gradient left in sequence slices (NVIDIA/Megatron-LM#1635)"
for name, b, line, expect, what, mirror in [
    ("emb_reduce_missing_tp", "tp", "override activations[embedding]: reduce over ()", ["GI activations[embedding]"],
     "the vocabulary-parallel embedding's masked lookup never all-reduced: each tensor rank reads the rows of its "
     "own vocabulary slice and zeros elsewhere.", "rank-local soft embeddings not summed (vllm-project/vllm#46212)"),
    ("emb_reduce_world_tp", "tp", "override activations[embedding]: reduce over (dp, tp)",
     ["GI activations[embedding]"], "the embedding's output all-reduced over dp and tp: it adds other samples' "
     "embeddings.", EMB_REPL),
    ("emb_reduce_scatter_missing_sp", "sp", "override activations[embedding]: reduce over ()",
     ["GI activations[embedding]"], "no reduce-scatter of the embedding's partial output into sequence slices.",
     EMB_REPL),
    ("emb_assert_replicate_tp", "tp", "override activations[embedding]: assert_replicate over (tp)",
     ["GI activations[embedding]"], "the masked lookup declared Replicate: no all-reduce.", EMB_REPL),
    ("emb_grad_gather_missing_sp", "sp", "override activation_grads[embedding]: gather over ()",
     ["GI activation_grads[embedding]"], "the output gradient's sequence slices never all-gathered before the "
     "embedding's weight gradient, which reads every position.", EMB_SLICE),
    ("emb_grad_gather_tp", "tp", "override activation_grads[embedding]: gather over (tp)",
     ["GI activation_grads[embedding]"], "an all-gather of the embedding's replicated output gradient under plain "
     "tensor parallelism: n copies of the sequence.", EMB_SLICE),
]:
    mutant(name, b, what, [line], expect, mirrors=mirror)
with_base("emb_from_local_partial_tp", "tp", "the masked lookup wrapped as DTensor.from_local(..., [Partial()]): "
          "redistributing to Replicate is the all-reduce the derivation has.",
          ["override activations[embedding]: assert_partial over (tp)"])
with_base("emb_restated_sp", "sp", "the embedding's reduce-scatter and its gradient's all-gather stated as they are.",
          ["override activations[embedding]: reduce over (tp)",
           "override activation_grads[embedding]: gather over (tp)"])
# -- the vocabulary-parallel cross entropy's all-reduces ----------------------------------

LOSS_BOTH = ["GI activations[loss]", "GI activation_grads[loss]"]
GATHERED = "gathered logits fed to the vocabulary-parallel cross entropy (NVIDIA/Megatron-LM#7452)"
for name, line, expect, what, mirror in [
    ("loss_local_max_tp", "override activations[loss]: reduce_max over ()", LOSS_BOTH,
     "each tensor rank subtracts its own slice's max logit before the sum of exponentials is summed.",
     "the logits_max all-reduce of c_softmax_with_cross_entropy (PaddlePaddle/Paddle#70351)"),
    ("loss_max_dp_only_tp", "override activations[loss]: reduce_max over (dp)", LOSS_BOTH,
     "the max logit all-reduced over dp, not tp: still one local max per tensor rank.",
     "the loss's all-reduces on a group other than the model's tensor group (NVIDIA/Megatron-LM#5128)"),
    ("loss_target_missing_tp", "override activations[loss]: reduce_target over ()", ["GI activations[loss]"],
     "the target's logit never summed: the ranks without the target report a loss from 0; the gradient (softmax "
     "minus the one-hot target, local) is right.", GATHERED),
    ("loss_sumexp_twice_tp", "override activations[loss]: reduce_sumexp over (tp, tp)", LOSS_BOTH,
     "the sum of exponentials summed twice over tp: the loss plus log(tp), the softmax divided by tp.", GATHERED),
    ("loss_sumexp_world_tp", "override activations[loss]: reduce_sumexp over (dp, tp)", LOSS_BOTH,
     "the sum of exponentials all-reduced over dp and tp: other samples' tokens added in.",
     "the loss's all-reduces on a group other than the model's tensor group (NVIDIA/Megatron-LM#5128)"),
]:
    mutant(name, "tp", what, [line], expect, mirrors=mirror)
with_base("loss_max_world_tp", "tp", "the max logit all-reduced over dp and tp: a larger maximum, but one constant "
          "per tensor group, which the cross entropy does not depend on.",
          ["override activations[loss]: reduce_max over (dp, tp)"])
with_base("loss_max_twice_sp", "sp", "the max logit all-reduced twice over tp (MAX is idempotent); the loss's "
          "all-reduces stay all-reduces under sequence parallelism.",
          ["override activations[loss]: reduce_max over (tp, tp)",
           "override activations[loss]: reduce_target over (tp)", "override activations[loss]: reduce_sumexp over (tp)"])
# -- the cross entropy's label smoothing and output z-loss under a vocabulary-parallel head --------------

SMOOTHING = "label smoothing's mean log-probability over the local vocabulary slice (NVIDIA/Megatron-LM#737, #7464)"
ZLOSS = "a z-loss's log-sum-exp of the local logits (NVIDIA/TransformerEngine#2707 takes it from the reduced m, d)"
for name, b, line, expect, what, mirror in [
    ("loss_smoothing_local_tp", "tp", "override activations[loss]: reduce_smoothing over ()", ["GI activations[loss]"],
     "label smoothing's sum of the logits never all-reduced: each tensor rank's mean log-probability is over its "
     "own slice; the gradient (softmax only) is right.", SMOOTHING),
    ("loss_smoothing_world_tp", "tp", "override activations[loss]: reduce_smoothing over (dp, tp)",
     ["GI activations[loss]"], "label smoothing's sum of the logits all-reduced over dp and tp: other samples' "
     "logits added in.", "the loss's all-reduces on a group other than the model's tensor group "
     "(NVIDIA/Megatron-LM#5128)"),
    ("loss_zloss_local_sp", "sp", "override activations[loss]: reduce_zloss over ()", LOSS_BOTH,
     "the z-loss's sum of exponentials never all-reduced: its lse, and so the z-loss and its gradient 2·lse·p, "
     "are each rank's own.", ZLOSS),
    ("loss_zloss_twice_tp", "tp", "override activations[loss]: reduce_zloss over (tp, tp)", LOSS_BOTH,
     "the z-loss's sum of exponentials summed twice over tp: its lse plus log(tp).", ZLOSS),
    ("loss_smoothing_vocab_slice_tp", "tp", "override activations[loss]: smoothing_vocab over ()", LOSS_BOTH,
     "label smoothing's vocabulary size is the slice's, V/t: the mean Σ z / V and the gradient's α/V both read "
     "it.", "label smoothing's vocabulary size read from the partition (NVIDIA/Megatron-LM#7464, "
     "NVIDIA/apex#1457)"),
    ("loss_smoothing_vocab_world_sp", "sp", "override activations[loss]: smoothing_vocab over (dp, tp)", LOSS_BOTH,
     "label smoothing's vocabulary size counted over dp and tp: V·dp.", "label smoothing's vocabulary size "
     "read from the partition (NVIDIA/Megatron-LM#7464)"),
]:
    mutant(name, b, what, [line], expect, mirrors=mirror, model="dense_ce")
for name, b, lines, why in [
    ("loss_ce_terms_derived_tp", "tp", [], "label smoothing and an output z-loss, their all-reduces as derived"),
    ("loss_ce_terms_restated_sp", "sp", ["override activations[loss]: reduce_smoothing over (tp)",
                                         "override activations[loss]: reduce_zloss over (tp)"],
     "label smoothing's and the z-loss's all-reduces stated on the tensor group, as derived"),
    ("loss_smoothing_vocab_tensor_tp", "tp", ["override activations[loss]: smoothing_vocab over (tp)"],
     "label smoothing's vocabulary size counted over the tensor group's slices: the whole vocabulary, as derived "
     "(NVIDIA/Megatron-LM#7466)"),
]:
    equivalent(name, BASES[b].title, why + "; the loss equals the single-device one.", list(BASES[b].bind) + lines, b,
               model="dense_ce")
IGNORED = "ignored tokens counted in the normaliser (huggingface/transformers#46204, meta-pytorch/torchtune#1875)"
for name, b in [("tokens_count_ignored_ddp", "ddp"), ("tokens_count_ignored_cp", "cp")]:
    mutant(name, b, "the token count includes the tokens whose label is ignored (`tokens: count_ignored`): the "
           "normaliser is T + Q.", ["override tokens: count_ignored"],
           gi(["dense", "norms", "biases", "embedding"], "normalisation"), mirrors=IGNORED)
NO_IGNORE = ("a cross entropy without ignore_index (NVIDIA/TransformerEngine#1789, deepspeedai/DeepSpeed#6882, "
             "EleutherAI/oslo#85)")
for name, b in [("tokens_ignored_in_loss_ddp", "ddp"), ("tokens_ignored_in_loss_tp", "tp")]:
    mutant(name, b, "the loss sums the terms of the tokens whose label is ignored (`tokens: ignored_in_loss`): no "
           "ignore_index and no loss mask.", ["override tokens: ignored_in_loss"],
           gi(["dense", "norms", "biases", "embedding"], "ignored tokens' terms"), mirrors=NO_IGNORE)
# -- the MoE token dispatch and combine all-to-alls ---------------------------------------

WRONG_EP = "the MoE all-to-all on a wrongly built expert group (deepspeedai/DeepSpeed#1942)"
for name, b, lines, expect, what in [
    ("moe_dispatch_dp_ep", "ep", ["override activations[experts]: dispatch over (dp)",
                                  "override activations[experts]: combine over (dp)"], ["GI activations[experts]"],
     "the dispatch and combine all-to-alls over dp, not ep: each token meets its own rank's expert."),
    ("moe_dispatch_missing_ep", "ep", ["override activations[experts]: dispatch over ()"], ["GI activations[experts]"],
     "no dispatch all-to-all: each token runs through its own rank's expert and the combine scatters the outputs."),
    ("moe_combine_world_ep", "ep", ["override activations[experts]: combine over (dp, ep)"],
     ["GI activations[experts]"], "the combine over dp and ep, the dispatch over ep: outputs return to another "
     "data rank's tokens."),
    ("moe_grads_dp_moe_3d", "moe_3d", ["override activation_grads[experts]: combine over (dp)",
                                       "override activation_grads[experts]: dispatch over (dp)"],
     ["GI activation_grads[experts]"], "the backward all-to-alls over dp: the output gradients never reach their "
     "experts."),
]:
    mutant(name, b, what, lines, expect, mirrors=WRONG_EP)
mutant("moe_all_to_all_tensor_ranks", "moe_3d", "both forward all-to-alls over tp and ep, tp without sequence "
       "parallelism: the tensor ranks hold the same tokens, the exchange gives each another one, and the experts' "
       "shards summed over tp add up different tokens.",
       ["override activations[experts]: dispatch over (tp, ep)", "override activations[experts]: combine over (tp, ep)"],
       ["GI activations[experts]"],
       mirrors="the MoE token exchange widened to the tensor ranks before their psum (vllm-project/tpu-inference#2248)")
with_base("moe_all_to_all_tensor_twice", "moe_3d", "the dispatch and the combine each pass twice over tp (and once "
          "over ep): the tensor ranks hold their own tokens again before the experts' shards are summed.",
          ["override activations[experts]: dispatch over (tp, ep, tp)",
           "override activations[experts]: combine over (tp, ep, tp)"])
with_base("moe_restated_ep", "ep", "the dispatch and combine all-to-alls and their conjugates stated as derived, "
          "over ep.", ["override activations[experts]: dispatch over (ep)",
                       "override activations[experts]: combine over (ep)",
                       "override activation_grads[experts]: combine over (ep)",
                       "override activation_grads[experts]: dispatch over (ep)"])
with_base("moe_all_to_all_world_ep", "ep", "both all-to-alls over dp and ep: each token goes to a data-parallel "
          "replica of its expert and back (more bytes, the same values).",
          ["override activations[experts]: dispatch over (dp, ep)",
           "override activations[experts]: combine over (dp, ep)"])
# -- context parallelism's key/value exchange and the reduce-scatter of their gradients ---

RING_DKV = "the ring attention's dK, dV not returned summed to their owners (NVIDIA/Megatron-LM#1464)"
STALE_KV = "the ring attention backward on the first step's saved K, V (huggingface/diffusers#14265)"
RING_GROUP = "the ring built over the wrong ranks with tp > 1 (hpcaitech/ColossalAI#6071)"
for name, b, lines, expect, what, mirror in [
    ("cp_dkv_no_reduce", "cp", ["override activation_grads[context]: no_reduce"], ["GI activation_grads[context]"],
     "the key/value gradients never summed over cp: each block's gradient from one rank's queries only.", RING_DKV),
    ("cp_dkv_reduce_copy", "cp", ["override activation_grads[context]: reduce_copy"],
     ["GI activation_grads[context]"], "the key/value gradients summed into a copy; the gradient that flows on is "
     "the rank's own contribution.", RING_DKV),
    ("cp_kv_backward_local", "cp", ["override activation_grads[context]: gather over ()"],
     ["GI activation_grads[context]"], "the backward reads only the rank's own key/value block.", STALE_KV),
    ("cp_kv_forward_local", "cp_zero3", ["override activations[context]: gather over ()"],
     ["GI activations[context]"], "no key/value exchange in forward: each query attends to its own block only.",
     STALE_KV),
    ("cp_ring_over_tp", "4d", ["override activations[context]: gather over (cp, tp)",
                               "override activation_grads[context]: reduce over (cp, tp)"],
     ["GI activations[context]", "GI activation_grads[context]"], "the ring over cp and tp: other heads' key/value "
     "blocks attended to and their gradients summed in.", RING_GROUP),
    ("cp_ring_over_dp", "cp", ["override activations[context]: gather over (dp)"], ["GI activations[context]"],
     "the key/value ring over dp: other samples' blocks.", RING_GROUP),
]:
    mutant(name, b, what, lines, expect, mirrors=mirror)
with_base("cp_restated", "cp", "the key/value exchange in forward and backward and the gradients' reduce-scatter "
          "stated as derived, over cp.", ["override activations[context]: gather over (cp)",
                                          "override activation_grads[context]: gather over (cp)",
                                          "override activation_grads[context]: reduce over (cp)"])
with_base("cp_restated_4d", "4d", "context parallelism's exchange stated over cp in a 4D plan; the statements "
          "without a region state the tensor-parallel regions only.",
          ["override activations[context]: gather over (cp)", "override activation_grads[context]: reduce over (cp)",
           "override activation_grads: reduce over (tp)"])
# -- Ulysses: the all-to-all before the attention and its inverse after it ---------------

ULYSSES_WORLD = "the Ulysses all-to-all over the whole world, not the sequence-parallel group (deepspeedai/DeepSpeed#7672)"
ULYSSES_BATCH = "the Ulysses all-to-all crossing the samples of a batch (deepspeedai/DeepSpeed#5808)"
for name, b, lines, expect, what, mirror in [
    ("ulysses_over_dp_cp", "cp", ["override activations[context]: all_to_all over (dp, cp)",
                                  "override activation_grads[context]: all_to_all over (dp, cp)"],
     ["GI activations[context]", "GI activation_grads[context]"], "Ulysses' all-to-alls over dp and cp: each "
     "attention reads heads of other samples' positions.", ULYSSES_WORLD),
    ("ulysses_over_tp_cp", "4d", ["override activations[context]: all_to_all over (cp, tp)"],
     ["GI activations[context]"], "Ulysses' all-to-all over cp and tp: the tensor ranks' heads are other heads.",
     ULYSSES_WORLD),
    ("ulysses_none", "cp", ["override activations[context]: all_to_all over ()"], ["GI activations[context]"],
     "no all-to-all: each rank attends over its own block only.", ULYSSES_BATCH),
    ("ulysses_twice", "cp", ["override activation_grads[context]: all_to_all over (cp, cp)"],
     ["GI activation_grads[context]"], "two all-to-all passes over cp in backward: the second splits the heads again, no inverse of the first.",
     ULYSSES_BATCH),
    ("ulysses_dkv_reduced_again", "cp", ["override activation_grads[context]: all_to_all over (cp)",
                                         "override activation_grads[context]: reduce over (cp)"],
     ["GI activation_grads[context]"], "the ring's reduce-scatter of dK, dV kept after Ulysses' inverse all-to-all "
     "returned them to their owners.", ULYSSES_BATCH),
]:
    mutant(name, b, what, lines, expect, mirrors=mirror)
with_base("ulysses_cp", "cp", "Ulysses' all-to-all pair over cp in forward and backward in place of the ring.",
          ["override activations[context]: all_to_all over (cp)",
           "override activation_grads[context]: all_to_all over (cp)"])
with_base("ulysses_forward_ring_backward", "cp_zero3", "Ulysses in forward, the derived ring in backward.",
          ["override activations[context]: all_to_all over (cp)"])
ULYSSES_PAIR = ["override activations[context]: all_to_all over (cp)",
                "override activation_grads[context]: all_to_all over (cp)"]
mutant("ulysses_heads_floor", "cp", "the heads split by floor division over the Ulysses group: for a group of 64 "
       "the 32 heads give every rank none.", ULYSSES_PAIR + ["override heads: floor"],
       ["GI heads[forward]", "GI heads[backward]"],
       mirrors="a floor head split beside DeepSpeed's uneven all-to-all (deepspeedai/DeepSpeed#6392)")
with_base("ulysses_heads_uneven", "cp", "DeepSpeed's uneven head split stated where the group divides the heads.",
          ULYSSES_PAIR + ["override heads: uneven"])
with_base("ulysses_heads_chunk_backward", "cp", "chunks of ceil(32/g) in backward, the uneven split in forward: for "
          "every g the model's shapes take (a power of two) the two give every rank the same heads.",
          ULYSSES_PAIR + ["override heads[forward]: uneven", "override heads[backward]: chunk"])
with_base("ulysses_kv_split_mha", "cp", "the kv heads split like the query heads, which they equal in number.",
          ULYSSES_PAIR + ["override heads: chunk", "override heads[kv]: split"])
with_base("ulysses_cp_4d", "4d", "Ulysses' all-to-all pair over cp in a 4D plan; the tensor ranks keep their heads.",
          ["override activations[context]: all_to_all over (cp)",
           "override activation_grads[context]: all_to_all over (cp)", "override activation_grads[context]: no_reduce"])
# -- the layout of context parallelism's blocks and the tensors that must follow it ---------

ZZ_LABELS = "labels shifted after the load-balanced split (NVIDIA-BioNeMo/bionemo-recipes#1449)"
ZZ_POS = "rotary positions not permuted with the zigzag chunks (NVIDIA/Megatron-LM#5243)"
ZZ_MASK = "the causal mask built from row indices under load balancing (AI-Hypercomputer/maxtext#4364)"
ZZ_LOSS = "the loss mask cut contiguously under zigzag context parallelism (THUDM/slime#73)"
for name, b, lines, expect, what, mirror in [
    ("cp_zigzag_labels_contiguous", "cp", ["override layout[inputs]: zigzag", "override layout[labels]: contiguous"],
     ["GI layout[labels]"], "zigzag inputs, contiguous labels: a rank's loss reads other tokens' labels.", ZZ_LABELS),
    ("cp_zigzag_positions_contiguous", "cp_zero3", ["override layout: zigzag",
                                                     "override layout[position_ids]: contiguous"],
     ["GI layout[position_ids]"], "zigzag inputs, contiguous position ids: the back chunk rotated at the wrong "
     "positions.", ZZ_POS),
    ("cp_zigzag_mask_contiguous", "4d", ["override layout: zigzag", "override layout[causal_mask]: contiguous"],
     ["GI layout[causal_mask]"], "zigzag inputs, a causal mask for the contiguous layout: queries miss earlier keys "
     "and see later ones.", ZZ_MASK),
    ("cp_loss_mask_zigzag_only", "cp", ["override layout[loss_mask]: zigzag"], ["GI layout[loss_mask]"],
     "contiguous inputs, a loss mask permuted as if they were zigzag.", ZZ_LOSS),
]:
    mutant(name, b, what, lines, expect, mirrors=mirror)
with_base("cp_zigzag", "cp", "the zigzag layout with every per-token tensor and the causal mask permuted alike "
          "(the order of each rank's tokens changes, not their values).", ["override layout: zigzag"])
with_base("cp_zigzag_restated", "4d", "the zigzag layout stated for the inputs and restated for every tensor that "
          "follows them.", ["override layout[inputs]: zigzag", "override layout[labels]: zigzag",
                            "override layout[loss_mask]: zigzag", "override layout[position_ids]: zigzag",
                            "override layout[causal_mask]: zigzag"])
with_base("cp_contiguous_stated", "cp_zero3", "the contiguous layout stated (as derived).",
          ["override layout: contiguous"])
THD_SPLIT = "a packed batch cut as one sequence under document-wise THD attention (NVIDIA-NeMo/Speech#15339)"
for name, b, lines, expect, what in [
    ("cp_thd_batch_cut_whole", "cp", ["override layout: zigzag", "override layout[causal_mask]: zigzag_per_document"],
     ["GI layout[causal_mask]"], "the batch cut as one zigzag sequence, the attention cutting each packed document: a "
     "query's keys are another document's."),
    ("cp_thd_positions_cut_whole", "4d", ["override layout: zigzag_per_document",
                                          "override layout[position_ids]: zigzag"],
     ["GI layout[position_ids]"], "packed documents cut one by one, their position ids cut as one sequence."),
    ("cp_thd_labels_contiguous", "cp_zero3", ["override layout: zigzag_per_document",
                                              "override layout[labels]: contiguous"],
     ["GI layout[labels]"], "packed documents cut one by one, the labels cut in contiguous blocks."),
]:
    mutant(name, b, what, lines, expect, mirrors=THD_SPLIT)
with_base("cp_thd_per_document", "cp", "packed documents (THD) with every per-token tensor and the causal mask cut "
          "document by document.", ["override layout: zigzag_per_document"])
DOC_MAJOR = "PyTorch's per-document head-tail balancer, document-major against rank-major (pytorch/pytorch#189902)"
UNPADDED = "a per-document cut at the unpadded boundaries under padded documents (NVIDIA/Megatron-LM#4495)"
for name, b, lines, expect, what, mirror in [
    ("cp_block_mask_document_major", "cp", ["override layout: zigzag_per_document",
                                            "override layout[causal_mask]: zigzag_document_major"],
     ["GI layout[causal_mask]"], "the batch rearranged rank-major, the block mask document-major.", DOC_MAJOR),
    ("cp_positions_rank_major_under_document_major", "4d", ["override layout: zigzag_document_major",
                                                            "override layout[position_ids]: zigzag_per_document"],
     ["GI layout[position_ids]"], "document-major inputs, position ids sharded rank-major.", DOC_MAJOR),
    ("cp_labels_unpadded", "cp_zero3", ["override layout: zigzag_per_document",
                                        "override layout[labels]: zigzag_per_document_unpadded"],
     ["GI layout[labels]"], "padded documents cut at their padded boundaries, the labels at the unpadded ones.", UNPADDED),
    ("cp_inputs_unpadded_mask_padded", "cp", ["override layout: zigzag_per_document_unpadded",
                                              "override layout[causal_mask]: zigzag_per_document"],
     ["GI layout[causal_mask]"], "the batch cut at the unpadded boundaries, the THD attention at the padded ones.",
     UNPADDED),
]:
    mutant(name, b, what, lines, expect, mirrors=mirror)
with_base("cp_document_major_everywhere", "cp", "PyTorch's document-major per-document balancer for the batch and the "
          "block mask alike: imbalanced, the single-device step.", ["override layout: zigzag_document_major"])
with_base("cp_unpadded_everywhere", "4d", "every per-token tensor and the causal mask cut at the unpadded boundaries "
          "alike.", ["override layout: zigzag_per_document_unpadded"])
SHORT = "documents whose real length is not a multiple of 2c (NVIDIA/TransformerEngine#1929, #3331; ISEEKYAN/mbridge#158)"
for name, b, lines, expect, what in [
    ("cp_short_mask_truncated", "cp", ["override layout: pad_to_chunks", "override layout[causal_mask]: truncate_to_chunks"],
     ["GI layout[causal_mask]"], "documents padded to a multiple of 2c, the attention given each valid length divided by c."),
    ("cp_short_truncated_everywhere", "4d", ["override layout: truncate_to_chunks"],
     ["GI layout[loss_mask]", "GI layout[causal_mask]"], "every valid length divided by c: real tokens dropped."),
    ("cp_short_unequal_positions_padded", "cp", ["override layout: cut_unequal",
                                                 "override layout[position_ids]: pad_to_chunks"],
     ["GI layout[position_ids]"], "the unpadded tokens cut into unequal chunks, the position ids on the padded cut."),
]:
    mutant(name, b, what, lines, expect, mirrors=SHORT)
with_base("cp_short_padded_everywhere", "cp", "every document padded to a multiple of 2c and cut per document, every "
          "per-token tensor alike.", ["override layout: pad_to_chunks"])
with_base("cp_short_unequal_everywhere", "4d", "the unpadded tokens cut into unequal chunks, every per-token tensor "
          "and the causal mask alike (imbalanced, the single-device step).", ["override layout: cut_unequal"])
PTRR = "PyTorch's processing-time round-robin balancer computed from the mask, beside a head-tail one (pytorch/pytorch#163617)"
for name, b, lines, expect, what in [
    ("cp_ptrr_labels_head_tail", "cp", ["override layout: ptrr", "override layout[labels]: zigzag"],
     ["GI layout[labels]"], "the batch rearranged by the balancer computed from the mask, the labels by the head-tail one."),
    ("cp_ptrr_block_mask_per_document", "4d", ["override layout: ptrr",
                                               "override layout[causal_mask]: zigzag_per_document"],
     ["GI layout[causal_mask]"], "the batch rearranged by the balancer computed from the mask, the block mask per document."),
    ("cp_positions_ptrr_under_rank_major", "cp_zero3", ["override layout: zigzag_per_document",
                                                        "override layout[position_ids]: ptrr"],
     ["GI layout[position_ids]"], "packed documents cut rank-major, the position ids by the balancer computed from the mask."),
]:
    mutant(name, b, what, lines, expect, mirrors=PTRR)
with_base("cp_ptrr_everywhere", "cp", "every per-token tensor and the block mask rearranged by the one balancer computed "
          "from the mask.", ["override layout: ptrr", "override layout[labels]: ptrr"])
WINDOW = ("the sliding window under context parallelism dropped (huggingface/accelerate#4177), compared on local slots "
          "(open-lm-engine/lm-engine#447) or applied on the diagonal block only (NVIDIA/Megatron-LM#1160)")
for name, b, lines, what in [
    ("cp_window_dropped", "cp", ["override layout: zigzag", "override layout[causal_mask]: window_dropped"],
     "a window of 512 under zigzag CP, the ranks' masks causal without it."),
    ("cp_window_local_slots", "cp_zero3", ["override layout[causal_mask]: window_local"],
     "a window of 512 under contiguous CP, compared between the ranks' local slots."),
    ("cp_window_on_diagonal", "cp", ["override layout: zigzag", "override layout[causal_mask]: window_on_diagonal"],
     "a window of 512 under zigzag CP, applied on each rank's own block only."),
]:
    mutant(name, b, what, lines, ["GI layout[window]"], mirrors=WINDOW, model="dense_window")
equivalent("cp_window_zigzag", BASES["cp"].title, "a window of 512 under zigzag CP, every rank's mask on the global "
           "positions.", list(BASES["cp"].bind) + ["override layout: zigzag"], "cp", model="dense_window")
equivalent("cp_window_whole_sequence_dropped", BASES["cp"].title, "a window as long as the sequence dropped by the ranks: "
           "it never binds, causal attention is the window's.", list(BASES["cp"].bind)
           + ["override layout[causal_mask]: window_dropped"], "cp", model="dense_window_whole")
mutant("cp_window_across_documents", "cp", "a window of 512 over packed documents cut per document, the ranks' masks "
       "without the document mask.", ["override layout: zigzag_per_document",
                                      "override layout[causal_mask]: window_across_documents"], ["GI layout[window]"],
       mirrors="the sliding window applied without the packed documents' mask (AI-Hypercomputer/maxtext#5001)",
       model="dense_window")
equivalent("cp_window_per_document", BASES["cp"].title, "a window of 512 over packed documents cut per document, every "
           "rank's mask on the global positions within each document.", list(BASES["cp"].bind)
           + ["override layout: zigzag_per_document"], "cp", model="dense_window")
equivalent("cp_window_ptrr", BASES["cp"].title, "a window of 512 over packed documents, the balancer reading the "
           "windowed mask.", list(BASES["cp"].bind) + ["override layout: ptrr"], "cp", model="dense_window")
CHUNK = ("chunked attention under context parallelism dropped (huggingface/accelerate#4177), cut on local slots "
         "(nod-ai/amd-shark-ai#1452) or applied on the diagonal block only (NVIDIA/TransformerEngine#1887)")
for name, b, lines, what in [
    ("cp_chunk_dropped", "cp", ["override layout: zigzag", "override layout[causal_mask]: chunk_dropped"],
     "chunks of 512 under zigzag CP, the ranks' masks causal without them."),
    ("cp_chunk_local_slots", "cp_zero3", ["override layout[causal_mask]: chunk_local"],
     "chunks of 512 under contiguous CP, cut on the ranks' local slots."),
    ("cp_chunk_on_diagonal", "cp", ["override layout: zigzag", "override layout[causal_mask]: chunk_on_diagonal"],
     "chunks of 512 under zigzag CP, the boundary applied on each rank's own block only."),
]:
    mutant(name, b, what, lines, ["GI layout[chunk]"], mirrors=CHUNK, model="dense_chunk")
equivalent("cp_chunk_zigzag", BASES["cp"].title, "chunks of 512 under zigzag CP, every rank's mask on the global "
           "positions.", list(BASES["cp"].bind) + ["override layout: zigzag"], "cp", model="dense_chunk")
equivalent("cp_chunk_whole_sequence_dropped", BASES["cp"].title, "one chunk as long as the sequence dropped by the "
           "ranks: it never binds, causal attention is the chunk's.", list(BASES["cp"].bind)
           + ["override layout[causal_mask]: chunk_dropped"], "cp", model="dense_chunk_whole")
# -- the expert tensor group's all-gather and reduce-scatter of the routed tokens ---------

ETP_NO_RS = "the gathered tokens' backward without a reduce-scatter (pytorch/torchtitan#1805)"
ETP_SLICE = "full_tensor()'s gradient declared Replicate over the expert group (NVIDIA-NeMo/Automodel#1260)"
ETP_PSUM = "partial outputs of unrelated tokens summed (vllm-project/tpu-inference#2248)"
for name, lines, expect, what, mirror in [
    ("etp_grad_no_reduce", ["override activation_grads[experts]: no_reduce"], ["GI activation_grads[experts] over (x)"],
     "the routed tokens' input gradient never reduce-scattered over the expert tensor group x.", ETP_NO_RS),
    ("etp_grad_assert_replicate", ["override activation_grads[experts]: assert_replicate over (x)"],
     ["GI activation_grads[experts] over (x)"], "the input gradient declared Replicate: sliced, not summed, over x.",
     ETP_SLICE),
    ("etp_tokens_not_gathered", ["override activations[experts]: gather over ()"], ["GI activations[experts] over (x)"],
     "the routed tokens never gathered over x: each expert slice sees its own rank's tokens.", ETP_PSUM),
    ("etp_gather_dense_tp", ["override activations[experts]: gather over (tp)",
                             "override activations[experts]: reduce over (tp)"],
     ["GI activations[experts] over (x)"], "the tokens gathered and reduce-scattered over the dense tensor group tp, "
     "not the expert tensor group x.", ETP_PSUM),
]:
    mutant(name, "moe_etp", what, lines, expect, mirrors=mirror)
with_base("etp_restated", "moe_etp", "the expert tensor group's all-gather and reduce-scatter, forward and "
          "backward, stated as derived over x.", ["override activations[experts]: gather over (x)",
                                                  "override activations[experts]: reduce over (x)",
                                                  "override activation_grads[experts]: gather over (x)",
                                                  "override activation_grads[experts]: reduce over (x)"])
with_base("etp_from_local_partial", "moe_etp", "the input gradient declared Partial over x: the redistribution is "
          "the derived reduce-scatter.", ["override activation_grads[experts]: assert_partial over (x)"])
# -- optimizers whose update needs whole matrices (Muon) ----------------------------------

MUON = ["optimizer {", "  matrices = muon(ns_steps = 5)", "}"]
SHARD_LOCAL = "Muon run on each rank's local shard of a matrix (examples/bugs/muon_zero1_local_shards.place)"
TP_LOCAL = "Muon's blockwise tensor-parallel mode: each tensor rank orthogonalises its own block (Megatron-LM)"
MATS = ("attention", "kv", "mlp")
for name, b, lines, groups, mirrors in [
    ("zero1", "zero1", [], ["dense"], SHARD_LOCAL),
    ("zero3", "zero3", [], ["dense"], SHARD_LOCAL),
    ("fsdp", "fsdp", [], ["dense"], SHARD_LOCAL),
    ("tp", "tp", [], MATS, TP_LOCAL),
    ("sp_gather_dp_only", "sp", ["override optimizer: gather over (dp)"], MATS, TP_LOCAL),
    ("tp_gather_tp_only_fsdp", "fsdp_tp", ["override optimizer: gather over (tp)"], MATS, SHARD_LOCAL),
]:
    mutant(f"muon_cut_{name}", b,
           f"Muon on the weight matrices with {', '.join(groups)} still cut where no gather or owner reaches: each "
           "rank orthogonalises a piece, which is not the piece of the orthogonalised matrix.",
           MUON + lines, [f"SC optimizer[{g}] whole matrices" for g in groups], mirrors=mirrors)
mutant("muon_cut_experts_moe_3d", "moe_3d",
       "Muon on the experts, whose matrices Megatron TP splits over tp (expert parallelism keeps each expert whole "
       "on its ep rank, tensor parallelism does not).",
       ["optimizer {", "  experts = muon(ns_steps = 5)", "}"], ["SC optimizer[experts] whole matrices"],
       mirrors=TP_LOCAL)

for name, b, lines, imports, why in [
    ("ddp", "ddp", [], (), "every DDP rank holds each whole matrix and its whole gradient"),
    ("zero1_gather", "zero1", ["override optimizer: gather over (dp)"], (),
     "each whole gradient matrix all-gathered over dp before Newton–Schulz, each rank keeping its shard "
     "(distributed Muon, ZeRO-1 style)"),
    ("zero3_owners", "zero3", ["override optimizer: round_robin over (dp)"], (),
     "each matrix's state held whole by one dp rank, which orthogonalises it"),
    ("tp_gather", "tp", ["override optimizer: gather over (tp)"], (),
     "each matrix's pieces gathered over tp, orthogonalised whole on every tensor rank (Megatron-LM's duplicated "
     "mode)"),
    ("sp_gather_both", "sp", ["override optimizer: gather over (dp, tp)"], (),
     "each matrix gathered over both axes that cut it: the ZeRO-1 shard over dp and the tensor split over tp"),
    ("sp_owners_tp_gather_dp", "sp", ["override optimizer: gather over (dp)", "override optimizer: round_robin over (tp)"],
     (), "each matrix gathered over dp and owned whole by one tensor rank"),
    ("fsdp_tp_owners", "fsdp_tp", ["override optimizer: round_robin over (dp, tp)"], (),
     "each matrix owned by one rank of dp × tp, its pieces sent to it and the results back"),
]:
    bb = BASES[b]
    equivalent(f"muon_{name}", f"{bb.title} with Muon on the weight matrices",
               why + "; every update sees the whole matrix, as on one device.", list(bb.bind) + MUON + lines, b,
               imports=imports)
equivalent("muon_library_zero1", "ZeRO-1 with Muon on the weight matrices",
           "std.optimizer's muon_zero1: ZeRO-1 whose whole-matrix update gathers each matrix over the data axis.",
           ["dp: muon_zero1"] + MUON, "zero1", imports=("from std.optimizer import muon_zero1",))
equivalent("muon_library_round_robin", "ZeRO-1 with Muon on the weight matrices",
           "std.optimizer's muon_round_robin: each whole matrix owned by one data rank in turn.",
           ["dp: muon_round_robin"] + MUON, "zero1", imports=("from std.optimizer import muon_round_robin",))
equivalent("muon_one_kv_head_tp", "DDP x Megatron TP with Muon on the K/V weights",
           "one K/V head copied whole on every tensor rank: its matrices are not cut by tp.",
           list(BASES["mqa_tp"].bind) + ["optimizer {", "  kv = muon(ns_steps = 5)", "}"], "mqa_tp")
equivalent("muon_experts_ep", "DDP x expert parallelism with Muon on the experts",
           "expert parallelism hands each ep rank whole experts: their matrices are not cut.",
           list(BASES["ep"].bind) + ["optimizer {", "  experts = muon(ns_steps = 5)", "}"], "ep")

# -- operations on the row-parallel output before its reduction (check.actpartial) ----------

PARTIAL_BIAS = "the bias fused into the row-parallel GEMM before the all-reduce (NVIDIA/TransformerEngine#2230)"
PARTIAL_RESIDUAL = "the residual added on every rank before the all-reduce (mirage-project/mirage#722)"
PARTIAL_NORM = "an RMSNorm applied to each rank's partial sum (vllm-project/vllm-ascend#14345)"
for name, b, lines, regions, verb, what, mirror in [
    ("bias_before_reduce_tp", "tp", ["override activations: bias_before_reduce over (tp)"], ("attention", "mlp"),
     "bias_before_reduce", "every row-parallel linear's bias added on each tensor rank before the all-reduce: the "
     "output holds tp·b.", PARTIAL_BIAS),
    ("bias_before_reduce_second_tensor_axis", "gqa_tp2", ["override activations[mlp]: bias_before_reduce over (tl)"],
     ("mlp",), "bias_before_reduce", "fc2's bias added after the sum over tp but before the one over tl: tl·b.",
     PARTIAL_BIAS),
    ("residual_before_reduce_sp", "sp", ["override activations[attention]: residual_before_reduce over (tp)"],
     ("attention",), "residual_before_reduce", "the residual added to the output projection's partial sum on "
     "each tensor rank before the reduce-scatter: tp·residual.", PARTIAL_RESIDUAL),
    ("nonlinear_before_reduce_3d", "3d", ["override activations[mlp]: nonlinear_before_reduce over (tp)"],
     ("mlp",), "nonlinear_before_reduce", "a norm applied to each tensor rank's partial fc2 output before the "
     "reduce-scatter: Σ f(p_i), not f(Σ p_i).", PARTIAL_NORM),
]:
    mutant(name, b, what, lines, [f"GI activations[{r}]: {verb}" for r in regions], mirrors=mirror)
mutant("residual_grad_before_reduce_tp", "tp",
       "the residual's gradient added to the column-parallel linear's partial input gradient on each tensor rank "
       "before the all-reduce: tp·dy.", ["override activation_grads[mlp]: residual_before_reduce over (tp)"],
       ["GI activation_grads[mlp]: residual_before_reduce"], mirrors=PARTIAL_RESIDUAL)
# the embedding's masked lookup and the experts' partial output (check.actpartial_regions)
for name, b, line, region, verb, what in [
    ("embedding_positional_before_reduce_tp", "tp", "activations[embedding]: positional_before_reduce over (tp)",
     "embedding", "positional_before_reduce", "positional embeddings added to each tensor rank's masked lookup "
     "before the embedding's all-reduce: tp·pos."),
    ("embedding_layernorm_before_reduce_sp", "sp", "activations[embedding]: nonlinear_before_reduce over (tp)",
     "embedding", "nonlinear_before_reduce", "an embedding LayerNorm applied to each tensor rank's masked lookup "
     "before the reduce-scatter: the ranks without the token add the shift β (bigscience-workshop/"
     "Megatron-DeepSpeed#191)."),
    ("experts_shared_before_reduce_3d", "moe_3d", "activations: shared_before_reduce over (tp)", "experts",
     "shared_before_reduce", "the shared expert's reduced output added to each tensor rank's partial routed output "
     "before the all-reduce: tp·shared (vllm-project/vllm#49122)."),
    ("experts_bias_before_reduce_etp", "moe_etp", "activations[experts]: bias_before_reduce over (x)", "experts",
     "bias_before_reduce", "the experts' output bias added on each expert tensor rank before the reduce-scatter "
     "over x: x·b (pytorch/torchtitan#4245)."),
]:
    mutant(name, b, what, [f"override {line}"], [f"GI activations[{region}]: {verb}"])
with_base("embedding_scale_before_reduce_tp", "tp", "the embedding scale sqrt(hidden) applied to each tensor rank's "
          "masked lookup before the all-reduce is linear: c·Σ p_i = Σ c·p_i.",
          ["override activations[embedding]: scale_before_reduce over (tp)"])
with_base("experts_gate_scale_before_reduce_etp", "moe_etp", "the combine's gate weights applied to each expert tensor "
          "rank's partial output before the reduce-scatter are a linear scale.",
          ["override activations[experts]: scale_before_reduce over (x)"])

# ---------------------------------------------------------------------------------------


def files() -> dict[str, str]:
    out = {}
    for m in MUTANTS:
        out[f"mutants/{m.name}.place"] = m.text()
    for e in EQUIVALENTS:
        out[f"equivalent/{e.name}.place"] = e.text()
    assert len(out) == len(MUTANTS) + len(EQUIVALENTS), "duplicate names"
    return out


def write(outdir: Path) -> None:
    for sub in ("mutants", "equivalent"):
        (outdir / sub).mkdir(parents=True, exist_ok=True)
        for old in (outdir / sub).glob("*.place"):
            old.unlink()
    for rel, text in files().items():
        (outdir / rel).write_text(text)


with_base("sets_axes_dp_groups_tp", "tp", "the dense gradient's data parallel groups listed by hand over the "
          "flattened (dp, tp) ranks, one tensor shard on every dp rank ([0, 8, ..., 56], [1, 9, ..., 57], ...): "
          "exactly the derived reduction groups.",
          [f"override grads[dense]: reduce_sets over (dp, tp) ranks ({DP_GROUPS})"])

HSDP_NODES = ", ".join("[" + ", ".join(str(8 * n + g) for g in range(8)) + "]" for n in range(4))
HSDP_DIAGONAL = ", ".join("[" + ", ".join(str(8 * ((n + g) % 4) + g) for g in range(8)) + "]" for n in range(4))
with_base("clip_sets_axes_shard_groups_hsdp", "hsdp", "the grad norm's squared norms all-reduced within the shard "
          "group of each node listed by hand over the flattened (nodes, gpus) ranks ([0 .. 7], [8 .. 15], ...): each "
          "set sums every gpu shard once.", [f"override clip_norm: reduce_sets over (nodes, gpus) ranks ({HSDP_NODES})"])
with_base("clip_sets_axes_diagonal_hsdp", "hsdp", "the grad norm's squared norms all-reduced within sets that take "
          "gpu g from node (n + g) mod 4 ([0, 9, 18, 27, 4, 13, 22, 31], ...): each set holds one device of every "
          "gpu shard, and the nodes hold equal copies of it, so every rank sums each shard once.",
          [f"override clip_norm: reduce_sets over (nodes, gpus) ranks ({HSDP_DIAGONAL})"])


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
