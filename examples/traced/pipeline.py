"""Two pipeline stages written by hand with send and recv (one microbatch, GPipe order).

Stage 0 holds the embedding and the first block, stage 1 the second block, the final norm
and the head. `placement lift` does not lift pipeline schedules: it reports every send and
recv at its line (PL614) and `placement trace --check` exits 3.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny.build()
if rank == 0:
    stage = nn.ModuleDict({"embed": model.embed, "block": model.blocks[0]})
else:
    stage = nn.ModuleDict({"block": model.blocks[1], "norm": model.norm, "head": model.head})
opt = torch.optim.SGD(stage.parameters(), lr=0.1)
shape = (tiny.BATCH, tiny.SEQ, tiny.HIDDEN)
for step in range(2):
    x, y = tiny.batch(0, step)
    if rank == 0:
        h = stage["block"](stage["embed"](x))
        dist.send(h.detach(), dst=1)
        grad = torch.empty(shape)
        dist.recv(grad, src=1)
        h.backward(grad)
    else:
        h = torch.empty(shape)
        dist.recv(h, src=0)
        h.requires_grad_(True)
        logits = stage["head"](stage["norm"](stage["block"](h)))
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        dist.send(h.grad, dst=0)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
