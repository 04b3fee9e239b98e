"""DDP with a communication hook that sums the gradients but never averages them.

Bug modelled on published ones: a custom DDP comm hook (compression, logging) that calls
all_reduce on the bucket and returns it, forgetting the division by the world size that
DDP's default performs, so every gradient is world-size times too large.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def sum_hook(state, bucket):
    work = dist.all_reduce(bucket.buffer(), async_op=True)  # summed; the average is missing
    return work.get_future().then(lambda fut: fut.value()[0])


dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
model.register_comm_hook(None, sum_hook)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
