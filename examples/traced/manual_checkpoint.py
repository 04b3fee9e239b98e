"""Data parallelism by hand (manual.py) that saves a checkpoint after every step and loads it back.

Rank 0 writes the model's and the optimizer's state with torch.save; every rank reads it back and
puts both back. Both states are replicas over the data-parallel ranks, so rank 0's copy is every
rank's: lifted as `override checkpoint: resume` and proved. `--model-only` (bug: the optimizer's
momentum is saved but never loaded back) is lifted as `override checkpoint: skip_optimizer` at the
load and refuted (SC checkpoint save).

`--rng-restored`: the step draws dropout masks (on the logits), every rank saves its generator's
state (torch.get_rng_state()) to a file of its own, and the load runs as a restarted job would:
the generator re-seeded first (a fresh process at its seed), then the model, the optimizer and
the rank's RNG state put back with torch.set_rng_state. Every rank resumes from the state it held
at the save: lifted as `override checkpoint: resume` and proved. `--rng-not-restored` (bug: the
RNG state is loaded and its restore skipped, as huggingface/accelerate#4283's failed RNG load is
logged and skipped) resumes every rank from its seed, not from the state it held at the save:
lifted as `override checkpoint: rng_not_restored` at the load and refuted (SC checkpoint rng).
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
RNG = "--rng-restored" in sys.argv or "--rng-not-restored" in sys.argv
path = os.path.join(tempfile.gettempdir(), f"placement_traced_checkpoint_{os.getppid()}.pt")
for step in range(2):
    x, y = tiny.batch(rank, step)
    logits = F.dropout(model(x), p=0.1) if RNG else model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    if RNG:
        torch.save(torch.get_rng_state(), f"{path}.rng{rank}")
    dist.barrier()
    if RNG:
        torch.manual_seed(0)  # the restarted job: a fresh process's generator at its seed
    state = torch.load(path)
    model.load_state_dict(state["model"])
    if "--model-only" not in sys.argv:
        opt.load_state_dict(state["opt"])
    if RNG:
        rng = torch.load(f"{path}.rng{rank}")
        if "--rng-not-restored" not in sys.argv:
            torch.set_rng_state(rng)
    dist.barrier()
if RNG:
    os.remove(f"{path}.rng{rank}")
if rank == 0:
    os.remove(path)
dist.destroy_process_group()
