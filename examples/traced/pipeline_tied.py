"""Two pipeline stages by hand whose first-stage embedding and last-stage head are one tied weight.

Stage 0 holds the embedding and the first block, stage 1 the second block, the final norm and
the head, whose weight starts as a copy of the embedding's ([vocab, hidden] on both stages). The
tie is kept by all-reducing the two copies' gradients over the stages after backward, so both
copies take the same update (Megatron's embedding group). GPipe order, two microbatches, each
microbatch's loss divided by their number. The lift sees the tie (the two matrices equal before
the first update, on the first and the last stage) and the all-reduce of the copies' gradients
over the stages: lifted as `tied_embeddings = true`, which the checker proves.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MICROBATCHES = 2
SUM_TIED_GRADS = True  # the tied copies' gradients all-reduced over the two stages
dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny.build()
model.head.weight = nn.Parameter(model.embed.weight.detach().clone())  # tied: the same initial values
if rank == 0:
    stage = nn.ModuleDict({"embed": model.embed, "block": model.blocks[0]})
    tied = stage["embed"].weight
else:
    stage = nn.ModuleDict({"block": model.blocks[1], "norm": model.norm, "head": model.head})
    tied = stage["head"].weight
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
    if SUM_TIED_GRADS:
        dist.all_reduce(tied.grad)  # the embedding group: both copies take the summed gradient
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
