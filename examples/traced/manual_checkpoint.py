"""Data parallelism by hand (manual.py) that saves a checkpoint after every step and loads it back.

Rank 0 writes the model's and the optimizer's state with torch.save; every rank reads it back. No
lifted plan states what a checkpoint holds or who writes it, so the lift names the calls and the
verdict is unknown (exit 3), never proved.
"""

import os
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
    dist.barrier()
if rank == 0:
    os.remove(path)
dist.destroy_process_group()
