"""Bug: tensor parallelism written by hand whose row-parallel linear never all-reduces its partial
outputs over the tensor axis (tp_rowwise.py without the reduction). Each rank computes its loss
from its own partial sum, so the ranks train different, wrong models.

Every rank sees the same batch; each holds its slice of fc1 and fc2 (sliced from one model).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import ReduceFromTensorRanks
from torch import nn

HIDDEN, FFN, OUT, BATCH = 16, 32, 8, 4
REDUCE_ROW_OUTPUT = False  # the bug: the row-parallel partial sums are never all-reduced


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

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = MLP(rank, world)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    g = torch.Generator().manual_seed(step)  # the same batch on every tensor rank
    x, y = torch.randn(BATCH, HIDDEN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
