"""Bug: DistributedDataParallel handed a process group per node (``dist.new_group`` over blocks of 2 consecutive
ranks) for its gradient sync, where the whole data axis is meant: each node averages its own ranks' gradients
only, so the nodes drift apart. Lifted as `override grads: reduce_blocks over (dp) by 2` at the gradient sync and
refuted (`GI grads blocks`). Run on 4 ranks (`--nproc 4`): two blocks of two.

``--whole`` (the fix): DDP over every rank (the default group), proved. ``--strided`` (bug): groups of every other rank
({0, 2} and {1, 3}): lifted as `override grads: reduce_strided over (dp) by 2` and refuted likewise.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

WHOLE = "--whole" in sys.argv
STRIDED = "--strided" in sys.argv
BLOCK = 2

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if STRIDED:
    members = [list(range(i, world, BLOCK)) for i in range(BLOCK)]
else:
    members = [list(range(i, min(i + BLOCK, world))) for i in range(0, world, BLOCK)]
groups = [dist.new_group(m) for m in members]  # every rank creates every group, in one order
node = next(g for g, m in zip(groups, members) if rank in m)
group = dist.group.WORLD if WHOLE else node
model = DDP(tiny.build(), process_group=group)  # the bug: a node's group, not the data axis's
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
