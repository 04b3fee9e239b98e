"""Bug: DistributedDataParallel with the gradient clipping under ``if rank == 0`` (a logging or clipping block
meant for the "main" process): rank 0 steps with the clipped gradient, the others with the unclipped one, so the
replicas drift apart from the first step whose norm exceeds the limit. Lifted as
`override grads: clip_rank0_only over (dp)` at the clipping line and refuted (`SC update`).

``--divide`` (bug): rank 0 divides every gradient by 2 once more (a second averaging under ``if rank == 0``):
`override grads: divide_rank0_only over (dp) by 2` at the division, refuted. ``--every-rank``: every rank clips
(the fix), proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

EVERY_RANK = "--every-rank" in sys.argv
DIVIDE = "--divide" in sys.argv

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    if EVERY_RANK:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    elif rank == 0 and DIVIDE:
        for p in model.parameters():
            p.grad.div_(2)  # the bug: divided again on rank 0 alone
    elif rank == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the bug: clipped on rank 0 alone
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
