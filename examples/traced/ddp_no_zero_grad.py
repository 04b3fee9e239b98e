"""Bug: DistributedDataParallel training that never clears the gradients between optimizer steps.

No ``opt.zero_grad()`` (nor ``p.grad = None``): every backward adds into the buffers the previous steps
left, so step t's update reads the sum of the gradients of steps 1 to t (meta-pytorch/torchforge#71 and
tenstorrent/tt-blacksmith#711: the optimizers never zeroed after each step). `placement lift` reads the
buffers still holding a gradient at the first backward of the second step, and of every later one:
``override grads: no_zero_grad`` at that ``loss.backward()``, refuted by `placement trace --check`
(``GI grads[dense] across steps``).

``--fixed``: ``opt.zero_grad()`` after every step: proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FIXED = "--fixed" in sys.argv
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    if FIXED:
        opt.zero_grad()
dist.destroy_process_group()
