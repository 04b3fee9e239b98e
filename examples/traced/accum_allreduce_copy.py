"""Bug: the accumulating gradient buffer all-reduced again after every micro-step, into a separate accumulator.

Each optimizer step runs K micro-steps (each loss divided by K). After every micro-step's backward the script
all-reduces a copy of ``p.grad`` (divided by the world size) and adds it into an accumulator the optimizer then reads,
but never clears ``p.grad`` between micro-steps: after micro-step k the copy holds micro-steps 1..k, so micro-step k's
gradient is counted K - k + 1 times (hpcaitech/ColossalAI#247, "multiple reduction of gradients" under accumulation;
deepspeedai/DeepSpeed#684, fixed by #856: the reduced gradients left in the buffer and reduced again). `placement
lift` states it as ``override grads: reduce_accumulated_every_microbatch`` at the ``dist.all_reduce`` call, refuted by
`placement trace --check` (``GI grads[dense] over microbatches``).

``--fixed``: ``p.grad = None`` after each copy, so every reduction reads the new micro-step's gradient only: proved.
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
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
for step in range(2):
    acc = [torch.zeros_like(p) for p in params]
    for micro in range(K):
        x, y = tiny.batch(rank, step * K + micro)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / K
        loss.backward()
        for p, a in zip(params, acc):
            g = p.grad.clone()
            dist.all_reduce(g)  # the bug unless --fixed: the copy holds every earlier micro-step's gradient too
            a.add_(g / world)
            if FIXED:
                p.grad = None
    for p, a in zip(params, acc):
        p.grad = a
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
