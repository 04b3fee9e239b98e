"""Bug: a global-batch load-balancing loss (Megatron-LM's ``global_aux_loss``: the tokens-per-expert counts
all-reduced over the tensor, data and context group, each rank keeping its own mean router probabilities P) on
two data axes by hand, whose counts are all-reduced over the inner axis only: the group of the per-microbatch aux
loss (Megatron's tensor and context group; NVIDIA/Megatron-LM#2095 names both groups) in place of the global
loss's. The statistics' groups are what Megatron-LM#7197 and #7213 (the accumulated counts' normalisation) and
#4302 (dynamic context parallelism) get wrong in other ways. The lifted model states single-device training's
objective, the statistics over every token of the step (``aux_stats = global_batch``); the script's f is
gathered over ``shard``, its P kept per rank: lifted as ``override loss[aux]: stats_per_step over (shard)`` and
``probs_per_step over ()``, refuted (``GI aux_stats``) at the counts' all-reduce. ``--fixed``: the counts
all-reduced over every rank, ``stats_per_step over (replicate, shard)``, proved (f and P over groups of their own:
decided for router calls of equal token counts, noted). ``--probs``: P all-reduced over the same group as the
counts (no probs statement); ``--fixed --probs`` proved. ``--local``: the counts never all-reduced, each rank's
statistics its own microbatch's (Megatron-LM's per-microbatch aux loss without tensor or context ranks): lifted
as ``stats_per_step over ()``, refuted against the default objective, proved with ``--objective
aux_stats=per_microbatch`` (the objective the script means, stated). Run on 4 ranks (``--nproc 4``).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

FIXED, PROBS, LOCAL = "--fixed" in sys.argv, "--probs" in sys.argv, "--local" in sys.argv
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


def balancing_loss(probs, chosen, group):
    """E · Σ_i f_i · P_i, f from the counts all-reduced over ``group``, P over the rank's tokens (or ``group``)."""
    counts = torch.zeros(EXPERTS).index_add_(0, chosen.flatten(), torch.ones(chosen.numel()))
    if not LOCAL:
        dist.all_reduce(counts, group=group)
    f = counts / counts.sum()
    p_sum = probs.sum(0)
    if PROBS:
        p_sum = p_sum.clone()
        dist.all_reduce(p_sum, group=group)
        return EXPERTS * (f * p_sum).sum() / (counts.sum() / TOP_K)
    return EXPERTS * (f * p_sum).sum() / probs.shape[0]


dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
rank, world = dist.get_rank(), dist.get_world_size()
group = None if FIXED else mesh["shard"].get_group()  # the bug: the replicate axis is missing
model = Routed()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.batch(rank, step)
    logits, probs, chosen = model(x)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss = ce + AUX_COEFF * balancing_loss(probs, chosen, group)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
