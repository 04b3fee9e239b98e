"""The corpus generator's operations on partial activations before their reduction, and the equivalents of rank sets over two axes (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import mutant
from .c02_norms_and_rank_sets import DP_GROUPS
from .c03_equivalents import with_base

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


