"""Two pipeline stages run by torch.distributed.pipelining's ScheduleGPipe (PipelineStage per rank).

Stage 0 holds the embedding and the first block, stage 1 the second block, the final norm and the
head. The schedule splits each batch into two microbatches and moves their activations and
gradients with its own sends and receives (c10d calls, recorded as any other); the loss function
is a mean cross-entropy per microbatch, and the schedule divides the accumulated gradients by the
number of microbatches (``scale_grads``). Lifted as `pp: gpipe` (`--1f1b`: Schedule1F1B, lifted as
`pp: one_f_one_b`), `microbatches = 2`, and proved. The bug `--unscaled` (``scale_grads=False``) leaves the
gradient the sum of the microbatches' means, twice the step's mean: refuted at the schedule.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

MICROBATCHES = 2
SCHEDULE = Schedule1F1B if "--1f1b" in sys.argv else ScheduleGPipe
SCALE_GRADS = "--unscaled" not in sys.argv  # the bug: the microbatches' gradients summed, not averaged


class First(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.embed, self.block = model.embed, model.blocks[0]

    def forward(self, x):
        return self.block(self.embed(x))


class Last(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.block, self.norm, self.head = model.blocks[1], model.norm, model.head

    def forward(self, h):
        return self.head(self.norm(self.block(h)))


def loss_fn(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
part = First(model) if rank == 0 else Last(model)
stage = PipelineStage(part, rank, world, torch.device("cpu"))
schedule = SCHEDULE(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn, scale_grads=SCALE_GRADS)
opt = torch.optim.SGD(part.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.batch(0, step)
    x, y = torch.cat([x, x]), torch.cat([y, y])  # one batch of two microbatches
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=[])
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
