"""A training script that runs one ``measure`` realisation (a pickled Job), for ``placement trace``.

The same steps as a measurement rank (``measure.ranks.worker.run_job``: the realisation
applied to the tiny transformer, variable-length batches (each context rank's block of every
sequence, each expert rank's own rows), the plan's loss normaliser,
clipping and the optimizer), written as a user's script: the process group from the
torchrun environment, a named DeviceMesh, no counters. Used by tests/test_trace.py.
"""

import pickle
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from placement_logic.measure.ranks import model as tiny
from placement_logic.measure.ranks.common import param_dtype
from placement_logic.measure.ranks.torch_plan import apply
from placement_logic.measure.ranks.training import _batch, _loss_sum, loss_normaliser, tokens_of

with open(sys.argv[1], "rb") as fh:
    job = pickle.load(fh)
r = job.realisation
torch.set_num_threads(1)
dist.init_process_group("gloo")
names = tuple(a for a, _ in r.mesh)
mesh = init_device_mesh("cpu", tuple(s for _, s in r.mesh), mesh_dim_names=names)
coords = dict(zip(names, mesh.get_coordinate()))
dp, dp_index = 1, 0
for a in r.data_axes + ((r.expert_axis,) if r.expert_axis else ()):  # expert-parallel ranks hold other data
    dp_index = dp_index * r.sizes[a] + coords[a]
    dp *= r.sizes[a]
mb, m = job.shape.microbatch, job.shape.microbatches
rows = mb * m  # this data-parallel rank's rows: m microbatches, gradients accumulated
global_batch = rows * dp
trainer = apply(r, tiny.build(job.shape, job.seed, r.recompute).to(dtype=param_dtype(r.param_bytes)), mesh)
# context parallelism: this rank's contiguous block of every sequence
cp = r.sizes[r.context_axis] if r.context_axis else 1
c0 = coords[r.context_axis] * job.shape.seq // cp if r.context_axis else 0
c1 = c0 + job.shape.seq // cp
for step in range(job.steps):
    x, y = _batch(job.shape, global_batch, job.seed, step)
    x, y_all, y = x[:, c0:c1], y, y[:, c0:c1]
    lo, hi = dp_index * rows, (dp_index + 1) * rows
    # the token count the loss is divided by: every rank's with data, or (override tokens: reduce over the data
    # axis alone) this context block's
    counted = tokens_of(y) if r.tokens_over is not None and r.context_axis not in r.tokens_over else tokens_of(y_all)
    norm = loss_normaliser(r, counted, tokens_of(y[lo:hi]))
    with loss_parallel() if trainer.loss_parallel else nullcontext():
        for k in range(m):
            a, b = lo + k * mb, lo + (k + 1) * mb
            with nullcontext() if k == m - 1 or trainer.no_sync is None else trainer.no_sync():
                loss = _loss_sum(trainer.module(x[a:b]), y[a:b]) / norm
                loss.backward()
            if trainer.after_microbatch is not None:
                trainer.after_microbatch()
        if trainer.after_backward is not None:
            trainer.after_backward()
        if trainer.clip is not None:
            trainer.clip()
        trainer.optimizer.step()
    trainer.optimizer.zero_grad()
dist.destroy_process_group()
