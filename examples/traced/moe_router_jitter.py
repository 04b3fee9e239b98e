"""Bug: a MoE layer under tensor parallelism by hand (2 tensor ranks, no sequence parallelism: both hold the same
tokens), each rank holding a column/row shard of every expert, the experts' partial outputs all-reduced before the
gate weights combine them; the router (replicated) adds gate noise to its logits (noisy top-k gating, the router
jitter of MegaBlocks and Megatron-LM: databricks/megablocks#118) drawn from a generator seeded with the rank, as a
draw inside Megatron's model-parallel RNG tracker is, whose state is "different within a tensor parallel group"
(pytorch/pytorch#103235): the two tensor ranks route one token to different experts. Lifted as ``override router:
vary over (tp)`` at the noise draw and refuted (``GI router``). ``--shared-seed``: the noise drawn from one seed on
every tensor rank (the fix), equal choices, proved. ``--partial``: the noise shared, but the router reads the
row-parallel linear's partial sums before their all-reduce (a nonlinear choice on per-rank partials,
vllm-project/vllm-ascend#14345): lifted as ``override router: input_partial over (tp)`` at the router's line and
refuted. Run on 2 ranks.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import CopyToTensorRanks, ReduceFromTensorRanks
from torch import nn

SHARED = "--shared-seed" in sys.argv or "--partial" in sys.argv
PARTIAL = "--partial" in sys.argv
IN, HIDDEN, FFN, CLASSES, BATCH, EXPERTS, TOP_K, NOISE = 8, 16, 16, 8, 8, 4, 2, 1.0


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
        self.noise = torch.Generator().manual_seed(1234 if SHARED else 1234 + rank)  # the bug: a per-rank seed

    def forward(self, x):
        h = F.linear(x, self.fc)
        partial = F.linear(F.gelu(F.linear(CopyToTensorRanks.apply(h), self.up)), self.down)
        h = ReduceFromTensorRanks.apply(partial)
        logits = self.router(partial if PARTIAL else h)
        logits = logits + NOISE * torch.randn(logits.shape, generator=self.noise)  # the gate noise
        probs = F.softmax(logits, dim=-1)
        gates, chosen = probs.topk(TOP_K, dim=-1)
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
