"""Bug: a padded fine-tuning batch through a dropping MoE router (top-2 of 4 experts, capacity factor 1), the
padding mask reaching the loss (labels -100) but not the router's routing map: the padded positions are routed,
take expert slots by their router scores and count in the capacity C = ⌈capacity_factor · k · N / E⌉ of each call
(NVIDIA/Megatron-LM#5542, "Exclude padding tokens from MoE routing": "masking padding only in auxiliary-loss
calculations still lets padding consume expert capacity"). The capacity step keeps each expert's C tokens of the
highest scores (a ``topk`` over the token dimension, Megatron-LM's ``moe_token_drop_policy = probs``). Lifted as
``override capacity: counts_padding`` at that ``topk`` and refuted there (``GI capacity``). ``--fixed``: the
routing map masked by the padding and C computed from the real tokens: ``capacity: masks_padding``, proved.
The loss is the global token mean (the summed cross-entropy times the world size over the all-reduced count).
Run on 2 ranks.
"""

import math
import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

FIXED = "--fixed" in sys.argv
EXPERTS, TOP_K, CAPACITY_FACTOR = 4, 2, 1.0


class Routed(nn.Module):
    """The tiny transformer whose embedded tokens pass a top-k router with a capacity step (the kept experts'
    probabilities scale them)."""

    def __init__(self):
        super().__init__()
        self.body = tiny.build()
        self.router = nn.Linear(tiny.HIDDEN, EXPERTS, bias=False)

    def forward(self, tokens, real):
        x = self.body.embed(tokens)
        probs = F.softmax(self.router(x).flatten(0, 1), dim=-1)
        _, chosen = probs.topk(TOP_K, dim=-1)
        routing = torch.zeros_like(probs).scatter(1, chosen, 1.0)
        n = routing.shape[0]
        if FIXED:  # the padding masked out of the routing map, the capacity from the real tokens
            routing = routing * real.view(-1, 1)
            n = int(real.sum())
        capacity = math.ceil(CAPACITY_FACTOR * TOP_K * n / EXPERTS)
        scores = probs * routing
        _, slots = scores.topk(capacity, dim=0)  # each expert keeps its C tokens of the highest scores
        kept = torch.zeros_like(probs).scatter(0, slots, 1.0) * routing
        x = x * (probs * kept).sum(-1).view(x.shape[0], x.shape[1], 1)
        for block in self.body.blocks:
            x = block(x)
        return self.body.head(self.body.norm(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(Routed())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.padded_batch(rank, step)
    labels = y.flatten()
    real = (labels != tiny.IGNORE).float()  # the padding mask
    count = (labels != tiny.IGNORE).sum()
    dist.all_reduce(count)  # the step's tokens over every rank
    loss_sum = F.cross_entropy(model(x, real).flatten(0, 1), labels, ignore_index=tiny.IGNORE, reduction="sum")
    loss = loss_sum * world / count
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
