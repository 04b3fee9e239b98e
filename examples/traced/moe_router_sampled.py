"""Bug: a MoE layer under tensor parallelism by hand (2 tensor ranks, no sequence parallelism: both hold the same
tokens), each rank holding a column/row shard of every expert, the experts' partial outputs all-reduced before the
gate weights combine them; the replicated router's top-2 gate takes its first expert by the top-1 and samples its
second with ``torch.multinomial`` from the remaining probabilities (GShard's random routing, the sampled second
expert of DeepSpeed's top-2 gating: deepspeedai/Megatron-DeepSpeed#362, "DeepSpeed's MoE top2 gating performs
sampling to select 2nd expert"), drawn from a generator seeded with the rank, as a draw inside Megatron's
model-parallel RNG tracker is (pytorch/pytorch#103235): the two tensor ranks send one token's second half to
different experts while their first choices (the top-1, all the ``topk`` shows) agree. Lifted as ``override router:
vary over (tp)`` at the sampling and refuted (``GI router``). ``--shared-seed``: the second expert sampled from one
seed on every tensor rank (the fix), equal samples, proved. Run on 2 ranks.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import CopyToTensorRanks, ReduceFromTensorRanks
from torch import nn

SHARED = "--shared-seed" in sys.argv
IN, HIDDEN, FFN, CLASSES, BATCH, EXPERTS = 8, 16, 16, 8, 8, 4


class Experts(nn.Module):
    """Each rank's column shard of every expert's first linear and row shard of its second."""

    def __init__(self, rank: int, world: int):
        super().__init__()
        cols = FFN // world
        w1, w2 = torch.randn(EXPERTS, HIDDEN, FFN) / 4, torch.randn(EXPERTS, FFN, HIDDEN) / 4
        self.w1 = nn.Parameter(w1[:, :, rank * cols:(rank + 1) * cols].clone())
        self.w2 = nn.Parameter(w2[:, rank * cols:(rank + 1) * cols, :].clone())

    def forward(self, h):
        h = CopyToTensorRanks.apply(h)
        partial = torch.einsum("tef,efh->teh", F.gelu(torch.einsum("th,ehf->tef", h, self.w1)), self.w2)
        return ReduceFromTensorRanks.apply(partial)  # every expert's output on every token, summed over the ranks


class RoutedMLP(nn.Module):
    def __init__(self, rank: int, world: int):
        super().__init__()
        torch.manual_seed(0)
        rows = HIDDEN // world
        full = nn.Linear(IN, HIDDEN, bias=False)
        self.fc = nn.Parameter(full.weight.detach()[:, :].clone())  # replicated input projection
        proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.up = nn.Parameter(proj.weight.detach()[rank * rows:(rank + 1) * rows].clone())  # column-parallel
        down = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.down = nn.Parameter(down.weight.detach()[:, rank * rows:(rank + 1) * rows].clone())  # row-parallel
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = Experts(rank, world)
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.sampler = torch.Generator().manual_seed(4321 if SHARED else 4321 + rank)  # the bug: a per-rank seed

    def forward(self, x):
        h = F.linear(x, self.fc)
        h = ReduceFromTensorRanks.apply(F.linear(F.gelu(F.linear(CopyToTensorRanks.apply(h), self.up)), self.down))
        probs = F.softmax(self.router(h), dim=-1)
        first_gate, first = probs.topk(1, dim=-1)  # the first expert: the top-1
        rest = probs.scatter(1, first, 0.0)
        second = torch.multinomial(rest, 1, generator=self.sampler)  # the second expert: sampled
        chosen = torch.cat([first, second], dim=-1)
        gates = probs.gather(1, chosen)
        combine = torch.zeros_like(probs).scatter(1, chosen, gates / gates.sum(-1, keepdim=True))
        y = (combine.unsqueeze(-1) * self.experts(h)).sum(1)
        return self.head(h + y)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = RoutedMLP(rank, world)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    g = torch.Generator().manual_seed(step)  # the same batch on every tensor rank
    x, y = torch.randn(BATCH, IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
