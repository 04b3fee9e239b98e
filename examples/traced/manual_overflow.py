"""Data parallelism by hand with loss scaling: the scaled loss's gradients all-reduced and unscaled, and the
step skipped on every rank when any rank saw a non-finite gradient (the found-inf flag all-reduced with MAX
over the ranks). Lifted with `override overflow: reduce over (dp)` at the flag's all-reduce, and proved.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

SCALE = 1024.0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    (loss * SCALE).backward()
    found_inf = torch.zeros(1)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world * SCALE
        found_inf = torch.maximum(found_inf, (~torch.isfinite(p.grad)).any().float().reshape(1))
    dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)  # every rank skips or steps together
    if found_inf.item() == 0:
        opt.step()
    opt.zero_grad()
dist.destroy_process_group()
