"""Data parallelism by hand (manual.py) that saves a checkpoint after every step and loads it back.

Rank 0 writes the model's and the optimizer's state with torch.save; every rank reads it back and
puts both back. Both states are replicas over the data-parallel ranks, so rank 0's copy is every
rank's: lifted as `override checkpoint: resume` and proved. `--model-only` (bug: the optimizer's
momentum is saved but never loaded back) is lifted as `override checkpoint: skip_optimizer` at the
load and refuted (SC checkpoint save).
"""

import os
import sys
import tempfile

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
path = os.path.join(tempfile.gettempdir(), f"placement_traced_checkpoint_{os.getppid()}.pt")
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    dist.barrier()
    state = torch.load(path)
    model.load_state_dict(state["model"])
    if "--model-only" not in sys.argv:
        opt.load_state_dict(state["opt"])
    dist.barrier()
if rank == 0:
    os.remove(path)
dist.destroy_process_group()
