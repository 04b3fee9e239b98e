"""Tensor parallelism by hand (tp_rowwise.py) with dropout after the row-parallel linear, in the
region replicated over the tensor ranks (its input, the all-reduced output, is equal on every
rank), where every rank must draw the same mask: each rank seeds its generator with the same
seed before training, and the lift sees equal masks (proved).

`--seed-per-rank` (bug): each rank seeds with its own rank, so the tensor ranks drop different
elements of one replicated activation: the lift sees the dropout's input equal and its output
different on the two ranks, lifted as `override dropout_seed: vary over (tp)` at the dropout,
where the checker refutes it (SC dropout_seed).
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import ReduceFromTensorRanks
from torch import nn

HIDDEN, FFN, OUT, BATCH = 16, 32, 8, 4
REDUCE_ROW_OUTPUT = True  # the row-parallel linear's partial sums all-reduced over the tensor ranks


class ColumnLinear(nn.Module):
    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        rows = full.out_features // world
        self.weight = nn.Parameter(full.weight.detach()[rank * rows:(rank + 1) * rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rank * rows:(rank + 1) * rows].clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        cols = full.in_features // world
        self.weight = nn.Parameter(full.weight.detach()[:, rank * cols:(rank + 1) * cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        partial = F.linear(x, self.weight)
        if REDUCE_ROW_OUTPUT:
            partial = ReduceFromTensorRanks.apply(partial)
        return partial + self.bias


class MLP(nn.Module):
    def __init__(self, rank: int, world: int):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = ColumnLinear(nn.Linear(HIDDEN, FFN), rank, world)
        self.fc2 = RowLinear(nn.Linear(FFN, OUT), rank, world)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc2(F.gelu(self.fc1(x))))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = MLP(rank, world)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(100 + rank if "--seed-per-rank" in sys.argv else 100)  # the generator the dropout draws from
for step in range(2):
    g = torch.Generator().manual_seed(step)  # the same batch on every tensor rank
    x, y = torch.randn(BATCH, HIDDEN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
