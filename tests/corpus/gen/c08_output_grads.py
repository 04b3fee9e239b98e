"""The corpus generator's declared output-gradient types (``activation_grads[r]: assert_output_replicate |
assert_output_partial | assert_output_shard over (AXES)``, to_local's grad_placements on a region's partial
output): a gradient declared other than it arrives is summed again, or read whole without its all-gather
(tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import mutant
from .c03_equivalents import with_base

TO_LOCAL_PARTIAL = ("to_local then from_local on a Partial DTensor, its gradient declared Partial "
                    "(pytorch/pytorch#172932; GPT-OSS's experts, pytorch/torchtitan#2106)")
SP_REPLICATE = "a sequence-sharded output gradient declared Replicate (the closest report: pytorch/pytorch#173454)"
for name, b, line, expect, what, mirror in [
    ("act_out_grad_partial_attention_tp", "tp", "override activation_grads[attention]: assert_output_partial over (tp)",
     ["GI activation_grads[attention]"], "the attention output's gradient declared Partial while it arrives whole: "
     "all-reduced again, tp times too large.", TO_LOCAL_PARTIAL),
    ("act_out_grad_partial_all_tp", "tp", "override activation_grads: assert_output_partial over (tp)",
     [f"GI activation_grads[{r}]" for r in ("attention", "mlp", "embedding")], "every region's output gradient "
     "declared Partial: each summed again over tp.", TO_LOCAL_PARTIAL),
    ("act_out_grad_replicate_mlp_sp", "sp", "override activation_grads[mlp]: assert_output_replicate over (tp)",
     ["GI activation_grads[mlp]"], "the MLP output's gradient, each rank's sequence slice, declared Replicate: no "
     "all-gather before the fc2 backward.", SP_REPLICATE),
    ("emb_out_grad_replicate_sp", "sp", "override activation_grads[embedding]: assert_output_replicate over (tp)",
     ["GI activation_grads[embedding]"], "the embedding output's gradient declared Replicate under sequence "
     "parallelism: its weight gradient reads the rank's slice only.", SP_REPLICATE),
]:
    mutant(name, b, what, [line], expect, mirrors=mirror)
with_base("act_out_grad_replicate_tp", "tp", "to_local(grad_placements=[Replicate()]) on every row-parallel output "
          "under tensor parallelism: the gradient arrives whole, nothing moves.",
          ["override activation_grads: assert_output_replicate over (tp)"])
with_base("act_out_grad_shard_sp", "sp", "to_local(grad_placements=[Shard(1)]) on every row-parallel output under "
          "sequence parallelism: redistributing to Replicate is the all-gather the derivation has.",
          ["override activation_grads: assert_output_shard over (tp)"])
