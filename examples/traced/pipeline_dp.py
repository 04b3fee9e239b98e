"""Two data-parallel replicas of a two-stage pipeline (4 processes), 1F1B order.

Rank r is stage r % 2 of replica r // 2: ranks 0 and 1 form one pipeline, 2 and 3 the
other; each stage's gradients are all-reduced with the same stage of the other replica
and divided by the number of replicas. The last stage runs one forward then one backward
per microbatch (1F1B): the first microbatch's gradient goes back before the second
microbatch's activations arrive (sent with isend, so that stage 0 can still send the
second microbatch). Each microbatch's loss is divided by their number.
`placement trace --nproc 4 --check` lifts it as `dp: ddp` and `pp: one_f_one_b` with
`microbatches = 2` and proves it.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MICROBATCHES = 2
dist.init_process_group("gloo")
rank = dist.get_rank()
stage_no, replica = rank % 2, rank // 2
replicas = dist.get_world_size() // 2
groups = [dist.new_group([s, s + 2]) for s in range(2)]  # the same stage of both replicas
model = tiny.build()
if stage_no == 0:
    stage = nn.ModuleDict({"embed": model.embed, "block": model.blocks[0]})
else:
    stage = nn.ModuleDict({"block": model.blocks[1], "norm": model.norm, "head": model.head})
opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
shape = (tiny.BATCH, tiny.SEQ, tiny.HIDDEN)
for step in range(2):
    micro = [tiny.batch(replica * MICROBATCHES + k, step) for k in range(MICROBATCHES)]
    if stage_no == 0:
        outs = []
        for x, _ in micro:
            h = stage["block"](stage["embed"](x))
            dist.send(h.detach(), dst=rank + 1)
            outs.append(h)
        for h in outs:
            grad = torch.empty(shape)
            dist.recv(grad, src=rank + 1)
            h.backward(grad)
    else:
        sent = []
        for _, y in micro:  # one forward, then one backward
            h = torch.empty(shape)
            dist.recv(h, src=rank - 1)
            h.requires_grad_(True)
            logits = stage["head"](stage["norm"](stage["block"](h)))
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()) / MICROBATCHES
            loss.backward()
            sent.append(dist.isend(h.grad, dst=rank - 1))  # not waited on here: stage 0 still sends
        for work in sent:
            work.wait()
    for p in stage.parameters():
        dist.all_reduce(p.grad, group=groups[stage_no])
        p.grad /= replicas
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
