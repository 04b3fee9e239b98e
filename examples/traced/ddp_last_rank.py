"""Bug: DistributedDataParallel with a division of every gradient on every rank but the last (the last rank of a
pipeline-like loop, or a "last rank already scaled" assumption: DeepSpeed#8152's every-stage-but-the-last with
three or more ranks). The ranks step by different coefficients and the replicas drift apart. Run on 3 ranks
(`--nproc 3`: on two, every rank but the last is rank 0). Lifted as
`override grads: divide_except_last over (dp) by 2` at the division and refuted (`SC update`).

``--last-only`` (bug): the last rank alone divides: `override grads: divide_last_only over (dp) by 2`, refuted.
``--fixed``: no rank divides again, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

LAST_ONLY = "--last-only" in sys.argv
FIXED = "--fixed" in sys.argv

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
last = rank == world - 1
model = DDP(tiny.build())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    if not FIXED and last == LAST_ONLY:
        for p in model.parameters():
            p.grad.div_(2)  # the bug: divided again on some ranks of the axis only
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
