"""One rank of a measurement run (torch).

Input: a ``Job`` (realisation, tiny shape, steps, seed), this process's rank and the
rendezvous port. Output: a JSON file per rank and job holding what was measured: the
collectives of every step (from ``CollectiveCounter``), the bytes of parameters,
gradients and optimizer state this rank holds after the last step (local storage,
shared storage counted once), the losses, and the largest difference from the same
steps run on one process (which each rank computes itself, from the same seed and data).
"""

from __future__ import annotations

import json
import os
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from .realise import Realisation
from .shape import TinyShape


TIMEOUT_S = int(os.environ.get("PLACEMENT_MEASURE_TIMEOUT", "120"))  # a collective that waits longer than this fails the job


@dataclass(frozen=True)
class Job:
    key: str
    realisation: Realisation
    shape: TinyShape
    steps: int
    seed: int = 0


IGNORE = -100  # target of a padding position: no loss, no gradient


def _batch(shape: TinyShape, global_batch: int, seed: int, step: int):
    """Token ids and targets of one step's global batch: variable-length sequences.

    Sequence i has ``n_i`` valid targets (1 <= n_i <= seq, drawn from the seeded
    generator); the positions after them are padding (target ``IGNORE``). Causal
    attention keeps padding from reaching valid positions, so only the number of valid
    tokens differs between sequences, and between the ranks that hold them.
    """
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + step + 1)
    tokens = torch.randint(0, shape.vocab, (global_batch, shape.seq + 1), generator=g)
    valid = torch.randint(1, shape.seq + 1, (global_batch, 1), generator=g)
    targets = tokens[:, 1:].clone()
    targets[torch.arange(shape.seq).expand(global_batch, -1) >= valid] = IGNORE
    return tokens[:, :-1], targets


def _loss_sum(logits, targets):
    """Sum of the token losses over the valid (unpadded) targets."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def tokens_of(targets) -> int:
    return int((targets != IGNORE).sum())


def loss_normaliser(r: Realisation, global_tokens: int, local_tokens: int) -> float:
    """What a rank divides its token-loss sum by, as the plan's loss convention says.

    global_mean: the global token count over the data-parallel size (the count is summed
    over the ranks with the data, before the step, as a data loader does), so that the
    gradient all-reduce's mean is the global token mean; per_device_mean: the rank's own
    token count, a mean of per-device means once the gradients are averaged.
    """
    if r.loss == "per_device_mean":
        return float(local_tokens)
    return global_tokens / r.data_size


def held_bytes(params, optimizer_state) -> dict:
    """Bytes held per state: parameters, their gradients, optimizer moments and step counters."""
    import torch

    moments, counters = [], []
    for per_param in optimizer_state.values():
        for key, t in per_param.items():
            if isinstance(t, torch.Tensor):
                (counters if key == "step" else moments).append(t)
    return {
        "params": _storage_bytes(params),
        "grads": _storage_bytes(p.grad for p in params),
        "optimizer": _storage_bytes(moments),
        "optimizer_step_counters": _storage_bytes(counters),
    }


def _storage_bytes(tensors) -> tuple[int, int]:
    """(bytes of the distinct storages behind ``tensors``, bytes of the elements themselves)."""
    from .torch_plan import local

    seen: dict[int, int] = {}
    elements = 0
    for t in tensors:
        if t is None:
            continue
        t = local(t)
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        elements += t.numel() * t.element_size()
    return sum(seen.values()), elements


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


def _reference(job: Job, global_batch: int):
    """The same steps on one process: final parameters by name and the losses."""
    from . import model as tiny
    from .torch_plan import MAX_NORM, clip_global, make_optimizer

    m = tiny.build(job.shape, job.seed)
    opt = make_optimizer(job.realisation.optimizer, m.parameters())
    losses = []
    for step in range(job.steps):
        x, y = _batch(job.shape, global_batch, job.seed, step)
        loss = _loss_sum(m(x), y) / tokens_of(y)  # the global token mean
        loss.backward()
        if job.realisation.clip is not None:
            clip_global(list(m.parameters()), MAX_NORM)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in m.named_parameters()}, losses


def _device(rank: int):
    """CUDA when every rank has a GPU (NCCL), else the CPU (gloo)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > rank:
        return torch.device("cuda", rank)
    return torch.device("cpu")


