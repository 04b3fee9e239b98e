"""One rank of a measurement run (torch).

Input: a ``Job`` (realisation, tiny shape, steps, seed), this process's rank and the
rendezvous port. Output: a JSON file per rank and job holding what was measured: the
collectives of every step (from ``CollectiveCounter``), the bytes of parameters,
gradients and optimizer state this rank holds after the last step (local storage,
shared storage counted once), the losses, and the largest difference from the same
steps run on one process (which each rank computes itself, from the same seed and data).
"""

from __future__ import annotations

import gc
import json
import os
import traceback
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..dist_env import DistEnv, device_choice, local_env
from ..realise import Realisation  # noqa: F401 - part of a Job
from ..shape import TinyShape  # noqa: F401 - part of a Job
from .shutdown import finish
from .training import (  # noqa: F401,E501
    IGNORE,
    Job,
    _batch,
    _loss_sum,
    _reference,
    _storage_bytes,
    after_microstep,
    clear_after_step,
    gradient_difference,
    held_bytes,
    loss_normaliser,
    tokens_of,
)

TIMEOUT_S = int(os.environ.get("PLACEMENT_MEASURE_TIMEOUT", "120"))  # a collective that waits longer than this fails the job


def _unsharded_on(trainer, axis: str | None) -> int:
    """Local bytes of parameters that are not sharded over ``axis`` (replicated on it)."""
    from .torch_plan import local

    if axis is None:
        return 0
    total = 0
    for name, p in trainer.named:
        if not trainer.sharded_on(name, p, axis):
            t = local(p)
            total += t.numel() * t.element_size()
    return total


def _device(env: DistEnv):
    """``cuda:LOCAL_RANK`` when the node has a GPU for every local rank (NCCL), else the CPU (gloo):
    ``dist_env.device_choice``."""
    import torch

    cuda = torch.cuda.is_available()
    kind, index, _ = device_choice(env.local_rank, env.local_world, cuda, torch.cuda.device_count() if cuda else 0)
    return torch.device(kind, index) if index is not None else torch.device(kind)


