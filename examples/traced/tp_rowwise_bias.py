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
then all-reduces it: which the recorder does not decide), --scaled (the MLP adds the bias to fc2's
bias-free partial sum and scales it before the all-reduce: reduce(s * (fc2(h) + b)), not decided),
--scaled-fixed (s * reduce(fc2(h)) + b), --sp (sequence parallelism by hand: fc2 reduce-scatters its
partial sum with the bias, F.linear(x, W, b), over the batch rows, and the MLP all-gathers the rows:
the bias counted on every rank), --sp-fixed (fc2
reduce-scatters its bias-free partial sum and adds the bias to its slice of rows; the bias's
gradient, each rank's rows only, all-reduced over the tensor ranks after backward as Megatron-LM
does for sequence-parallel parameters), --twice (fc2 all-reduces its bias-free partial sum, then all-reduces the
result again: every summand counted twice over), --two-products (fc2 all-reduces the products of the two halves of
its input features separately, then adds the bias and the residual: fixed), --statistic (the MLP all-reduces a
row statistic, (fc2(h) + b).sum(-1), of fc2's partial sum with the bias added on every rank, and centres the
output by it), --statistic-fixed (the statistic of fc2's bias-free partial sum, all-reduced, the bias's sum
added after), --sp-caller (fc2 returns its partial sum with the bias, the MLP reduce-scatters it: the bias
counted on every rank), --sp-caller-fixed (fc2 returns its bias-free partial sum, the MLP reduce-scatters it
and adds the bias to its slice of rows).

Every rank sees the same batch; each holds its slice of fc1's output features and of fc2's input
features (sliced from one model built from one seed), and the biases whole.
"""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from tensor_ranks import ReduceFromTensorRanks
from torch import nn

HIDDEN, FFN, OUT, BATCH = 16, 32, 8, 4
MODES = ("--residual", "--fixed", "--tanh", "--caller", "--caller-fixed", "--caller-residual", "--scaled",
         "--scaled-fixed", "--sp", "--sp-fixed", "--twice", "--two-products", "--statistic", "--statistic-fixed",
         "--sp-caller", "--sp-caller-fixed")
MODE = next((a[2:] for a in sys.argv[1:] if a in MODES), "bias")
SCALE = 0.5


def scatter_rows(x):
    """Sum the tensor ranks' partial values and keep this rank's slice of the rows (a reduce-scatter, sequence
    parallelism's reduction); its gradient all-gathered in backward (torch's autograd collectives)."""
    return funcol.reduce_scatter_tensor_autograd(x.contiguous(), "sum", 0, dist.group.WORLD)


class GatherRows(torch.autograd.Function):
    """All-gather every rank's slice of the rows; in backward each rank keeps its slice of the gradient (the
    same on every rank: every rank computes the same loss)."""

    @staticmethod
    def forward(ctx, x):
        whole = x.new_empty(x.shape[0] * dist.get_world_size(), *x.shape[1:])
        dist.all_gather_into_tensor(whole, x.contiguous())
        return whole

    @staticmethod
    def backward(ctx, grad):
        rows = grad.shape[0] // dist.get_world_size()
        return grad[dist.get_rank() * rows:(dist.get_rank() + 1) * rows]


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
        if MODE == "twice":  # the bug: the partial sum all-reduced, then its result all-reduced again
            return ReduceFromTensorRanks.apply(ReduceFromTensorRanks.apply(F.linear(x, self.weight))) + self.bias + residual
        if MODE == "two-products":  # each half of this rank's input features reduced on its own
            half = x.shape[-1] // 2
            first = ReduceFromTensorRanks.apply(F.linear(x[:, :half], self.weight[:, :half]))
            return first + ReduceFromTensorRanks.apply(F.linear(x[:, half:], self.weight[:, half:])) + self.bias + residual
        if MODE in ("caller", "sp-caller"):  # the bug: the partial sum with the bias, all-reduced by the caller
            return F.linear(x, self.weight, self.bias)
        if MODE in ("caller-fixed", "caller-residual", "scaled", "scaled-fixed", "statistic", "statistic-fixed",
                    "sp-caller-fixed"):
            return F.linear(x, self.weight)
        if MODE == "sp":  # the bug: the bias added to every rank's partial sum before the reduce-scatter
            return scatter_rows(F.linear(x, self.weight, self.bias))
        if MODE == "sp-fixed":
            return scatter_rows(F.linear(x, self.weight)) + self.bias
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
        if MODE == "scaled":  # the bug: the bias added to (and scaled on) every rank's partial sum
            return ReduceFromTensorRanks.apply(SCALE * (self.fc2(F.gelu(self.fc1(x)), None) + self.fc2.bias)) + x[:, :OUT]
        if MODE == "scaled-fixed":
            return SCALE * ReduceFromTensorRanks.apply(self.fc2(F.gelu(self.fc1(x)), None)) + self.fc2.bias + x[:, :OUT]
        if MODE in ("statistic", "statistic-fixed"):
            part = self.fc2(F.gelu(self.fc1(x)), None)
            if MODE == "statistic":  # the bug: the bias in every rank's summand of the statistic
                centre = ReduceFromTensorRanks.apply((part + self.fc2.bias).sum(-1, keepdim=True))
            else:
                centre = ReduceFromTensorRanks.apply(part.sum(-1, keepdim=True)) + self.fc2.bias.sum()
            return ReduceFromTensorRanks.apply(part) + self.fc2.bias - centre / OUT + x[:, :OUT]
        if MODE == "sp-caller":  # the bug: the bias in every rank's summand of the reduce-scatter
            return GatherRows.apply(scatter_rows(self.fc2(F.gelu(self.fc1(x)), None))) + x[:, :OUT]
        if MODE == "sp-caller-fixed":
            return GatherRows.apply(scatter_rows(self.fc2(F.gelu(self.fc1(x)), None)) + self.fc2.bias) + x[:, :OUT]
        if MODE in ("sp", "sp-fixed"):
            return GatherRows.apply(self.fc2(F.gelu(self.fc1(x)), None)) + x[:, :OUT]
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
    if MODE in ("sp-fixed", "sp-caller-fixed"):  # the bias's gradient from each rank's rows, summed over the tensor ranks
        dist.all_reduce(model.fc2.bias.grad)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
