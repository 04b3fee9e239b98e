"""The corpus generator's accumulated gradient buffer reduced again after every micro-step (``grads:
reduce_accumulated_every_microbatch``, check.rereduce): micro-step k's gradient counted m - k + 1 times, on
replicated, ZeRO-sharded, tensor-parallel and pipelined bases; and the accumulating buffer all-reduced with a sum in
place after every micro-step (``grads: reduce_summed_every_microbatch``, check.resummed): micro-step k's gradient
multiplied by n^(m - k) (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import BASES, gi, gi_root, mutant

REREDUCED = ("the accumulated gradient reduced again on every micro-step (hpcaitech/ColossalAI#247, "
             "deepspeedai/DeepSpeed#684)")
for b in ["ddp", "zero1", "zero2", "tp", "gpipe"]:
    groups = BASES[b].all_groups()
    mutant(f"state_reduce_accumulated_every_microbatch_{b}", b, "the gradient buffer not cleared after its "
           "reduction, reduced again after every micro-step into a separate accumulator (`grads: "
           "reduce_accumulated_every_microbatch`): micro-step k's gradient counted m - k + 1 times.",
           ["override grads: reduce_accumulated_every_microbatch"], gi(groups, "over microbatches"),
           root=gi_root(groups, "over microbatches"), mirrors=REREDUCED)

RESUMMED = ("the accumulating gradient all-reduced with a sum in place on every micro-step (NVIDIA/Megatron-LM#6660, "
            "examples/bugs/manual_allreduce_grad_in_accumulation.place)")
for b in ["ddp", "zero1", "tp", "gpipe"]:
    groups = BASES[b].all_groups()
    mutant(f"state_reduce_summed_every_microbatch_{b}", b, "the accumulating gradient buffer all-reduced with a sum "
           "and written back after every micro-step (`grads: reduce_summed_every_microbatch`): micro-step k's "
           "gradient multiplied by n^(m - k) over the n ranks of its all-reduce.",
           ["override grads: reduce_summed_every_microbatch"], gi(groups, "over microbatches"),
           root=gi_root(groups, "over microbatches"), mirrors=RESUMMED)
