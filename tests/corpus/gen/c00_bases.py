"""The corpus generator's models, base plans, the mutant registry and the placement-only bugs (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # tests/corpus: where the generated files go

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
    # a multi-token-prediction block (its stage placed by the plan: embedding: mtp_stage), tied or not
    "tied_mtp_block": (MODELS["tied"][0].replace("    tied_embeddings", "    mtp_layers = 1\n    tied_embeddings"),)
    + MODELS["tied"][1:],
    "dense_mtp_block": (MODELS["dense"][0].replace("    vocab = 50304\n", "    vocab = 50304\n    mtp_layers = 1\n"),)
    + MODELS["dense"][1:],
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


def mutants(*rows):
    """A table of mutants, one ``mutant`` per row: (name, base, what, lines, expect) and, where it mirrors a real bug,
    the bug."""
    for name, base_name, what, lines, expect, *mirrors in rows:
        mutant(name, base_name, what, lines, expect, mirrors=mirrors[0] if mirrors else "")


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