def backend_of(device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def run_job(job: Job, rank: int, device) -> dict:
    from contextlib import nullcontext

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from . import model as tiny
    from .activations import SavedActivations
    from .common import param_dtype
    from .counter import CollectiveCounter
    from .torch_plan import apply, local

    r = job.realisation
    names = tuple(a for a, _ in r.mesh)
    mesh = init_device_mesh(device.type, tuple(s for _, s in r.mesh), mesh_dim_names=names)
    coords = dict(zip(names, mesh.get_coordinate()))
    if r.pipeline_axis is not None:
        from .pipeline import run_pipeline_job

        return {"rank": rank, **run_pipeline_job(job, mesh, device, coords)}
    dp = 1
    dp_index = 0
    for a in r.data_axes + ((r.expert_axis,) if r.expert_axis else ()):  # expert-parallel ranks hold other data
        dp_index = dp_index * r.sizes[a] + coords[a]
        dp *= r.sizes[a]
    mb, m = job.shape.microbatch, job.shape.microbatches
    rows = mb * m  # this data-parallel rank's rows: m microbatches of mb sequences, gradients accumulated
    global_batch = rows * dp
    # the parameters (and so the gradients and activations) in the stated width's dtype
    trainer = apply(r, tiny.build(job.shape, job.seed, r.recompute).to(device, param_dtype(r.param_bytes)), mesh)
    dropout = None
    if r.dropout:
        tp_rank = coords[r.tensor_axis]
        dropout = tiny.HiddenDropout(job.seed, global_batch, job.shape.seq, job.shape.hidden)
        dropout.seq_index = tp_rank if r.sequence_parallel else 0
        dropout.vary_by = tp_rank if r.dropout == "vary" else 0
        dropout.same = r.dropout == "same"
        tiny.use_dropout(trainer.inner, dropout)
    steps, losses, tokens = [], [], []
    grads0 = None
    # context parallelism: this rank's contiguous block of every sequence
    cp = r.sizes[r.context_axis] if r.context_axis else 1
    c0 = coords[r.context_axis] * job.shape.seq // cp if r.context_axis else 0
    c1 = c0 + job.shape.seq // cp
    for step in range(job.steps):
        x, y = _batch(job.shape, global_batch, job.seed, step)
        x, y_all = x[:, c0:c1], y
        y = y[:, c0:c1]
        lo, hi = dp_index * rows, (dp_index + 1) * rows
        tokens.append(tokens_of(y[lo:hi]))
        # the token count the loss is divided by: summed over every rank with data, or (the
        # override tokens: reduce over the data axis alone) over this context block's ranks only
        counted = tokens_of(y) if r.tokens_over is not None and r.context_axis not in r.tokens_over \
            else tokens_of(y_all)
        norm = loss_normaliser(r, counted, tokens_of(y[lo:hi]))
        counter = CollectiveCounter()
        saved = SavedActivations()
        total = 0.0
        with counter, (loss_parallel() if trainer.loss_parallel else nullcontext()):
            for k in range(m):
                a, b = lo + k * mb, lo + (k + 1) * mb
                if dropout is not None:
                    dropout.step, dropout.row0 = step, a
                # gradient accumulation: DDP synchronises on the last microbatch only (on every one
                # under override grads: reduce_every_microbatch, and before every update under
                # override optimizer: step_every_microbatch)
                sync = nullcontext() if k == m - 1 or trainer.no_sync is None or r.sync_every_microbatch \
                    or r.step_every_microbatch else trainer.no_sync()
                with sync:
                    counter.phase = "forward"
                    with saved.recording(trainer.inner) if k == 0 else nullcontext():
                        # per_microbatch_mean: each microbatch's own token mean, over the m microbatches
                        mb_norm = tokens_of(y[a:b]) * m if r.loss == "per_microbatch_mean" else norm
                        loss = _loss_sum(trainer.module(x[a:b].to(device)), y[a:b].to(device)) / mb_norm
                    counter.phase = "backward"
                    loss.backward()
                if trainer.after_microbatch is not None:
                    trainer.after_microbatch()
                if r.step_every_microbatch:
                    counter.phase = "optimizer"
                    after_microstep(r, trainer.optimizer, k, m)
                total = total + local(loss.detach())
            if trainer.after_backward is not None:
                trainer.after_backward()
            if trainer.clip is not None:
                counter.phase = "clip"
                trainer.clip()
            if step == 0:
                grads0 = trainer.copy_gradients()
            counter.phase = "optimizer"
            trainer.optimizer.step()
        counter.check()
        steps.append([asdict(c) for c in counter.records])
        if step == 0 and grads0 is not None:
            grads0 = trainer.whole_gradients(grads0)  # collectives, after the counted step
        # the reported loss: the ranks' losses averaged (the global token mean when the
        # plan's loss is right); tensor-parallel ranks hold the same loss
        mean = total.clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / r.world)
        if step == job.steps - 1:
            params = [p for _, p in trainer.named]
            state = trainer.optimizer_state()
            held = held_bytes(params, state, trainer.held_gradients() if trainer.held_gradients else None)
            replicated = _unsharded_on(trainer, r.tensor_axis)
            activations = saved.bytes()
        clear_after_step(r, trainer.optimizer)
    # equivalence: full parameters against the single-process run
    ref, ref_losses, ref_grads = _reference(job, global_batch)
    grad_diff = gradient_difference(grads0, ref_grads, "no step ran")
    worst_abs, worst_rel, worst_name, fingerprint, count = _against_reference(trainer, ref)
    loss_abs = max(abs(a - b) for a, b in zip(losses, ref_losses))
    loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref_losses))
    return {
        "key": job.key,
        "rank": rank,
        "coords": coords,
        "collectives": steps,
        "held": {k: {"storage": v[0], "elements": v[1]} for k, v in held.items()},
        "tensor_replicated_param_bytes": replicated,
        "saved_activations": activations,
        "param_count": count,
        "param_tensors": len(trainer.named),
        "optimizer_param_tensors": sum(len(g["params"]) for g in trainer.optimizer.param_groups),
        "fingerprint": fingerprint,
        "losses": losses,
        "tokens": tokens,
        "reference_losses": ref_losses,
        "param_abs_diff": worst_abs,
        "param_rel_diff": worst_rel,
        "param_worst": worst_name,
        "loss_abs_diff": loss_abs,
        "loss_rel_diff": loss_rel,
        **grad_diff,
    }


