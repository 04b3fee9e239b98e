"""Bug: data parallelism by hand (manual.py) whose ranks seed the generator with their rank before building
the model and never broadcast the weights, so the replicas start apart and stay apart.

The lift sees the replicas' weights differ before the first update and the ranks seeded apart: lifted as
`override params: no_init_broadcast over (dp)` at the torch.manual_seed line, where the checker refutes it
(SC params initial).
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)  # the bug: a seed per rank, and no broadcast of the initial weights
model = tiny.Tiny()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
