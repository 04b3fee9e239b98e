"""Bug: tensor parallelism written by hand whose row-parallel linear adds its bias to every rank's
partial sum before the all-reduce over the tensor axis (tp_rowwise.py with the bias moved into
F.linear): the reduced output is x W^T + tp*b, not x W^T + b. Modelled on slapo's row-parallel
linear (awslabs/slapo#10) and TransformerEngine's JAX GEMM with a fused bias before the all-reduce
(NVIDIA/TransformerEngine#2230); examples/bugs/slapo_row_linear_bias_reduced.place states it.

Options: --residual (the bias added after the all-reduce, but the residual, passed to fc2, added to
every rank's partial sum before it), --fixed (the bias and the residual added after the all-reduce,
as Megatron-LM does), --tanh (tanh applied to every rank's partial sum before the all-reduce: an
operation the recorder does not recompute), --caller (fc2 returns its partial sum with the bias and
the MLP all-reduces it), --caller-fixed (fc2 returns its bias-free partial sum, the MLP adds the bias
after the all-reduce), --caller-residual (the MLP adds the residual to fc2's bias-free partial sum,
then all-reduces it: which the recorder does not decide).

Every rank sees the same batch; each holds its slice of fc1's output features and of fc2's input
features (sliced from one model built from one seed), and the biases whole.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import ReduceFromTensorRanks
from torch import nn

HIDDEN, FFN, OUT, BATCH = 16, 32, 8, 4
MODES = ("--residual", "--fixed", "--tanh", "--caller", "--caller-fixed", "--caller-residual")
MODE = next((a[2:] for a in sys.argv[1:] if a in MODES), "bias")


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

    def forward(self, x, residual):
        if MODE == "caller":  # the bug: the partial sum with the bias, all-reduced by the caller
            return F.linear(x, self.weight, self.bias)
        if MODE in ("caller-fixed", "caller-residual"):
            return F.linear(x, self.weight)
        if MODE == "bias":  # the bug: the bias added to every rank's partial sum
            return ReduceFromTensorRanks.apply(F.linear(x, self.weight, self.bias)) + residual
        if MODE == "residual":  # the bug: the residual added to every rank's partial sum
            return ReduceFromTensorRanks.apply(F.linear(x, self.weight) + residual) + self.bias
        if MODE == "tanh":  # the bug: a nonlinearity on every rank's partial sum
            return ReduceFromTensorRanks.apply(torch.tanh(F.linear(x, self.weight))) + self.bias + residual
        return ReduceFromTensorRanks.apply(F.linear(x, self.weight)) + self.bias + residual


class MLP(nn.Module):
    def __init__(self, rank: int, world: int):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = ColumnLinear(nn.Linear(HIDDEN, FFN), rank, world)
        self.fc2 = RowLinear(nn.Linear(FFN, OUT), rank, world)

    def forward(self, x):
        if MODE == "caller":
            return ReduceFromTensorRanks.apply(self.fc2(F.gelu(self.fc1(x)), None)) + x[:, :OUT]
        if MODE == "caller-fixed":
            return ReduceFromTensorRanks.apply(self.fc2(F.gelu(self.fc1(x)), None)) + self.fc2.bias + x[:, :OUT]
        if MODE == "caller-residual":  # the bug: the residual added to every rank's partial sum
            return ReduceFromTensorRanks.apply(self.fc2(F.gelu(self.fc1(x)), None) + x[:, :OUT]) + self.fc2.bias
        return self.fc2(F.gelu(self.fc1(x)), x[:, :OUT])


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
