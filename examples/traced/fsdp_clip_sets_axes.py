"""FSDP2 hybrid sharding on a 2 x 2 (replicate, shard) device mesh with a hand-written gradient clip whose squared
norm is all-reduced over a per-node group built from the launcher's placement of the ranks (node a holds ranks 0
and 3, node b ranks 1 and 2: a hostfile whose order the launcher does not keep, open-mpi/ompi#4327). On the mesh
each node's group is a diagonal, rank 0 = (replicate=0, shard=0) and rank 3 = (replicate=1, shard=1): it holds one
rank of each shard, and the replicas hold the same squared norms, so every node's norm is the global one. Lifted
as `override clip_norm: reduce_sets over (replicate, shard) ranks ([0, 3], [1, 2])` at the all-reduce and proved.
Run on 4 ranks (`--nproc 4`).

``--uneven`` (a bug): node a holds ranks 0, 1 and 2, node b rank 3; node a's group holds two ranks of shard 0 and
counts that shard's squared norm twice, node b's misses shard 0: lifted as `ranks ([0, 1, 2], [3])` and refuted
(`SC clip_norm`).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

NODE_OF_RANK = ("a", "a", "a", "b") if "--uneven" in sys.argv else ("a", "b", "b", "a")

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
rank, world = dist.get_rank(), dist.get_world_size()
members = [[r for r in range(world) if NODE_OF_RANK[r] == node] for node in sorted(set(NODE_OF_RANK))]
groups = [dist.new_group(m) for m in members]  # every rank creates every group, in one order
node = next(g for g, m in zip(groups, members) if rank in m)
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
    dist.all_reduce(sq, group=node)  # the squared norms of the ranks of this node's group
    coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
