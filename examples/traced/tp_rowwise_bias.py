"""Tensor parallelism written by hand: a column-parallel linear, then a row-parallel one whose
partial outputs are all-reduced over the tensor axis in its forward (Megatron's
reduce-from-model-parallel region: an all-reduce in forward, the identity in backward).

Every rank sees the same batch; each holds its slice of fc1's output features and of fc2's
input features (sliced from one model built from one seed), and the biases whole.
"""

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
        out = F.linear(x, self.weight, self.bias)  # the bug: the bias added to every rank's partial sum
        return ReduceFromTensorRanks.apply(out)


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
