"""Bug: data parallelism written by hand on a cluster whose nodes hold unequal numbers of GPUs (a node of 1 GPU and
a node of 3 on 4 ranks): the gradient all-reduce runs over the per-node group (``dist.new_group`` over each node's
consecutive ranks, the group meant for intra-node traffic), every rank dividing by the world size, so each node
steps with its own partial sum. Lifted as `override grads: reduce_groups over (dp) by (1, 3)` at the all-reduce
and refuted (`GI grads blocks`). Run on 4 ranks (`--nproc 4`).

``--whole`` (the fix): every gradient all-reduced over every rank, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

WHOLE = "--whole" in sys.argv
NODES = (1, 3)  # GPUs per node, in rank order

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
starts = [sum(NODES[:i]) for i in range(len(NODES))]
members = [list(range(s, s + n)) for s, n in zip(starts, NODES)]
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
