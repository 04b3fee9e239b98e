"""Bug: data parallelism written by hand, the gradients all-reduced with a sum inside the accumulation loop.

Each optimizer step runs K micro-steps (each loss divided by K). After every micro-step's backward the script
all-reduces ``p.grad`` in place with a sum and no division, while backward keeps adding into the same buffer: after
micro-step k every rank holds n times what it held before plus micro-step k's sum, so micro-step k's gradient reaches
the update multiplied by n^(K - k) (NVIDIA/Megatron-LM#6660: gradients doubled every microbatch at a group of two,
buf_k = 2 buf_(k-1) + g_k). `placement lift` states it as ``override grads: reduce_summed_every_microbatch`` at the
``dist.all_reduce`` call, refuted by `placement trace --check` (``GI grads[dense] over microbatches``).

``--fixed``: one all-reduce of the accumulated buffer after the K-th backward, divided by the world size: proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

FIXED = "--fixed" in sys.argv
K = 2  # micro-steps per optimizer step
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    for micro in range(K):
        x, y = tiny.batch(rank, step * K + micro)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / K
        loss.backward()
        if not FIXED:
            for p in model.parameters():
                dist.all_reduce(p.grad)  # the bug: a sum of the accumulating buffer, written back, every micro-step
    if FIXED:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    else:
        for p in model.parameters():
            p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
