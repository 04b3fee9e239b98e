"""Bug: gradient accumulation whose ``optimizer.step()`` sits inside the accumulation loop.

Each optimizer step is meant to take K micro-steps (each loss divided by K), but the script steps the
optimizer after every backward and clears the gradients only after the K-th: AdamW takes K updates of
partial gradients per step instead of one of their sum (lucidrains/reformer-pytorch#97: the optimizer
stepped every iteration instead of every ``gradient_accumulate`` iterations; thunlp/OpenPrompt#106:
``optimizer.step()`` outside the accumulation condition). `placement lift` reads the gradients cleared
every K optimizer steps of one backward each as one accumulation of K microbatches stepped every
micro-step: ``override optimizer: step_every_microbatch`` at ``opt.step()``, refuted by
`placement trace --check` (``GI grads[dense] update over microbatches``).

``--fixed``: the step after the K-th backward, as ``accum_every_sync.py`` does: proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FIXED = "--fixed" in sys.argv
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
        if not FIXED:
            opt.step()  # the bug: an update after every micro-step
    if FIXED:
        opt.step()
    opt.zero_grad()
dist.destroy_process_group()
