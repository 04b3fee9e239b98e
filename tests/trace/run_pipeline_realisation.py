"""A training script that runs one ``measure`` pipeline realisation (a pickled Job), for ``placement trace``.

The stages of a measurement rank (``measure.ranks.pipeline.run_pipeline_job``: every stage
the tiny transformer without the other stages' parts, a ``PipelineStage`` run by
ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B over the pipeline axis, a data axis as ``replicate``; ZeroPP's
breadth-first schedule with every model chunk under ``fully_shard`` over the first data axis and its gradient
shards averaged (or ZeRO-1 stepped) over the second; the plan's loss normaliser, clipping over the stages, the
optimizer), written as a user's
script: the process group from the torchrun environment, a named DeviceMesh, no counters
and no single-process reference. Used by tests/test_trace.py.
"""

import pickle
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, schedules

from placement_logic.measure.ranks.common import MAX_NORM, local, make_optimizer
from placement_logic.measure.ranks.flat_zero import FlatZero
from placement_logic.measure.ranks.pipeline import _SCHEDULES, pipeline_clip, stage_model, zeropp_schedule
from placement_logic.measure.ranks.training import _batch, _loss_sum, loss_normaliser, tokens_of

with open(sys.argv[1], "rb") as fh:
    job = pickle.load(fh)
r, shape = job.realisation, job.shape
torch.set_num_threads(1)
dist.init_process_group("gloo")
names = tuple(a for a, _ in r.mesh)
mesh = init_device_mesh("cpu", tuple(s for _, s in r.mesh), mesh_dim_names=names)
coords = dict(zip(names, mesh.get_coordinate()))
p, m = r.stages, shape.microbatches
pp_rank = coords[r.pipeline_axis]
dp_index = 0
for a in r.data_axes:
    dp_index = dp_index * r.sizes[a] + coords[a]
v = r.chunks  # model chunks per rank (virtual stages pp_rank, pp_rank + p, ...: an interleaved schedule)
subs, stages = [], []
for c in range(v):
    sub = stage_model(shape, job.seed, pp_rank + c * p, p * v, r.recompute)
    if r.data == "ddp":
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(sub, mesh=mesh[r.data_axes[0]])
    elif r.data == "zeropp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(sub, mesh=mesh[r.data_axes[0]], reshard_after_forward=False)
    elif r.data is not None:
        raise SystemExit(f"data-parallel realisation {r.data} under a pipeline is not run by this script")
    subs.append(sub)
    stages.append(PipelineStage(sub, pp_rank + c * p, p * v, torch.device("cpu"),
                                group=mesh[r.pipeline_axis].get_group()))
named = [(n, q) for sub in subs for n, q in sub.named_parameters()]
params = [q for _, q in named]
zero, outer_sync = None, None
if r.data == "zeropp" and r.outer == "zero1":
    # ZeRO-1 over the second data axis of the FSDP shards (FSDP's reduce-scatter divided by the first axis)
    zero = opt = FlatZero(params, mesh[r.data_axes[1]].get_group(), 1, r.optimizer,
                          float(r.sizes[r.data_axes[1]]), r.regather)
else:
    opt = make_optimizer(r.optimizer, params)
    if r.data == "zeropp":
        outer, outer_n = mesh[r.data_axes[1]].get_group(), r.sizes[r.data_axes[1]]

        def outer_sync():
            # the FSDP gradient shards, replicated on the second data axis: averaged over it
            for q in params:
                if q.grad is not None:
                    g = local(q.grad)
                    dist.all_reduce(g, group=outer)
                    g.div_(outer_n)
clip = pipeline_clip(r, named, mesh, MAX_NORM, False) if r.clip else None
norm = [1.0]


def loss_fn(out, target):
    # the schedule divides the gradients by m: times m over the normaliser gives the plan's loss
    return _loss_sum(out, target) * m / norm[0]


if r.schedule == "zeropp":
    schedule = zeropp_schedule(stages, m, loss_fn, r.unit)
else:
    schedule = getattr(schedules, _SCHEDULES[r.schedule])(stages if v > 1 else stages[0], n_microbatches=m,
                                                           loss_fn=loss_fn)
rows = shape.microbatch * m
first, last = pp_rank == 0, pp_rank == p - 1
for step in range(job.steps):
    x, y = _batch(shape, rows * r.data_size, job.seed, step)
    lo, hi = dp_index * rows, (dp_index + 1) * rows
    norm[0] = loss_normaliser(r, tokens_of(y), tokens_of(y[lo:hi]))
    schedule.step(*((x[lo:hi],) if first else ()), **({"target": y[lo:hi]} if last else {}))
    if clip is not None:
        clip()
    if outer_sync is not None:
        outer_sync()
    if zero is not None:
        zero.reduce_gradients()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
