"""Gradient accumulation under DistributedDataParallel: the correct version.

Each optimizer step runs K micro-steps; the first K - 1 backwards skip DDP's all-reduce
(``no_sync``) and the last one synchronises the accumulated gradient. Each micro-step's
loss is divided by K, so the step's gradient is the mean over all micro-batches.
"""

import contextlib

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
        sync = contextlib.nullcontext() if micro == K - 1 else model.no_sync()
        with sync:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / K
            loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
