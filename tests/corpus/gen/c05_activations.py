"""The corpus generator's mutants and equivalents of the activation regions, context parallelism's layouts, the expert tensor group and Muon (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import BASES, gi, mutant
from .c03_equivalents import equivalent, with_base

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


def _mask(kind: str, mirrors: str, rows, zigzag: str, whole: str) -> None:
    """A mask of the attention under context parallelism (``kind``: window, chunk; the model dense_KIND, 512
    positions): its behaviours' mutants, one per row (name, base, lines, what the ranks do), and two equivalents,
    the mask under zigzag CP and one as long as the sequence dropped by the ranks (the model dense_KIND_whole)."""
    for name, b, lines, what in rows:
        mutant(name, b, what, lines, [f"GI layout[{kind}]"], mirrors=mirrors, model=f"dense_{kind}")
    equivalent(f"cp_{kind}_zigzag", BASES["cp"].title, zigzag, list(BASES["cp"].bind) + ["override layout: zigzag"],
               "cp", model=f"dense_{kind}")
    equivalent(f"cp_{kind}_whole_sequence_dropped", BASES["cp"].title, whole, list(BASES["cp"].bind)
               + [f"override layout[causal_mask]: {kind}_dropped"], "cp", model=f"dense_{kind}_whole")


_mask("window", "the sliding window under context parallelism dropped (huggingface/accelerate#4177), compared on local "
      "slots (open-lm-engine/lm-engine#447) or applied on the diagonal block only (NVIDIA/Megatron-LM#1160)",
      [("cp_window_dropped", "cp", ["override layout: zigzag", "override layout[causal_mask]: window_dropped"],
        "a window of 512 under zigzag CP, the ranks' masks causal without it."),
       ("cp_window_local_slots", "cp_zero3", ["override layout[causal_mask]: window_local"],
        "a window of 512 under contiguous CP, compared between the ranks' local slots."),
       ("cp_window_on_diagonal", "cp", ["override layout: zigzag", "override layout[causal_mask]: window_on_diagonal"],
        "a window of 512 under zigzag CP, applied on each rank's own block only.")],
      "a window of 512 under zigzag CP, every rank's mask on the global positions.",
      "a window as long as the sequence dropped by the ranks: it never binds, causal attention is the window's.")
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
_mask("chunk", "chunked attention under context parallelism dropped (huggingface/accelerate#4177), cut on local slots "
      "(nod-ai/amd-shark-ai#1452) or applied on the diagonal block only (NVIDIA/TransformerEngine#1887)",
      [("cp_chunk_dropped", "cp", ["override layout: zigzag", "override layout[causal_mask]: chunk_dropped"],
        "chunks of 512 under zigzag CP, the ranks' masks causal without them."),
       ("cp_chunk_local_slots", "cp_zero3", ["override layout[causal_mask]: chunk_local"],
        "chunks of 512 under contiguous CP, cut on the ranks' local slots."),
       ("cp_chunk_on_diagonal", "cp", ["override layout: zigzag", "override layout[causal_mask]: chunk_on_diagonal"],
        "chunks of 512 under zigzag CP, the boundary applied on each rank's own block only.")],
      "chunks of 512 under zigzag CP, every rank's mask on the global positions.",
      "one chunk as long as the sequence dropped by the ranks: it never binds, causal attention is the chunk's.")
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

