"""Two data axes (replicate x shard) by hand: the token count is summed over one axis only.

Bug modelled on published ones (a token count all-reduced over the data-parallel group
but not over the context- or replicate-parallel one): the loss of each rank is divided
by a count that misses the tokens of the other replicas, so ranks whose replicas hold
fewer tokens weigh their tokens more than single-device training does.
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
    dist.all_reduce(tokens, group=mesh["shard"].get_group())  # the bug: the replicate axis is missing
    loss_sum = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=tiny.IGNORE, reduction="sum")
    loss = loss_sum * world / tokens
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
