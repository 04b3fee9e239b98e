"""Two data axes (replicate x shard) written by hand, with a loss normalised by the global token count.

Variable-length sequences: each rank holds a different number of valid tokens, so the
loss is the sum of token losses divided by the token count of the whole step (summed over
both data axes), times the number of ranks, and the gradients are averaged.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.padded_batch(rank, step)
    tokens = (y != tiny.IGNORE).sum()
    dist.all_reduce(tokens)  # over every data rank: replicate and shard
    loss_sum = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=tiny.IGNORE, reduction="sum")
    loss = loss_sum * world / tokens
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
