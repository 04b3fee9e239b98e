"""Tensor parallelism written by hand with a layer before it: a replicated input projection, then a
column-parallel linear whose input passes through Megatron's copy-to-model-parallel region (the
identity in forward, an all-reduce of the input gradient over the tensor ranks in backward), then a
row-parallel linear whose partial outputs are all-reduced in its forward.

``--unreduced`` (bug): without the backward all-reduce the input projection receives only each rank's share
of its output gradient, so its weight gradient differs between the tensor ranks. ``--scaler``: loss scaling by
``torch.amp.GradScaler``, whose overflow check reads each rank's own weight slices and reduces the found-inf flag
over no rank (a rank may skip a step the others take; Megatron-LM all-reduces it over the model-parallel ranks):
lifted as `override loss_scale: local over (tp)` at `scaler.step(opt)` and refuted (`SC loss_scale`).
``--scaler --reduce-flag``: the found-inf flags all-reduced with MAX after `unscale_` (the fix), proved.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import CopyToTensorRanks, ReduceFromTensorRanks
from torch import nn

IN, HIDDEN, FFN, OUT, BATCH = 8, 16, 32, 8, 4
REDUCE_INPUT_GRAD = "--unreduced" not in sys.argv  # the bug: the input gradient never all-reduced


class ColumnLinear(nn.Module):
    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        rows = full.out_features // world
        self.weight = nn.Parameter(full.weight.detach()[rank * rows:(rank + 1) * rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rank * rows:(rank + 1) * rows].clone())

    def forward(self, x):
        if REDUCE_INPUT_GRAD:
            x = CopyToTensorRanks.apply(x)
        return F.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        cols = full.in_features // world
        self.weight = nn.Parameter(full.weight.detach()[:, rank * cols:(rank + 1) * cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        return ReduceFromTensorRanks.apply(F.linear(x, self.weight)) + self.bias


class MLP(nn.Module):
    def __init__(self, rank: int, world: int):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(IN, HIDDEN)
        self.fc1 = ColumnLinear(nn.Linear(HIDDEN, FFN), rank, world)
        self.fc2 = RowLinear(nn.Linear(FFN, OUT), rank, world)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.proj(x))))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = MLP(rank, world)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if "--scaler" in sys.argv else None
for step in range(2):
    g = torch.Generator().manual_seed(step)  # the same batch on every tensor rank
    x, y = torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)
    loss = F.cross_entropy(model(x), y)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        if "--reduce-flag" in sys.argv:
            scaler.unscale_(opt)
            for found_inf in scaler._found_inf_per_device(opt).values():
                dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)  # every rank skips, and updates its scale, alike
        scaler.step(opt)  # the found-inf flag from this rank's own weight slices, never all-reduced over the ranks
        scaler.update()
    opt.zero_grad()
dist.destroy_process_group()
