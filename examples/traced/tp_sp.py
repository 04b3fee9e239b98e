"""Tensor and sequence parallelism with DTensor (Megatron-style) on a one-axis mesh.

Column-parallel q/k/v and fc1, row-parallel proj and fc2; the norms run on sequence
shards (SequenceParallel), so their gradients are partial sums that DTensor all-reduces
over the tensor axis before the optimizer uses them. With --norms-not-sequence-parallel
the norms are left as plain modules (the bug of tp_sp_norms.py).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

SEQUENCE_PARALLEL_NORMS = "--norms-not-sequence-parallel" not in sys.argv


def block_plan():
    plan = {
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
    }
    if SEQUENCE_PARALLEL_NORMS:
        plan.update({"norm1": SequenceParallel(), "norm2": SequenceParallel()})
    return plan


dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
model = tiny.build()
for block in model.blocks:
    parallelize_module(block, mesh, block_plan())
parallelize_module(model, mesh, {
    "embed": PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                                 use_local_output=True),
    "norm": SequenceParallel(),
})
parallelize_module(model, mesh, {
    "norm": PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
                                use_local_output=True),
})
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(0, step)  # every tensor rank reads the same batch
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
