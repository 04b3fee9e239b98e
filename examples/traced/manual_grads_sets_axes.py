"""Bug: data parallelism written by hand on a 2 x 2 (replicate, shard) device mesh whose gradient all-reduce runs
over a per-node group built from the launcher's placement of the ranks (a hostfile whose order the launcher does
not keep, open-mpi/ompi#4327: node a holds ranks 0 and 3, node b ranks 1 and 2). On the mesh those groups are
neither a mesh axis nor a part of one axis: rank 0 is (replicate=0, shard=0) and rank 3 (replicate=1, shard=1).
The node groups are the intra-node step of a hierarchical all-reduce whose inter-node step is missing, so each
node steps with its own partial sum. Lifted as `override grads: reduce_sets over (replicate, shard) ranks
([0, 3], [1, 2])` at the all-reduce and refuted (`GI grads blocks`). Run on 4 ranks (`--nproc 4`).

``--whole`` (the fix): every gradient all-reduced over every rank, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

WHOLE = "--whole" in sys.argv
NODE_OF_RANK = ("a", "b", "b", "a")  # where the launcher placed each rank

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
rank, world = dist.get_rank(), dist.get_world_size()
members = [[r for r in range(world) if NODE_OF_RANK[r] == node] for node in sorted(set(NODE_OF_RANK))]
groups = [dist.new_group(m) for m in members]  # every rank creates every group, in one order
node = next(g for g, m in zip(groups, members) if rank in m)
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=None if WHOLE else node)  # the bug: the node's ranks only
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
