"""Two pipeline stages clipping their gradients by each stage's own norm.

Bug modelled on a published one: torchtitan's pipeline-parallel training had to
special-case gradient clipping, because `clip_grad_norm_` called on one stage's parameters
computes the norm of that stage's gradients only (meta-pytorch/torchtune#2169; the spec form
is examples/bugs/pipeline_clip_per_stage.place). Every stage scales its gradients by a
different coefficient, none of them the global one. The schedule is the one of
`pipeline.py`; only the clipping differs: the squared norm is never all-reduced over the
stages. `placement trace --nproc 2 --check` refutes `SC clip_norm` at the clipping line.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MICROBATCHES = 2
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
    torch.nn.utils.clip_grad_norm_(stage.parameters(), max_norm=1.0)  # this stage's norm only
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
