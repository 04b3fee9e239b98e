"""FSDP2 with gradients clipped by the norm of each rank's own shard.

Bug modelled on published ones: a hand-written clip (or a clip_grad_norm_ applied to the
local shards) computes the norm of the local shard only, so every rank scales its shard
by a different coefficient, and the replicas of the model drift apart.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny.build()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    shards = [p.grad.to_local() for p in model.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in shards]))  # local norm only
    coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