def run_job(job: Job, rank: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from . import model as tiny
    from .counter import CollectiveCounter
    from .torch_plan import apply

    r = job.realisation
    names = tuple(a for a, _ in r.mesh)
    device = _device(rank)
    mesh = init_device_mesh(device.type, tuple(s for _, s in r.mesh), mesh_dim_names=names)
    coords = dict(zip(names, mesh.get_coordinate()))
    if r.pipeline_axis is not None:
        from .pipeline import run_pipeline_job

        return {"rank": rank, **run_pipeline_job(job, mesh, device, coords)}
    dp = 1
    dp_index = 0
    for a in r.data_axes:
        dp_index = dp_index * r.sizes[a] + coords[a]
        dp *= r.sizes[a]
    global_batch = job.shape.microbatch * dp
    trainer = apply(r, tiny.build(job.shape, job.seed).to(device), mesh)
    steps, losses, tokens = [], [], []
    for step in range(job.steps):
        x, y = _batch(job.shape, global_batch, job.seed, step)
        lo, hi = dp_index * job.shape.microbatch, (dp_index + 1) * job.shape.microbatch
        tokens.append(tokens_of(y[lo:hi]))
        norm = loss_normaliser(r, tokens_of(y), tokens_of(y[lo:hi]))
        counter = CollectiveCounter()
        with counter:
            counter.phase = "forward"
            loss = _loss_sum(trainer.module(x[lo:hi].to(device)), y[lo:hi].to(device)) / norm
            counter.phase = "backward"
            loss.backward()
            if trainer.after_backward is not None:
                trainer.after_backward()
            if trainer.clip is not None:
                counter.phase = "clip"
                trainer.clip()
            counter.phase = "optimizer"
            trainer.optimizer.step()
        steps.append([asdict(c) for c in counter.records])
        # the reported loss: the ranks' losses averaged (the global token mean when the
        # plan's loss is right); tensor-parallel ranks hold the same loss
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / r.world)
        if step == job.steps - 1:
            params = [p for _, p in trainer.named]
            state = trainer.optimizer_state()
            held = held_bytes(params, state)
            replicated = _unsharded_on(trainer, r.tensor_axis)
        trainer.optimizer.zero_grad()
    # equivalence: full parameters against the single-process run
    ref, ref_losses = _reference(job, global_batch)
    # largest elementwise difference, relative to the largest parameter magnitude of the model
    worst_abs, worst_name, scale = 0.0, "", 0.0
    for name, p in trainer.named:
        full = trainer.full(name, p).detach().cpu()
        want = ref[name]
        scale = max(scale, want.abs().max().item())
        diff = (full - want).abs().max().item()
        if diff > worst_abs or not worst_name:
            worst_abs, worst_name = diff, name
    worst_rel = worst_abs / max(scale, 1e-30)
    fingerprint = 0.0
    count = 0
    for name, p in trainer.named:
        full = trainer.full(name, p)
        fingerprint += full.detach().double().pow(2).sum().item()
        count += full.numel()
    loss_abs = max(abs(a - b) for a, b in zip(losses, ref_losses))
    loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref_losses))
    return {
        "key": job.key,
        "rank": rank,
        "coords": coords,
        "collectives": steps,
        "held": {k: {"storage": v[0], "elements": v[1]} for k, v in held.items()},
        "tensor_replicated_param_bytes": replicated,
        "param_count": count,
        "param_tensors": len(trainer.named),
        "fingerprint": fingerprint,
        "losses": losses,
        "tokens": tokens,
        "reference_losses": ref_losses,
        "param_abs_diff": worst_abs,
        "param_rel_diff": worst_rel,
        "param_worst": worst_name,
        "loss_abs_diff": loss_abs,
        "loss_rel_diff": loss_rel,
    }


def main(rank: int, world: int, port: int, jobs: list[Job], outdir: str) -> None:
    """Run every job as ``rank``, writing ``<outdir>/<key>.<rank>.json``."""
    warnings.filterwarnings("ignore")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from datetime import timedelta

    torch.set_num_threads(1)
    device = _device(rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        for job in jobs:
            try:
                result = run_job(job, rank)
            except Exception as exc:  # reported per job: one failing realisation must not hide the others
                root = exc
                while root.__cause__ is not None:
                    root = root.__cause__
                where = traceback.extract_tb(root.__traceback__)[-1]
                text = f"{type(exc).__name__}: {exc}"
                if root is not exc:
                    text += f" caused by {type(root).__name__}: {root}"
                result = {"key": job.key, "rank": rank, "error": f"{text} ({Path(where.filename).name}:{where.lineno})"}
            Path(outdir, f"{job.key}.{rank}.json").write_text(json.dumps(result))
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import pickle
    import sys

    _outdir, _rank, _world, _port = sys.argv[1:5]
    _jobs = pickle.loads(Path(_outdir, "jobs.pkl").read_bytes())  # written by runner.launch
    main(int(_rank), int(_world), int(_port), _jobs, _outdir)
