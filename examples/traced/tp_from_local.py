"""Tensor parallelism by hand with DTensor at the row-parallel boundary: the row-parallel linear's
partial outputs wrapped by `DTensor.from_local(..., [Partial()])` and redistributed to
`Replicate()` (an all-reduce in forward), then `to_local()`.

The placement is asserted, not derived: the lift records it with a checksum of every rank's
local values. `Partial` over values that differ is not contradicted, but what the step does
with a declared type is not lifted: unknown (exit 3), named at the `from_local` line.
`--replicate` (bug): the partial sums asserted `Replicate()`, so nothing reduces them and each
rank goes on with its own partial output: lifted as `override activations[mlp]:
assert_replicate over (tp)` at the `from_local` line, where the checker refutes it.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate

HIDDEN, FFN, OUT, BATCH = 16, 32, 8, 4
ASSERTED = Replicate() if "--replicate" in sys.argv else Partial()  # the type the partial sums are declared


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
        out = DTensor.from_local(partial, MESH, [ASSERTED]).redistribute(MESH, [Replicate()]).to_local()
        return out + self.bias


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
MESH = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
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
