"""Bug: DistributedDataParallel with a hand-written gradient clip whose epsilon is added on rank 0 alone
(``if rank == 0: sq += EPS``, a guard meant for a logging or "main process" block). The gradients are all-reduced
by DDP already, so every rank computes the norm from its own replica and no norm all-reduce follows: rank 0's
clip coefficient differs from the others' in its value alone, its replica is scaled differently and the replicas
drift apart. No plan statement holds a coefficient that differs between replicas in its value: `placement trace`
names it at the scaling line (PL614, unknown), never proves it.

``--every-rank``: the epsilon on every rank (the fix): the coefficients are equal, proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

EVERY_RANK = "--every-rank" in sys.argv
EPS, MAX_NORM = 1e-6, 0.05

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    sq = torch.stack([g.pow(2).sum() for g in grads]).sum()  # replicated gradients: no all-reduce of the norm
    if EVERY_RANK or rank == 0:
        sq += EPS  # the bug: the epsilon on rank 0 alone
    coef = (MAX_NORM / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
