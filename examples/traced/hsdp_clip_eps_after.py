"""Bug: FSDP2 hybrid sharding on a 2 x 2 (replicate, shard) device mesh with a hand-written gradient clip (the
squared norm all-reduced over a per-node group holding one rank of each shard, as in fsdp_clip_sets_axes.py: node
a ranks 0 and 3, node b ranks 1 and 2) whose squared norm gets an epsilon in a main-process block gated by the
node-local rank (ranks 0 and 1) AFTER the all-reduce. Every rank of a node holds the same sum, but rank 0 adds the
epsilon and rank 2, which holds the same shard (its replica along replicate), does not: the replicas scale equal
gradients by different clip coefficients and drift apart. No statement holds a coefficient that differs between
replicas in its value alone: named at the scaling line (PL614, unknown), never proved (before the replicas'
coefficients were compared along every axis the gradient is replicated on, the norm's all-reduce over both axes
hid it and the script was proved). Run on 4 ranks (``--nproc 4``).

``--every-rank`` (the fix): every rank adds the epsilon after the sum, the coefficients are equal: proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

EVERY_RANK = "--every-rank" in sys.argv
NODE_OF_RANK = ("a", "b", "b", "a")
EPS, MAX_NORM = 1e-6, 0.05  # a max norm below the gradients' own: every step clips

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
rank, world = dist.get_rank(), dist.get_world_size()
members = [[r for r in range(world) if NODE_OF_RANK[r] == node] for node in sorted(set(NODE_OF_RANK))]
groups = [dist.new_group(m) for m in members]  # every rank creates every group, in one order
node = next(g for g, m in zip(groups, members) if rank in m)
local_rank = next(m.index(rank) for m in members if rank in m)
model = tiny.build()
for block in model.blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    shards = [p.grad.to_local() for p in model.parameters()]
    sq = torch.stack([g.pow(2).sum() for g in shards]).sum()
    dist.all_reduce(sq, group=node)  # the global squared norm on every rank
    if EVERY_RANK or local_rank == 0:
        sq = sq + EPS  # the bug: the node's main process alone, after the sum
    coef = torch.clamp(MAX_NORM / (sq.sqrt() + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
