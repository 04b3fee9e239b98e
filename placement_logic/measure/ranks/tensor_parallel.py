"""Megatron tensor parallelism with DTensor's ``parallelize_module`` (torch)."""

from __future__ import annotations

from torch import nn


def tensor_parallel(model: nn.Module, mesh, sequence_parallel: bool, tied: bool | None = None) -> bool:
    """Megatron tensor parallelism on ``model`` (a whole model or a pipeline stage of it, whose
    embedding or head may be absent); True when the logits are vocabulary-sharded (the loss is
    then computed under ``loss_parallel``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if tied is None:
        tied = model.head is None
    blocks = model.blocks.values() if isinstance(model.blocks, nn.ModuleDict) else model.blocks
    for block in blocks:
        if sequence_parallel:
            plan = {
                "norm1": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                "norm2": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
            }
        else:
            plan = {
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(),
                "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(),
            }
        parallelize_module(block, mesh, plan)
    if tied:
        # tied embeddings: the head is the embedding's transpose; both stay whole on the axis
        if sequence_parallel:
            parallelize_module(model, mesh, {
                "embed": PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                                             use_local_output=True),
                "norm": SequenceParallel(),
            })
            parallelize_module(model, mesh, {
                "norm": PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
                                            use_local_output=True),
            })
        return False
    # Megatron-LM's vocabulary-parallel embedding and output head: each rank holds V/t rows of
    # both; the embedding's partial output is all-reduced (reduce-scattered under sequence
    # parallelism), the head's input is whole (all-gathered from the sequence shards under
    # sequence parallelism) and its logits stay sharded over the vocabulary for the
    # vocabulary-parallel cross entropy (``loss_parallel``).
    plan = {}
    if model.embed is not None:
        plan["embed"] = RowwiseParallel(input_layouts=Replicate(),
                                        output_layouts=Shard(1) if sequence_parallel else Replicate())
    if model.head is not None:
        plan["head"] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                       output_layouts=Shard(-1), use_local_output=False)
    if plan:
        parallelize_module(model, mesh, plan)
    if sequence_parallel and model.norm is not None:
        parallelize_module(model, mesh, {"norm": SequenceParallel()})
    return model.head is not None
