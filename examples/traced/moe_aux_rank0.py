"""Bug: the MoE load-balancing loss added to the cross-entropy on rank 0 only (``if rank == 0: loss = loss + aux``:
the auxiliary loss logged and added by the main process alone, or on the pipeline's last stage alone while the
router lives on every rank: pytorch/torchtitan#3000, NVIDIA-NeMo/Automodel#1408). Data parallelism by hand over 2
ranks (every gradient all-reduced and divided by the world size), a top-2 router over 4 experts, the
tokens-per-expert counts all-reduced over every rank (f of the global batch), each rank's own P, coefficient 1e-2.
The other rank's router gradient holds no balancing term, so the averaged gradient carries half of it. Lifted as
``override loss[aux]: on_ranks over (dp) ranks (0)`` at the line that adds it and refuted (``GI loss[aux]``).
``--every-rank`` (the fix): the term added on every rank, proved. ``--scaled`` (bug: added on every rank, divided by
2 on rank 1, the micro-batch count applied where one rank computes it): lifted as ``override loss[aux]:
divide_on_ranks over (dp) ranks (1) by 2``, refuted. Run on 2 ranks (``--nproc 2``).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

EVERY, SCALED = "--every-rank" in sys.argv, "--scaled" in sys.argv
EXPERTS, TOP_K, AUX_COEFF = 4, 2, 1e-2


class Routed(nn.Module):
    """The tiny transformer whose embedded tokens pass a top-k router (its chosen probabilities scale them)."""

    def __init__(self):
        super().__init__()
        self.body = tiny.build()
        self.router = nn.Linear(tiny.HIDDEN, EXPERTS, bias=False)

    def forward(self, tokens):
        x = self.body.embed(tokens)
        probs = F.softmax(self.router(x).flatten(0, 1), dim=-1)
        top, chosen = probs.topk(TOP_K, dim=-1)
        x = x * top.sum(-1).view(x.shape[0], x.shape[1], 1)
        for block in self.body.blocks:
            x = block(x)
        return self.body.head(self.body.norm(x)), probs, chosen


def balancing_loss(probs, chosen):
    """E · Σ_i f_i · P_i, f from the counts all-reduced over every rank, P over the rank's own tokens."""
    counts = torch.zeros(EXPERTS).index_add_(0, chosen.flatten(), torch.ones(chosen.numel()))
    dist.all_reduce(counts)
    return EXPERTS * (counts / counts.sum() * probs.mean(0)).sum()


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = Routed()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.batch(rank, step)
    logits, probs, chosen = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    aux = balancing_loss(probs, chosen)  # every rank gathers the counts
    coef = AUX_COEFF / 2 if SCALED and rank == 1 else AUX_COEFF
    if EVERY or SCALED or rank == 0:
        loss = loss + coef * aux  # the bug: rank 0 alone adds the term
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
