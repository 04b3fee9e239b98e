"""The corpus generator's mutants of the grad norm's copies and owners, operations on sets of ranks and reductions over process groups of part of an axis (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import gi, mutant, mutants

# K >= 2 kv heads copied over the tensor ranks: the norm counts each head once (check.kvnorm)
KV_MARKED = ("copied K/V weights marked tensor-parallel, so the duplicate filter counts every copy "
             "(InternLM/InternEvo#349 copies kv heads; ROCm/TransformerEngine#715)")
KV_RANK0 = "copied K/V weights left unmarked, counted on tp rank 0 only (ROCm/TransformerEngine#715, NVIDIA/Megatron-LM#7452)"
KV_SHARD = "copied K/V weights reduced as shards over the tensor mesh (huggingface/transformers#47811, #46113)"
mutants(
    ("kv_copies_counted_gqa_tp", "gqa_tp",
     "the duplicate filter takes the copied kv heads for tensor-parallel shards (`clip_norm[kv]: count_copies over "
     "(tp)`): each head counted tp/2 times.", ["override clip_norm[kv]: count_copies over (tp)"], ["SC clip_norm"],
     KV_MARKED),
    ("kv_copies_rank0_gqa_tp", "gqa_tp",
     "the copied kv heads counted on tp rank 0 only (`clip_norm[kv]: rank0_only over (tp)`): the other head is "
     "dropped from the norm.", ["override clip_norm[kv]: rank0_only over (tp)"], ["SC clip_norm"], KV_RANK0),
    ("kv_copies_filter_skips_kv_gqa_tp", "gqa_tp",
     "a written sum over tp filtering the layer norms and biases but not the copied kv heads.",
     ["override clip_norm: reduce over (tp)", "override clip_norm[norms]: dedupe over (tp)",
      "override clip_norm[biases]: dedupe over (tp)"], ["SC clip_norm"], KV_SHARD),
)

# K >= 2 kv heads copied over a product of tensor axes: each copy group a run of the joint index (check.kvproduct)
KV_UNSUMMED = ("copied K/V weights whose gradients are never summed over the tensor group "
               "(bigcode-project/Megatron-LM#37, NVIDIA-NeMo/RL#3716)")
KV_LOCAL = "a K/V replication group built from one mesh dimension, not the flattened tensor mesh (huggingface/transformers#47811)"
KV_WHOLE = "copied K/V weights all-reduced over the whole tensor group like replicated weights (NVIDIA-NeMo/Automodel#3822)"
mutants(
    ("kv_copies_not_summed_gqa_tp2", "gqa_tp2",
     "the copied kv heads' gradients reduced over dp only (`grads[kv]: reduce over (dp)`): each copy keeps the part "
     "from its rank's query heads.", ["override grads[kv]: reduce over (dp)"],
     gi(["kv"], "over tp copy groups") + ["GI grads[kv] over tl copy groups", "SC grads[kv]", "CR02"], KV_UNSUMMED),
    ("kv_copies_group_one_axis_gqa_tp2", "gqa_tp2",
     "the copy groups' sum taken over tl alone (`grads[kv]: reduce over (dp, tl)`): each group also spans 2 tp ranks, "
     "whose parts never meet.", ["override grads[kv]: reduce over (dp, tl)"],
     gi(["kv"], "over tp copy groups") + ["SC grads[kv]", "CR02"], KV_LOCAL),
    ("kv_copies_whole_group_gqa_tp2", "gqa_tp2",
     "the copied kv heads all-reduced over the whole tensor group (`grads[kv]: reduce over (dp, tp, tl)`): the two "
     "heads' gradients added.", ["override grads[kv]: reduce over (dp, tp, tl)"], gi(["kv"], "over tp") + ["CR02"],
     KV_WHOLE),
    ("kv_copies_counted_gqa_tp2", "gqa_tp2",
     "every copy of the kv heads counted in the norm (`clip_norm[kv]: count_copies over (tp, tl)`): each head 4 "
     "times.", ["override clip_norm[kv]: count_copies over (tp, tl)"], ["SC clip_norm"], KV_MARKED),
)

# copy groups crossing the tensor axes' blocks: runs of 6 of the 12 joint ranks of tp = 3 x tl = 4 (check.kvjoint)
mutants(
    ("kv_joint_not_summed_gqa_tp3x4", "gqa_tp3x4",
     "the copied kv heads' gradients reduced over dp only (`grads[kv]: reduce over (dp)`): each copy keeps the part "
     "from its rank's query heads.", ["override grads[kv]: reduce over (dp)"],
     gi(["kv"], "over tp×tl copy groups") + ["SC grads[kv]", "CR02"], KV_UNSUMMED),
    ("kv_joint_group_one_axis_gqa_tp3x4", "gqa_tp3x4",
     "the copy groups' sum taken over tl alone (`grads[kv]: reduce over (dp, tl)`): tl rank 1's host holds copies of "
     "both heads, whose gradients are added.", ["override grads[kv]: reduce over (dp, tl)"],
     gi(["kv"], "over tp×tl") + ["CR02"], KV_LOCAL),
    ("kv_joint_counted_gqa_tp3x4", "gqa_tp3x4",
     "every copy of the kv heads counted in the norm (`clip_norm[kv]: count_copies over (tp, tl)`): each head 6 "
     "times.", ["override clip_norm[kv]: count_copies over (tp, tl)"], ["SC clip_norm"], KV_MARKED),
)

# per-rank ownership in the norm; the token count clamped before its reduction (a partial value)
SINKS = "attention sinks not marked tensor-parallel, counted on tp rank 0 (NVIDIA/Megatron-LM#7452, #7530)"
EXPERT_TP = "expert weights split over tp counted on tp rank 0 only (NVIDIA/Megatron-LM#5916)"
CLAMP = "a token count clamped to >= 1 per piece before its sum (radixark/miles#2796, redai-studio/Relax#205)"
mutants(
    ("clip_rank0_dense_tp", "tp",
     "the dense weights, sharded over tp, counted in the norm on tp rank 0 only (`clip_norm[dense]: rank0_only "
     "over (tp)`): the other tp shards are missing.", ["override clip_norm[dense]: rank0_only over (tp)"],
     ["SC clip_norm"], SINKS),
    ("clip_rank0_experts_moe_3d", "moe_3d",
     "the experts' tp slices counted in the norm on tp rank 0 only (`clip_norm[experts]: rank0_only over (tp)`).",
     ["override clip_norm[experts]: rank0_only over (tp)"], ["SC clip_norm"], EXPERT_TP),
    ("clip_rank0_zero2_dp", "zero2",
     "every group's dp shard counted in the norm on dp rank 0 only under ZeRO-2 (`clip_norm: rank0_only over "
     "(dp)`).", ["override clip_norm: rank0_only over (dp)"], ["SC clip_norm"]),
)
# a group's squared norm counted on a set of one axis's ranks (check.rankcount)
SHARED = "a tied embedding counted on the first and the last stage (NVIDIA/Megatron-LM#7227, #7228)"
OWN_RANK = "every rank reading rank 0 for itself in the duplicate filter (NVIDIA/Megatron-LM#7359)"
ETP_OWNER = "expert gradients filtered with the dense tensor group's rank (NVIDIA/Megatron-LM#6470)"
mutants(
    ("count_ranks_tied_first_last_1f1b", "1f1b",
     "the tied embedding counted in the norm on the first and the last pipeline stage (`clip_norm[embedding]: "
     "count_on_ranks over (pp) ranks (0, pp - 1)`): two copies from pp = 2 on.",
     ["override clip_norm[embedding]: count_on_ranks over (pp) ranks (0, pp - 1)"], ["SC clip_norm"], SHARED),
    ("count_ranks_norms_every_rank_tp", "tp",
     "the layer norms, whole on every tp rank, counted on tp ranks 0-7 beside a written sum over tp "
     "(`clip_norm[norms]: count_on_ranks over (tp) ranks (0, 1, 2, 3, 4, 5, 6, 7)`): a copy per named rank.",
     ["override clip_norm[norms]: reduce over (tp)",
      "override clip_norm[norms]: count_on_ranks over (tp) ranks (0, 1, 2, 3, 4, 5, 6, 7)"], ["SC clip_norm"], OWN_RANK),
    ("count_ranks_experts_rank0_ep", "ep",
     "the experts, split over ep, counted in the norm on ep rank 0 only (`clip_norm[experts]: count_on_ranks over "
     "(ep) ranks (0)`): the other ranks' experts are dropped.",
     ["override clip_norm[experts]: count_on_ranks over (ep) ranks (0)"], ["SC clip_norm"], ETP_OWNER),
    ("count_ranks_dense_last_ranks_tp", "tp",
     "the dense weights, sharded over tp, counted on tp ranks 1 and tp - 1 only (`clip_norm[dense]: count_on_ranks "
     "over (tp) ranks (1, tp - 1)`): rank 0's shard is dropped, and from tp = 4 on the middle ranks' too.",
     ["override clip_norm[dense]: count_on_ranks over (tp) ranks (1, tp - 1)"], ["SC clip_norm"]),
)
# ... on a rank set of the process group over several axes (check.encode_rankcount_multi): each piece once
MANY_COUNTS = ("replicated weights counted on every rank of a grid of axes (NVIDIA-NeMo/RL#3788, "
               "ROCm/TransformerEngine#715, NVIDIA/Megatron-LM#7359)")
mutants(
    ("count_ranks_norms_two_ranks_dp_tp", "tp",
     "the layer norms, whole on every rank, counted on ranks 0 and 1 of the (dp, tp) group beside a written sum "
     "over both (`clip_norm[norms]: count_on_ranks over (dp, tp) ranks (0, 1)`): two copies.",
     ["override clip_norm[norms]: reduce over (dp, tp)",
      "override clip_norm[norms]: count_on_ranks over (dp, tp) ranks (0, 1)"], ["SC clip_norm"], MANY_COUNTS),
    ("count_ranks_dense_rank0_dp_tp", "tp",
     "the dense weights, sharded over tp, counted on rank 0 of the (dp, tp) group only (`clip_norm[dense]: "
     "count_on_ranks over (dp, tp) ranks (0)`): the other tp ranks' shards are dropped.",
     ["override clip_norm[dense]: reduce over (dp, tp)",
      "override clip_norm[dense]: count_on_ranks over (dp, tp) ranks (0)"], ["SC clip_norm"]),
    ("count_ranks_dense_diagonal_dp_tp", "tp",
     "the dense weights counted on ranks 0, tp + 1 and 2 * tp + 2 of the (dp, tp) group (`clip_norm[dense]: "
     "count_on_ranks over (dp, tp) ranks (0, tp + 1, 2 * tp + 2)`): tp shards 0, 1, 2 once each, the others "
     "dropped.",
     ["override clip_norm[dense]: reduce over (dp, tp)",
      "override clip_norm[dense]: count_on_ranks over (dp, tp) ranks (0, tp + 1, 2 * tp + 2)"], ["SC clip_norm"],
     MANY_COUNTS),
    ("tokens_clamped_ddp", "ddp",
     "each microbatch's token count clamped to >= 1 on its rank before the sum over microbatches and the "
     "all-reduce over dp (`tokens: clamp_before_reduce`).", ["override tokens: clamp_before_reduce"],
     gi(["dense", "norms", "biases", "embedding"], "normalisation"), CLAMP),
    ("tokens_clamped_cp", "cp",
     "each context rank's token count clamped to >= 1 before the all-reduce over dp and cp "
     "(`tokens: clamp_before_reduce`).", ["override tokens: clamp_before_reduce"],
     gi(["dense", "norms", "biases", "embedding"], "normalisation"), CLAMP),
)
EPS = "an epsilon added to each piece's token count before its sum (vllm-project/speculators#942)"
mutants(
    ("tokens_eps_ddp", "ddp",
     "each microbatch's token count plus an epsilon on its rank before the sum over microbatches and the "
     "all-reduce over dp (`tokens: eps_before_reduce by 1e-6`): T + P·ε, not T + ε.",
     ["override tokens: eps_before_reduce by 1e-6"], gi(["dense", "norms", "biases", "embedding"], "normalisation"),
     EPS),
    ("tokens_eps_cp", "cp",
     "each context rank's token count plus an epsilon before the all-reduce over dp and cp "
     "(`tokens: eps_before_reduce by 1e-8`).", ["override tokens: eps_before_reduce by 1e-8"],
     gi(["dense", "norms", "biases", "embedding"], "normalisation"), EPS),
)

# per-rank operations on the update and the loss scale; an epsilon on each rank's squared norm (check.rankupdate)
SCALERS = "per-module loss scalers updated before the world-wide found-inf consensus (NVIDIA-NeMo/Megatron-Bridge#5591)"
ALL4 = ["dense", "norms", "biases", "embedding"]
mutants(
    ("update_clip_rank0_ddp", "ddp",
     "the clip coefficient applied on dp rank 0 only (`grads: clip_rank0_only over (dp)`): the other replicas "
     "step with the unclipped gradient.", ["override grads: clip_rank0_only over (dp)"],
     [f"SC update[{g}]" for g in ALL4]),
    ("update_divide_rank0_tp", "tp",
     "the dense gradient divided by 2 on tp rank 0 only (`grads[dense]: divide_rank0_only over (tp) by 2`): the "
     "other tp shards are stepped undivided.", ["override grads[dense]: divide_rank0_only over (tp) by 2"],
     ["SC update[dense]"]),
)
STAGE_SCALED = "gradient accumulation scaling applied again at every earlier pipeline stage (deepspeedai/DeepSpeed#8152)"
mutant("update_divide_rank0_pp", "1f1b",
       "the first pipeline stage dividing its gradient by the microbatches again (`grads: divide_rank0_only over "
       "(pp) by 4`): the stages' gradients are scaled unlike one another.",
       ["override grads: divide_rank0_only over (pp) by 4"], [f"SC update[{g}]" for g in ALL4], mirrors=STAGE_SCALED)
# a divisor or a clip on ranks of the process group over two axes (check.rankset: the first axis most significant)
SCALER = "a GradScaler scale that differs across processes (pytorch/pytorch#136009)"
mutants(
    ("update_divide_global_ranks_pp", "1f1b",
     "a division again on global ranks 0 and 1 of the (pp, dp) topology (`grads: divide_on_ranks over (pp, dp) "
     "ranks (0, 1) by 4`: two replicas of stage 0 at dp = 8, stages 0 and 1 at dp = 1).",
     ["override grads: divide_on_ranks over (pp, dp) ranks (0, 1) by 4"], [f"SC update[{g}]" for g in ALL4],
     STAGE_SCALED),
    ("update_divide_last_process_tp", "tp",
     "the last process of a (dp, tp) mesh unscaling by half the others' loss scale (`grads: divide_on_ranks over "
     "(dp, tp) ranks (dp * tp - 1) by 1 / 2`).",
     ["override grads: divide_on_ranks over (dp, tp) ranks (dp * tp - 1) by 1 / 2"], [f"SC update[{g}]" for g in ALL4],
     SCALER),
)
# two or more divisors on sets of one axis's ranks: each rank applies their product (check.encode_rankproduct)
mutants(
    ("update_divisor_product_pp", "1f1b",
     "every stage but the last dividing by 4 and stage 0 by 4 again (`grads: divide_except_last over (pp) by 4` "
     "and `divide_on_ranks over (pp) ranks (0) by 4`): products 16, 4, ..., 1 along the pipeline.",
     ["override grads: divide_except_last over (pp) by 4", "override grads: divide_on_ranks over (pp) ranks (0) by 4"],
     [f"SC update[{g}]" for g in ALL4], STAGE_SCALED),
    ("update_divisor_product_ddp", "ddp",
     "the last two dp ranks unscaling by half the scale and the last by half again (`grads: divide_on_ranks over "
     "(dp) ranks (dp - 2, dp - 1) by 1 / 2` and `divide_last_only over (dp) by 1 / 2`).",
     ["override grads: divide_on_ranks over (dp) ranks (dp - 2, dp - 1) by 1 / 2",
      "override grads: divide_last_only over (dp) by 1 / 2"], [f"SC update[{g}]" for g in ALL4], SCALER),
)
# divisors on sets of ranks of different axes: each device applies their product (check.encode_rankproduct_axes)
mutants(
    ("update_divisors_pp_and_dp", "1f1b",
     "every stage but the last dividing by 4 and the last dp rank by 2 (`grads: divide_except_last over (pp) by 4` "
     "and `divide_last_only over (dp) by 2`): products 8, 4, 2 and 1 over the (pp, dp) grid.",
     ["override grads: divide_except_last over (pp) by 4", "override grads: divide_last_only over (dp) by 2"],
     [f"SC update[{g}]" for g in ALL4], STAGE_SCALED),
    ("update_divisors_cancel_off_the_corner_1f1b", "1f1b",
     "process 0 of the (dp, pp) group dividing by 2 and pipeline rank 0 multiplying by 2 (`grads: divide_on_ranks "
     "over (dp, pp) ranks (0) by 2` and `divide_rank0_only over (pp) by 1 / 2`): they cancel on device (0, 0) "
     "only, the other replicas of stage 0 multiplied.",
     ["override grads: divide_on_ranks over (dp, pp) ranks (0) by 2",
      "override grads: divide_rank0_only over (pp) by 1 / 2"], [f"SC update[{g}]" for g in ALL4]),
)
# a reduction over blocks of an axis's ranks; divisors on every rank but the last or the last only (check.subgroups)
NODE_GROUP = "the data-parallel gradient sync given the in-node group (laekov/fastmoe#105, #106)"
MP_BLOCKS = "expert norms all-reduced over the model-parallel blocks, not every expert rank (laekov/fastmoe#169)"
mutants(
    ("grads_blocks_ddp", "ddp",
     "the gradients all-reduced within blocks of 4 consecutive dp ranks (`grads: reduce_blocks over (dp) by 4`, "
     "one process group per node): each block holds a partial sum of its own.",
     ["override grads: reduce_blocks over (dp) by 4"], [f"GI grads[{g}] blocks" for g in ALL4], NODE_GROUP),
    ("clip_blocks_zero2", "zero2",
     "the squared norms of the dp shards summed within blocks of 2 consecutive dp ranks (`clip_norm: "
     "reduce_blocks over (dp) by 2`): each block's norm misses the others' shards.",
     ["override clip_norm: reduce_blocks over (dp) by 2"], ["SC clip_norm"], MP_BLOCKS),
)
PERPENDICULAR = "the dense gradient sync given the perpendicular (strided) group (laekov/fastmoe#105, #106)"
EXPERT_DATA = "non-MoE gradients all-reduced over the strided expert-data-parallel group (deepspeedai/DeepSpeed#1838)"
FIRST_GROUP = "a reduction only the first group performs (pytorch/pytorch#10003, allenai/OLMo#551)"
mutants(
    ("grads_strided_ddp", "ddp",
     "the gradients all-reduced within strided groups of dp ranks r, r+2, r+4 ... (`grads: reduce_strided over "
     "(dp) by 2`, groups built with another axis's stride): each group holds a partial sum of its own.",
     ["override grads: reduce_strided over (dp) by 2"], [f"GI grads[{g}] blocks" for g in ALL4], PERPENDICULAR),
    ("grads_strided_norms_hsdp", "hsdp",
     "the norms' gradient all-reduce over the nodes run in strided groups of stride 2 (`grads[norms]: "
     "reduce_strided over (nodes) by 2`): nodes 0 and 2, 1 and 3 hold different sums; the other groups reduce "
     "over every node.", ["override grads[norms]: reduce_strided over (nodes) by 2"], ["GI grads[norms] blocks"],
     EXPERT_DATA),
    ("grads_first_ddp", "ddp",
     "the gradients all-reduced over the first 2 dp ranks only (`grads: reduce_first over (dp) by 2`): the "
     "other ranks reduce nothing and step with their own contribution.",
     ["override grads: reduce_first over (dp) by 2"], [f"GI grads[{g}] blocks" for g in ALL4], FIRST_GROUP),
    ("clip_strided_zero2", "zero2",
     "the squared norms of the dp shards summed within strided groups of stride 2 (`clip_norm: reduce_strided "
     "over (dp) by 2`): each group's norm misses the other groups' shards.",
     ["override clip_norm: reduce_strided over (dp) by 2"], ["SC clip_norm"], EXPERT_DATA),
    ("clip_first_zero2", "zero2",
     "the squared norms of the dp shards summed over the first 2 dp ranks only (`clip_norm: reduce_first over "
     "(dp) by 2`): every other rank clips by its own shard's norm.",
     ["override clip_norm: reduce_first over (dp) by 2"], ["SC clip_norm"], FIRST_GROUP),
)
# consecutive groups of unequal sizes (check.subgroups: reduce_groups)
UNEQUAL_NODES = ("a per-node group on nodes of unequal GPU counts (huggingface/accelerate#2780, "
                 "Oneflow-Inc/oneflow#5119, deepspeedai/DeepSpeedExamples#575)")
mutants(
    ("grads_groups_ddp", "ddp",
     "the gradients all-reduced within consecutive groups of 5 and 3 dp ranks (`grads: reduce_groups over (dp) by "
     "(5, 3)`, a process group per node on nodes of 5 and 3 GPUs): each group holds a partial sum of its own.",
     ["override grads: reduce_groups over (dp) by (5, 3)"], [f"GI grads[{g}] blocks" for g in ALL4], UNEQUAL_NODES),
    ("grads_groups_norms_ddp", "ddp",
     "the norms' gradient all-reduced within consecutive groups of 1, 3 and 4 dp ranks (`grads[norms]: "
     "reduce_groups over (dp) by (1, 3, 4)`): the other groups reduce over every rank.",
     ["override grads[norms]: reduce_groups over (dp) by (1, 3, 4)"], ["GI grads[norms] blocks"], UNEQUAL_NODES),
    ("clip_groups_zero2", "zero2",
     "the squared norms of the dp shards summed within consecutive groups of 6 and 2 dp ranks (`clip_norm: "
     "reduce_groups over (dp) by (6, 2)`): each group's norm misses the other group's shards.",
     ["override clip_norm: reduce_groups over (dp) by (6, 2)"], ["SC clip_norm"], UNEQUAL_NODES),
)
# process groups given by a list of rank sets, one new_group per set (check.subgroups: reduce_sets): two sets or
# more are a defect at the axis's size, and one set is a no-op (PL506), so none has an equivalent
RANK_SETS = ("process groups given by a list of rank sets (verl-project/verl#7493, deepspeedai/DeepSpeed#3521, "
             "ml-explore/mlx#4283)")
mutants(
    ("grads_sets_ddp", "ddp",
     "the gradients all-reduced within the rank sets [0, 2, 4, 5] and [1, 3, 6, 7] of dp (`grads: reduce_sets "
     "over (dp) ranks ([0, 2, 4, 5], [1, 3, 6, 7])`, two hand-written new_group lists): each set holds a partial "
     "sum of its own.", ["override grads: reduce_sets over (dp) ranks ([0, 2, 4, 5], [1, 3, 6, 7])"],
     [f"GI grads[{g}] blocks" for g in ALL4], RANK_SETS),
    ("grads_sets_norms_ddp", "ddp",
     "the norms' gradient all-reduced within the rank sets [7] and [6, 0, 1, 2, 3, 4, 5] (`grads[norms]: "
     "reduce_sets over (dp) ranks ([7], [6, 0, 1, 2, 3, 4, 5])`): rank 7 keeps its own; the other groups reduce "
     "over every rank.", ["override grads[norms]: reduce_sets over (dp) ranks ([7], [6, 0, 1, 2, 3, 4, 5])"],
     ["GI grads[norms] blocks"], RANK_SETS),
    ("clip_sets_zero2", "zero2",
     "the squared norms of the dp shards summed within the rank sets [0, 3, 5] and [1, 2, 4, 6, 7] (`clip_norm: "
     "reduce_sets over (dp) ranks ([0, 3, 5], [1, 2, 4, 6, 7])`): each set's norm misses the other's shards.",
     ["override clip_norm: reduce_sets over (dp) ranks ([0, 3, 5], [1, 2, 4, 6, 7])"], ["SC clip_norm"], RANK_SETS),
)
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
mutants(
    ("clip_sets_axes_world_hsdp", "hsdp",
     "the squared norms all-reduced over the whole (nodes, gpus) group (`clip_norm: reduce_sets over (nodes, gpus) "
     "ranks ([0 .. 31])`): every gpu shard's squared norm is counted once per node, four times.",
     [f"override clip_norm: reduce_sets over (nodes, gpus) ranks ([{HSDP_WORLD}])"], ["SC clip_norm"], HSDP_NORM),
    ("clip_sets_axes_replicas_hsdp", "hsdp",
     "the squared norms all-reduced within the replicate groups listed by hand (`clip_norm: reduce_sets over "
     "(nodes, gpus) ranks ([0, 8, 16, 24], ...)`): each set sums the four copies of one shard and misses the "
     "others.", [f"override clip_norm: reduce_sets over (nodes, gpus) ranks ({HSDP_REPLICAS})"], ["SC clip_norm"],
     HSDP_NORM),
    ("update_divide_except_last_pp", "1f1b",
     "every pipeline stage but the last dividing its gradient by the microbatches again (`grads: "
     "divide_except_last over (pp) by 4`).", ["override grads: divide_except_last over (pp) by 4"],
     [f"SC update[{g}]" for g in ALL4], STAGE_SCALED),
    ("update_divide_last_only_pp", "1f1b",
     "the last pipeline stage alone dividing its gradient by 4 (`grads: divide_last_only over (pp) by 4`).",
     ["override grads: divide_last_only over (pp) by 4"], [f"SC update[{g}]" for g in ALL4]),
)
# a clip or a divisor on any set of one axis's ranks (check.rankset): each a defect at some size of the axis, so
# none has an equivalent; ranks (0) and ranks (pp - 1) are the rank-0 and last-rank verbs' mutants restated
SCALER_RANKS = "each process unscaling by its own GradScaler scale after DDP's all-reduce (pytorch/pytorch#136009)"
mutants(
    ("update_divide_on_ranks_pp", "1f1b",
     "pipeline stages 0 and 1 dividing their gradient by the microbatches again (`grads: divide_on_ranks over "
     "(pp) ranks (0, 1) by 4`): with 3 or more stages the stages' gradients are scaled unlike one another.",
     ["override grads: divide_on_ranks over (pp) ranks (0, 1) by 4"], [f"SC update[{g}]" for g in ALL4], STAGE_SCALED),
    ("update_divide_on_ranks_last_pp", "1f1b",
     "the last pipeline stage alone dividing its gradient by 4, named by its index (`grads: divide_on_ranks over "
     "(pp) ranks (pp - 1) by 4`): the mutant of `divide_last_only` restated.",
     ["override grads: divide_on_ranks over (pp) ranks (pp - 1) by 4"], [f"SC update[{g}]" for g in ALL4]),
    ("update_divide_on_ranks_ddp", "ddp",
     "dp ranks 4 to 7 unscaling by half the others' loss scale (`grads: divide_on_ranks over (dp) ranks (4, 5, 6, "
     "7) by 1 / 2`): their replicas step twice as far.",
     ["override grads: divide_on_ranks over (dp) ranks (4, 5, 6, 7) by 1 / 2"], [f"SC update[{g}]" for g in ALL4],
     SCALER_RANKS),
    ("update_clip_on_ranks_tp", "tp",
     "the clip coefficient applied to the dense gradient on tp ranks 1 and 3 only (`grads[dense]: clip_on_ranks "
     "over (tp) ranks (1, 3)`): the other tp shards are stepped unclipped.",
     ["override grads[dense]: clip_on_ranks over (tp) ranks (1, 3)"], ["SC update[dense]"]),
    ("grads_two_kinds_hsdp", "hsdp",
     "the gradient reduced within blocks of 4 GPUs and within strided groups of nodes (`grads: reduce_blocks over "
     "(gpus) by 4`, `grads: reduce_strided over (nodes) by 2`): one reduction in two kinds of group, neither "
     "holding the mesh.",
     ["override grads: reduce_blocks over (gpus) by 4",
       "override grads: reduce_strided over (nodes) by 2"],
     [f"GI grads[{g}] blocks" for g in ALL4] + [f"GI grads[{g}]" for g in ALL4]),
    ("grads_first_nodes_and_gpu_sets_hsdp", "hsdp",
     "the gradient's all-reduce across nodes on the first 2 nodes only and within a node on the rank sets [0, 2, 4, "
     "6] and [1, 3, 5, 7] (`grads: reduce_first over (nodes) by 2`, `grads: reduce_sets over (gpus) ranks (...)`).",
     ["override grads: reduce_first over (nodes) by 2",
      "override grads: reduce_sets over (gpus) ranks ([0, 2, 4, 6], [1, 3, 5, 7])"],
     [f"GI grads[{g}] blocks" for g in ALL4] + [f"GI grads[{g}]" for g in ALL4]),
    ("update_clip_twice_pp", "1f1b",
     "the clip applied in two code paths, the first stage's (`grads: clip_rank0_only over (pp)`) and the last "
     "stage's (`grads: clip_on_ranks over (pp) ranks (pp - 1)`): one stage clips twice at pp = 1, a middle stage "
     "never at pp >= 3 (each device clips once per statement naming it).",
     ["override grads: clip_rank0_only over (pp)", "override grads: clip_on_ranks over (pp) ranks (pp - 1)"],
     [f"SC update[{g}]" for g in ALL4]),
    ("update_clip_rank0_tp_and_dp", "tp",
     "the clip put back by hand on tensor rank 0 and again on data rank 0 (`grads: clip_rank0_only over (tp)`, "
     "`grads: clip_rank0_only over (dp)`): device (dp 0, tp 0) clips twice, (dp 1, tp 1) never.",
     ["override grads: clip_rank0_only over (tp)", "override grads: clip_rank0_only over (dp)"],
     [f"SC update[{g}]" for g in ALL4]),
    ("update_clip_same_ranks_twice_ddp", "ddp",
     "the same clip stated twice for the dense gradient on dp ranks 0 to 7 (`grads[dense]: clip_on_ranks over (dp) "
     "ranks (0, 1, 2, 3, 4, 5, 6, 7)`, twice): every named rank applies the coefficient twice.",
     ["override grads[dense]: clip_on_ranks over (dp) ranks (0, 1, 2, 3, 4, 5, 6, 7)",
      "override grads[dense]: clip_on_ranks over (dp) ranks (0, 1, 2, 3, 4, 5, 6, 7)"], ["SC update[dense]"]),
    ("clip_eps_tp", "tp",
     "each rank's squared norm plus an epsilon before the all-reduce over tp (`clip_norm: eps_before_reduce by "
     "1e-6`): S + tp·ε, not S + ε.", ["override clip_norm: eps_before_reduce by 1e-6"], ["SC clip_norm"]),
    ("clip_eps_on_two_ranks_tp", "tp",
     "an epsilon added to the squared norm on tensor ranks 0 and 1 before the all-reduce over tp (`clip_norm: "
     "eps_on_ranks over (tp) ranks (0, 1) by 1e-6`): S + 2·ε, not S + ε.",
     ["override clip_norm: eps_on_ranks over (tp) ranks (0, 1) by 1e-6"], ["SC clip_norm"]),
    ("clip_eps_on_tp_rank0_3d", "3d",
     "an epsilon added to the squared norm on tensor rank 0 of every pipeline stage before the norm's all-reduce "
     "over tp and pp (`clip_norm: eps_on_ranks over (tp) ranks (0) by 1e-6`): S + pp·ε, not S + ε.",
     ["override clip_norm: eps_on_ranks over (tp) ranks (0) by 1e-6"], ["SC clip_norm"]),
    ("loss_scale_local_zero2", "zero2",
     "the loss scale updated from each dp rank's own found-inf flag under ZeRO-2 (`loss_scale: local over (dp)`): "
     "the rank whose shard overflows halves its scale alone.", ["override loss_scale: local over (dp)"],
     ["SC loss_scale"]),
    ("loss_scale_local_pp", "zero2_pp",
     "the loss scale updated from each pipeline stage's own found-inf flag (`loss_scale: local over (pp)`).",
     ["override loss_scale: local over (pp)"], ["SC loss_scale"], SCALERS),
    ("loss_scale_growth_local_zero2", "zero2",
     "the loss scaler's growth tracker and hysteresis counter updated from each dp rank's own found-inf flag under "
     "ZeRO-2, the step skipped on the reduced flag (`loss_scale: growth_local over (dp)`): the scales part on a later "
     "step.", ["override loss_scale: growth_local over (dp)"], ["SC loss_scale_state"]),
    ("loss_scale_growth_local_pp", "zero2_pp",
     "each pipeline stage's scaler counters updated from its own found-inf flag (`loss_scale: growth_local over "
     "(pp)`).", ["override loss_scale: growth_local over (pp)"], ["SC loss_scale_state"], SCALERS),
)
AMAX_SP = "the fp8 amax reduction skipped under sequence parallelism (NVIDIA/TransformerEngine#74)"
mutants(
    ("amax_local_sp", "sp",
     "the fp8 amax not all-reduced over the tensor group under sequence parallelism (`amax: local over (tp)`): "
     "each rank casts its sequence slice with its own scale before the fp8 all-gather.",
     ["override amax: local over (tp)"], ["SC amax"], AMAX_SP),
    ("amax_reduced_over_dp_only_tp", "tp",
     "the fp8 amax all-reduced over the data group only (`amax: reduce over (dp)`, fp8_group the data-parallel "
     "group, NVIDIA/TransformerEngine#656): the tensor ranks' weight slices cast with different scales.",
     ["override amax: reduce over (dp)"], ["SC amax"]),
    ("amax_local_dp", "ddp",
     "the fp8 amax of the dense layers kept per data rank (`amax[dense]: local over (dp)`): each replica casts its "
     "own tokens with its own scale.", ["override amax[dense]: local over (dp)"], ["SC amax[dense]"]),
    ("amax_blockwise_sp_sequence", "sp",
     "fp8 scales per block of 128 taken from each tensor rank's shard (`amax[dense]: blockwise over (tp) by 128`): "
     "at tp = 32 a sequence-parallel slice holds 64 tokens, half a block.",
     ["override amax[dense]: blockwise over (tp) by 128"], ["SC amax[dense]"],
     "MXFP8 with sequence parallelism on slices of partial blocks (modelscope/ms-swift#9723)"),
    ("amax_rowwise_tp", "tp",
     "fp8 rowwise scales taken from each tensor rank's shard (`amax[dense]: rowwise over (tp)`): a row-parallel "
     "linear's rows are cut between the tensor ranks.", ["override amax[dense]: rowwise over (tp)"], ["SC amax[dense]"],
     "float8 rowwise scaling under tensor parallelism (pytorch/ao#1718)"),
    ("loss_scale_growth_local_tp", "tp",
     "each tensor rank's scaler counters updated from the found-inf flag of its own weight slices (`loss_scale: "
     "growth_local over (tp)`, facebookresearch/fairseq2#1374).", ["override loss_scale: growth_local over (tp)"],
     ["SC loss_scale_state"]),
)

# nested accumulation: rounds of a pipeline schedule inside an outer gradient accumulation
RESCALED = "a pipeline schedule rescaling the accumulated buffer every run (pytorch/torchtitan#1733)"
PIPE_SUMMED = "a pipeline engine summing its micro-batches under accumulation (deepspeedai/DeepSpeed#7773)"
PMM = ["override loss: per_microbatch_mean", "override tokens: equal"]
mutants(
    ("accumulation_rescaled_zero2_pp", "zero2_pp",
     "the schedule's 1/M scale applied to the accumulated buffer after every round of 2 "
     "(`accumulation: rescaled_every_round by 2`).", PMM + ["override accumulation: rescaled_every_round by 2"],
     gi(["dense", "norms", "biases", "embedding"], "over microbatches"), RESCALED),
    ("accumulation_inner_undivided_1f1b", "1f1b",
     "the schedule sums its 2 microbatches and the outer loop divides by its rounds "
     "(`accumulation: inner_undivided by 2`).", PMM + ["override accumulation: inner_undivided by 2"],
     gi(["dense", "norms", "biases", "embedding"], "normalisation"), PIPE_SUMMED),
    ("accumulation_outer_undivided_gpipe", "gpipe",
     "the outer accumulation sums its rounds of 2 microbatches (`accumulation: outer_undivided by 2`).",
     PMM + ["override accumulation: outer_undivided by 2"],
     gi(["dense", "norms", "biases", "embedding"], "normalisation")),
)

