"""The corpus generator's equivalents of the capacity step and the router; mutants of the initial state, optimizer identity, RNG state and bucket layout (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import BASES, gi, gi_root, mutant
from .c03_equivalents import equivalent, with_base

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
ZERO_GRAD = "the gradients never cleared between optimizer steps (deepspeedai/DeepSpeed#7837, meta-pytorch/torchforge#71)"
for b in ["ddp", "zero1", "tp", "gpipe"]:
    groups = BASES[b].all_groups()
    mutant(f"state_no_zero_grad_{b}", b, "the gradient buffers never cleared between optimizer steps (`grads: "
           "no_zero_grad`): every update from the second step on reads the sum of all earlier steps' gradients.",
           ["override grads: no_zero_grad"], gi(groups, "across steps"), root=gi_root(groups, "across steps"),
           mirrors=ZERO_GRAD)
mutant("state_no_zero_grad_norms_tp", "tp", "the norms' gradient buffer left out of zero_grad (`grads[norms]: "
       "no_zero_grad`): the norms' updates read every earlier step's gradient, the other groups' their own.",
       ["override grads[norms]: no_zero_grad"], gi(["norms"], "across steps"), mirrors=ZERO_GRAD)
PER_MICRO = ("an optimizer update after every micro-batch (deepspeedai/DeepSpeed#8443, thunlp/OpenPrompt#106, "
             "paiml/entrenar#131)")
for b in ["ddp", "zero1", "tp", "gpipe"]:
    groups = BASES[b].all_groups()
    mutant(f"state_step_every_microbatch_{b}", b, "optimizer.step() after every backward, outside the accumulation "
           "condition (`optimizer: step_every_microbatch`): m updates from the micro-steps' gradients where one from "
           "the accumulated gradient is due.", ["override optimizer: step_every_microbatch"],
           gi(groups, "update over microbatches"), root=gi_root(groups, "update over microbatches"), mirrors=PER_MICRO)
mutant("state_step_every_microbatch_matrices_tp", "tp", "the weight matrices' update run in every micro-step's "
       "backward (`optimizer[matrices]: step_every_microbatch`): the dense group takes m updates, the embedding, "
       "norms and biases one.", ["override optimizer[matrices]: step_every_microbatch"],
       gi(["dense"], "update over microbatches"), mirrors=PER_MICRO)
MTP_GROUP = "the embedding group of the first and last stage beside a standalone MTP stage (NVIDIA-NeMo/Megatron-Bridge#5380)"
for b, model in [("gpipe", "tied_mtp_block"), ("zero3_pp", "dense_mtp_block")]:
    mutant(f"state_mtp_stage_first_last_group_{b}", b, "the multi-token-prediction block on a middle stage with its copy "
           "of the embedding, the embedding group the first and last stage only (`embedding: mtp_stage` and "
           "`group_first_last over (pp)`): the MTP copy's gradient is never summed with the others.",
           ["override embedding: mtp_stage over (pp)", "override embedding: group_first_last over (pp)"],
           ["GI grads[embedding] mtp stage", "GI grads[embedding]", "SC grads[embedding]"], mirrors=MTP_GROUP,
           model=model)
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


# -- checkpoint keys of states laid out in blocks (check.checkpoint: fused components, virtual stages) ----------

FUSED = "a fused QKV / gate-up resharded by plain offset (NVIDIA/Megatron-LM#7161, #520; ndif-team/nnsight#719)"
VPP = "virtual stages' layers numbered as if consecutive (NVIDIA/Megatron-LM#1584, the closest report)"
for name, b, axes, lines, what, mirrors in [
    ("fused_qkv_tp", "tp", "tp", ["override checkpoint[dense]: fused over (tp) by 3",
                                  "override checkpoint[dense]: flat_offset over (tp)"],
     "a fused QKV resharded to a new tp size by its flat offset: Q, K and V columns mixed", FUSED),
    ("fused_gate_up_sp", "sp", "tp", ["override checkpoint: fused over (tp) by 2",
                                      "override checkpoint: flat_offset over (tp)"],
     "a SwiGLU gate/up projection resharded to a new tp size by its flat offset: gate and up mixed", FUSED),
    ("vpp_interleaved", "interleaved", "pp", ["override checkpoint: flat_offset over (pp)"],
     "an interleaved pipeline's layers keyed by the stage's flat offset, resumed on a new pp size", VPP),
    ("vpp_3d", "3d", "pp", ["override checkpoint[dense]: flat_offset over (pp)"],
     "the dense layers of a 3D plan's virtual stages keyed by the stage's flat offset on a new pp size", VPP),
]:
    mutant(f"ckpt_flat_offset_{name}", b, what + ".", [f"override checkpoint: reshard over ({axes})"] + lines,
           ["SC checkpoint reshard"], mirrors=mirrors)
for name, b, lines, why in [
    ("fused_qkv_tp", "tp", ["override checkpoint: reshard over (tp)", "override checkpoint[dense]: fused over (tp) by 3"],
     "a fused QKV resharded component by component on a new tp size: every rank reads its Q, K and V slices."),
    ("vpp_interleaved", "interleaved", ["override checkpoint: reshard over (pp)"],
     "an interleaved pipeline's layers saved under their global numbers and remapped virtual stage by virtual stage."),
]:
    with_base(f"ckpt_reshard_blocks_{name}", b, why, lines)
