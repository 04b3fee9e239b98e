"""DDP plus a hand-written all-reduce of the gradients: each gradient is reduced twice.

Bug modelled on published ones: code ported from a hand-written data-parallel loop to
DistributedDataParallel keeps its own gradient all-reduce after backward, so gradients
DDP has already averaged are summed over the ranks again.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(tiny.build())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # the second reduction: DDP already averaged these
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
