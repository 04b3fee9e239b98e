"""Gradient accumulation under DistributedDataParallel, synchronised on every micro-step.

No ``no_sync``: every backward all-reduces the accumulated gradient, so the later reductions
also carry the earlier micro-steps' already averaged part. With DDP's averaging that is
correct but K times the communication: `placement lift` states it as
``override grads: reduce_every_microbatch`` and `placement trace --check` proves it.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 2  # micro-steps per optimizer step
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    for micro in range(K):
        x, y = tiny.batch(rank, step * K + micro)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / K
        loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
