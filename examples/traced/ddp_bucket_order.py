"""Bug: DistributedDataParallel over a model whose attention projections are registered in a rank-dependent
order (rank 0 registers q before k, the others k before q: a module dict filled from an unordered source, a
code path that depends on the rank). DDP lays its gradient buckets out in registration order and all-reduces
them element by element, so rank 0's q gradient is summed with the others' k gradient, with no error (the
shapes agree; deepspeedai/DeepSpeed#2343 is the same failure in ZeRO's buckets). Lifted as
`override grads: bucket_order over (dp)` at the DDP construction line and refuted (`GI grads bucket layout`).

``--same-order``: every rank registers the projections in one order (the fix), proved. Every square
projection starts from one seed, so DDP's initial broadcast (also in registration order) leaves the replicas
equal whatever the order.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SAME_ORDER = "--same-order" in sys.argv


class Attention(tiny.Attention):
    def __init__(self, rank: int):
        nn.Module.__init__(self)
        order = ("q", "k", "v", "proj") if rank == 0 or SAME_ORDER else ("k", "q", "v", "proj")  # the bug
        for name in order:
            torch.manual_seed(1)  # every square projection starts alike
            setattr(self, name, nn.Linear(tiny.HIDDEN, tiny.HIDDEN))


dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny.build()
for block in model.blocks:
    block.attn = Attention(rank)
model = DDP(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
