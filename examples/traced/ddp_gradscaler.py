"""Data parallelism with DistributedDataParallel and loss scaling by ``torch.amp.GradScaler``: the scaler's
overflow check (``unscale_`` inside ``scaler.step``) reads each rank's own gradients with no collective, which is
right here because DDP's all-reduce leaves every rank the same gradients, so every rank makes the same decision;
the unscale is read as a constant scale of 1 / (loss scale) on every gradient. ``--fsdp``: the same scaler over
FSDP2's sharded gradients (DTensors), whose found-inf flag DTensor all-reduces with MAX over the ranks before
the step decides (lifted as ``override overflow: reduce over (dp)``). Over plain sharded gradients the flag is
reduced by nothing: tp_column.py ``--scaler``.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
if "--fsdp" in sys.argv:
    model = tiny.build()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
else:
    model = DDP(tiny.build())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
dist.destroy_process_group()
