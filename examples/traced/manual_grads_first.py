"""Bug: data parallelism written by hand whose gradient all-reduce runs over a group of the first K ranks only
(``dist.new_group(ranks[:K])``, the group meant for a subset, handed to the gradient sync): ranks 0..K-1 sum their
gradients, the others are no members and keep their own, and every rank divides by the world size, so the
replicas step with different gradients. Lifted as `override grads: reduce_first over (dp) by 2` at the all-reduce
and refuted (`GI grads blocks`). Run on 4 ranks (`--nproc 4`).

``--whole`` (the fix): every gradient all-reduced over every rank, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

WHOLE = "--whole" in sys.argv
K = 2

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
first = dist.new_group(list(range(K)))  # every rank creates it; ranks K.. are no members
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    for p in model.parameters():
        if WHOLE or rank < K:
            dist.all_reduce(p.grad, group=None if WHOLE else first)  # the bug: the first K ranks only
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