def _against_reference(trainer, ref: dict) -> tuple[float, float, str, float, int]:
    """The full parameters against the single-process run's: the largest elementwise difference (absolute,
    relative to the model's largest parameter magnitude) and where, the sum of squares and the element count."""
    worst_abs, worst_name, scale = 0.0, "", 0.0
    fingerprint, count = 0.0, 0
    for name, p in trainer.named:
        full = trainer.full(name, p)
        got, want = full.detach().cpu().float(), ref[name].float()
        scale = max(scale, want.abs().max().item())
        diff = (got - want).abs().max().item()
        if diff > worst_abs or not worst_name:
            worst_abs, worst_name = diff, name
        fingerprint += full.detach().double().pow(2).sum().item()
        count += full.numel()
    return worst_abs, worst_abs / max(scale, 1e-30), worst_name, fingerprint, count


def run_jobs(jobs: list[Job], rank: int, device, write: Callable[[Job, dict], None]) -> None:
    """Run every job as ``rank`` on ``device`` (the process group initialised), handing each result
    (or the error of a job that failed on this rank) to ``write``; the allocator's peak is reset
    before each job and read after it (CUDA)."""
    import torch
    import torch.distributed as dist

    for job in jobs:
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            result = run_job(job, rank, device)
            result["allocator_peak"] = allocator_peak(device)
        except Exception as exc:  # reported per job: one failing realisation must not hide the others
            root = exc
            while root.__cause__ is not None:
                root = root.__cause__
            where = traceback.extract_tb(root.__traceback__)[-1]
            text = f"{type(exc).__name__}: {exc}"
            if root is not exc:
                text += f" caused by {type(root).__name__}: {root}"
            result = {"key": job.key, "rank": rank, "error": f"{text} ({Path(where.filename).name}:{where.lineno})"}
        write(job, result)
        # free this job's DDP reducers, FSDP states and stage modules now, while the process
        # group is alive (left to interpreter teardown, a reducer destroyed after the group
        # aborts the process)
        gc.collect()
        dist.barrier()


def main(rank: int, world: int, port: int, jobs: list[Job], outdir: str) -> None:
    """Run every job as ``rank`` of the local launcher, writing ``<outdir>/<key>.<rank>.json``."""
    warnings.filterwarnings("ignore")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = _device(local_env(rank, world, port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_of(device), rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        run_jobs(jobs, rank, device, lambda job, result: Path(outdir, f"{job.key}.{rank}.json").write_text(
            json.dumps(result)))
    except BaseException:
        dist.destroy_process_group()
        raise
    finish(outdir, rank)


def allocator_peak(device) -> int | None:
    """The most bytes the device's caching allocator had allocated during the job (reset before
    each job); None on CPU, where PyTorch keeps no allocator statistics: never reported as 0."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


if __name__ == "__main__":
    import pickle
    import sys

    _outdir, _rank, _world, _port = sys.argv[1:5]
    _jobs = pickle.loads(Path(_outdir, "jobs.pkl").read_bytes())  # written by runner.launch
    main(int(_rank), int(_world), int(_port), _jobs, _outdir)
