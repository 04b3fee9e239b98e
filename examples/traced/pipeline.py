"""Two pipeline stages written by hand with send and recv, GPipe order, global clipping.

Stage 0 holds the embedding and the first block, stage 1 the second block, the final norm and the head. Each
step's two microbatches: stage 0 sends both activations forward, then receives both gradients back (GPipe); each
microbatch's loss is divided by their number. The gradients are clipped by the global norm, each stage's squared
norm all-reduced over the two stages first: lifted as `pp: gpipe`, `microbatches = 2`, and proved. ``--eps``
(bug): each stage adds 1e-6 to its squared norm before the all-reduce (the sum holds 2e-6): lifted as
`override clip_norm: eps_before_reduce by 1e-06` at the norm line and refuted (`SC clip_norm`).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MICROBATCHES, EPS = 2, (1e-6 if "--eps" in sys.argv else 0.0)  # the bug: an epsilon per stage
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
    micro = [tiny.batch(k, step) for k in range(MICROBATCHES)]
    if rank == 0:
        outs = []
        for x, _ in micro:
            h = stage["block"](stage["embed"](x))
            dist.send(h.detach(), dst=1)
            outs.append(h)
        for h in outs:
            grad = torch.empty(shape)
            dist.recv(grad, src=1)
            h.backward(grad)
    else:
        ins, losses = [], []
        for _, y in micro:
            h = torch.empty(shape)
            dist.recv(h, src=0)
            h.requires_grad_(True)
            logits = stage["head"](stage["norm"](stage["block"](h)))
            ins.append(h)
            losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten()) / MICROBATCHES)
        for h, loss in zip(ins, losses):
            loss.backward()
            dist.send(h.grad, dst=0)
    # global-norm clipping: the squared norm summed over both stages
    sq = torch.stack([p.grad.pow(2).sum() for p in stage.parameters()]).sum() + EPS
    dist.all_reduce(sq)
    coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
    for p in stage.parameters():
        p.grad.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
