"""Bug: FSDP2 with a hand-written gradient clip whose squared norm is all-reduced over a group of the first K ranks
only, modelled on allenai/OLMo#551 (hybrid sharding's grad-norm reduction addressed to global rank 0 within the shard
group: "only the 'first' group will perform the reduce"). The other ranks are no members of that group: the
all-reduce does nothing there, so they keep their own shard's norm and clip by another coefficient than the first K,
and the replicas drift. Lifted as `override clip_norm: reduce_first over (dp) by 2` at the all-reduce and refuted
(`SC clip_norm`). Run on 4 ranks (`--nproc 4`).

``--whole`` (the fix): the norm all-reduced over every rank, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

WHOLE = "--whole" in sys.argv
K = 2

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
first = dist.new_group(list(range(K)))  # every rank creates it; ranks K.. are no members
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
    if WHOLE or rank < K:
        dist.all_reduce(sq, group=None if WHOLE else first)  # the bug: the first K ranks' shards only
    coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
