"""Bug: FSDP2 with a hand-written gradient clip whose squared norm is all-reduced over a process group per node
(``dist.new_group`` over blocks of 2 consecutive ranks) instead of every rank the gradients are sharded over:
each node's norm counts its own shards only, so the nodes clip by different coefficients and the replicas drift.
Lifted as `override clip_norm: reduce_blocks over (dp) by 2` at the all-reduce and refuted (`SC clip_norm`).
Run on 4 ranks (`--nproc 4`).

``--whole`` (the fix): the norm all-reduced over every rank, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

WHOLE = "--whole" in sys.argv
BLOCK = 2

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
members = [list(range(i, min(i + BLOCK, world))) for i in range(0, world, BLOCK)]
groups = [dist.new_group(m) for m in members]  # every rank creates every group, in one order
node = next(g for g, m in zip(groups, members) if rank in m)
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
    sq = torch.stack([g.pow(2).sum() for g in shards]).sum()
    dist.all_reduce(sq, group=None if WHOLE else node)  # the bug: one node's shards only
    coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
