"""One rank of a pipeline-parallel measurement run (torch).

Input: a ``Job`` whose realisation has a pipeline axis, this rank's ``DeviceMesh``
coordinates. Output: the same per-rank result dict as ``worker.run_job`` (collectives,
held bytes, losses, difference from one process).

The model is split with ``torch.distributed.pipelining``: every stage is the tiny
transformer with the other stages' parts removed (so parameter names stay those of the
whole model), a ``PipelineStage`` per model chunk (virtual stages rank, rank + p, ... for
an interleaved schedule), run by ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B
over the pipeline axis's process group. A data axis wraps each stage module in
``replicate`` (torch's FSDP2-based DDP, ``torch.distributed._composable.replicate_with_fsdp``,
which the schedule drives itself: gradients accumulate over the microbatches and are
all-reduced once, after the last backward). The schedule splits the rank's batch
into ``shape.microbatches`` microbatches and divides the gradients by their number, so
the per-microbatch loss is the token-loss sum times the microbatch count over the
plan's normaliser (``worker.loss_normaliser``). Every point-to-point buffer is tagged
with its phase (forward activations, backward activation gradients) as the stage
creates its send and receive operations.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import model as tiny
from .common import MAX_NORM, local, make_optimizer
from .counter import CollectiveCounter
from .flat_zero import FlatZero
from .pipeline_schedules import ZeroParts, _then, unit_lowering, zeropp_schedule  # noqa: F401
from .tensor_parallel import tensor_parallel

_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


def stage_model(shape, seed: int, stage: int, stages: int, recompute: str = "none") -> nn.Module:
    """The tiny transformer keeping only virtual stage ``stage`` of ``stages``."""
    m = tiny.build(shape, seed, recompute)
    per = shape.layers // stages
    keep = range(stage * per, (stage + 1) * per)
    m.blocks = nn.ModuleDict({str(i): m.blocks[i] for i in keep})
    if stage == stages - 1 and stage != 0 and m.head is None:
        # tied embeddings across stages (Megatron-LM): the last stage holds its own copy of the
        # word embedding as the output layer; the two copies' gradients are summed after backward
        m.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        with torch.no_grad():
            m.head.weight.copy_(m.embed.weight)
    if stage != 0:
        m.embed = None
    if stage != stages - 1:
        m.norm = None
        m.head = None
    return m


def embedding_groups(mesh, r) -> object | None:
    """The process group of this rank's first and last pipeline stage (Megatron's embedding group):
    one group per line of the other axes, created by every rank in the same order."""
    import itertools

    names = [a for a, _ in r.mesh]
    sizes = [n for _, n in r.mesh]
    k = names.index(r.pipeline_axis)
    mine = None
    me = dist.get_rank()
    others = [range(n) if i != k else (None,) for i, n in enumerate(sizes)]
    for combo in itertools.product(*others):
        ranks = []
        for stage in (0, sizes[k] - 1):
            coords = list(combo)
            coords[k] = stage
            rank = 0
            for c, n in zip(coords, sizes):
                rank = rank * n + c
            ranks.append(rank)
        group = dist.new_group(ranks)
        if me in ranks:
            mine = group
    return mine


class _Tagger:
    """Tags the buffers of a stage's send and receive operations with their phase."""

    def __init__(self) -> None:
        self.counter: CollectiveCounter | None = None

    def wrap(self, stage) -> None:
        for name, phase in (("get_fwd_send_ops", "forward"), ("get_fwd_recv_ops", "forward"),
                            ("get_bwd_send_ops", "backward"), ("get_bwd_recv_ops", "backward")):
            original = getattr(stage, name)

            def tagged(chunk_id, original=original, phase=phase):
                ops = original(chunk_id)
                if self.counter is not None:
                    for op in ops:
                        self.counter.tags[op.tensor.data_ptr()] = phase
                return ops

            setattr(stage, name, tagged)


def pipeline_clip(r, named, mesh, max_norm: float, tied: bool):
    """Gradient clipping over pipeline stages (Megatron-LM's): each rank's sum of squares of its
    gradients — a parameter whole on the tensor axis counted once over it, the last stage's copy
    of a tied embedding left out (``r.clip_double_count``: the bug that counts it too) — summed
    by one fp32 all-reduce over the stages and the tensor axis (``r.clip`` stage: over the
    tensor axis alone, each stage clipping by its own norm), then every gradient scaled by
    min(1, max_norm / (norm + 1e-6)) as ``clip_grad_norm_``."""
    t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    axes = tuple(a for a, _ in r.mesh if a == r.tensor_axis or (a == r.pipeline_axis and r.clip == "global"))
    group = mesh[axes[0]].get_group() if len(axes) == 1 else mesh[axes]._flatten().get_group()

    def sharded_on_tensor(g) -> bool:
        mesh_ = getattr(g, "device_mesh", None)
        names = (mesh_.mesh_dim_names or ()) if mesh_ is not None else ()
        return r.tensor_axis in names and not g.placements[names.index(r.tensor_axis)].is_replicate()

    def run() -> None:
        grads = []
        total = torch.zeros((), dtype=torch.float32)
        for name, q in named:
            if q.grad is None:
                continue
            grads.append(q.grad)
            if tied and name == "head.weight" and not r.clip_double_count:
                continue
            part = local(q.grad).float().pow(2).sum()
            total = total + (part if t == 1 or sharded_on_tensor(q.grad) else part / t)
        dist.all_reduce(total, group=group)
        coef = torch.clamp(max_norm / (total.sqrt() + 1e-6), max=1.0)
        for g in grads:
            local(g).mul_(coef)

    return run


def _copy_gradients(named, zero) -> list:
    """This stage's reduced gradients, copied: the parameters' .grad, or ZeRO's flat shards."""
    if zero is None:
        return [("grad", n, q.grad.detach().clone()) for n, q in named if q.grad is not None]
    flats = zero.parts if isinstance(zero, ZeroParts) else [zero]
    return [("flat", f, f.gradient_copy()) for f in flats]


def _whole_gradients(named, copy: list) -> list:
    """(name, whole gradient) of this stage's parameters from ``_copy_gradients``'s copy: flat
    shards gathered over their group and cut per parameter, DTensor shards gathered."""
    from torch.distributed.tensor import DTensor

    names = {id(q): n for n, q in named}
    pairs = []
    for kind, a, b in copy:
        if kind == "grad":
            pairs.append((a, b))
        else:
            pairs += [(names[id(q)], DTensor.from_local(g, q.device_mesh, q.placements, run_check=False)
                       if hasattr(q, "placements") else g) for q, g in zip(a.flat_params, a.whole_local(b))]
    return [(n, g.full_tensor() if hasattr(g, "full_tensor") else g) for n, g in pairs]


def _build_stages(job, mesh, device, pp_rank: int):
    """This rank's model chunks (virtual stages rank, rank + p, ...), each tensor-parallel and
    wrapped for its data axis as the realisation says, and their ``PipelineStage``s, tagged."""
    from torch.distributed.pipelining import PipelineStage

    r, shape = job.realisation, job.shape
    p, v = r.stages, r.chunks
    pp_group = mesh[r.pipeline_axis].get_group()
    inner, stages = [], []
    tagger = _Tagger()
    vocab_parallel = False
    for c in range(v):
        index = pp_rank + c * p
        sub = stage_model(shape, job.seed, index, p * v, r.recompute).to(device)
        if r.tensor_axis is not None:
            vocab_parallel = tensor_parallel(sub, mesh[r.tensor_axis], r.sequence_parallel,
                                             shape.tied_embeddings) or vocab_parallel
        inner.append(sub)
        if r.data == "ddp":
            from torch.distributed._composable.replicate_with_fsdp import replicate

            replicate(sub, mesh=mesh[r.data_axes[0]])
        elif r.data == "zeropp":
            from torch.distributed.fsdp import fully_shard

            # one FSDP unit per model chunk; the schedule gathers and frees it per scheduling unit
            fully_shard(sub, mesh=mesh[r.data_axes[0]], reshard_after_forward=False)
        stage = PipelineStage(sub, index, p * v, device, group=pp_group)
        tagger.wrap(stage)
        stages.append(stage)
    return inner, stages, tagger, vocab_parallel


def _optimizer(r, mesh, params: list, tied: list):
    """(zero, optimizer, outer_sync, tied_zero): how this rank's stage parameters are reduced
    over the data axes and stepped."""
    zero, outer_sync, tied_zero = None, None, None
    if r.data == "zero2":
        # ZeRO-2: no whole gradient to accumulate in, every microbatch's gradients reduce-scattered
        # into the shard. A tied embedding (first stage) and its copy (last stage) get a flat buffer
        # of their own, laid out alike on both, so that their reduced shards can be summed
        group, divide = mesh[r.data_axes[0]].get_group(), float(r.grad_divide or r.data_size)
        tied_ids = {id(q) for q in tied}
        parts = []
        if tied:
            tied_zero = FlatZero(tied, group, 2, r.optimizer, divide, r.regather)
            parts.append(tied_zero)
        parts.append(FlatZero([q for q in params if id(q) not in tied_ids], group, 2, r.optimizer, divide,
                              r.regather))
        zero = opt = ZeroParts(parts)
    elif r.data == "zero1":
        # ZeRO on each stage's parameters over the data axis: the microbatches' gradients accumulate
        # in the whole gradients, then one reduce-scatter and, after the step, one all-gather
        zero = FlatZero(params, mesh[r.data_axes[0]].get_group(), 1, r.optimizer,
                        float(r.grad_divide or r.data_size), r.regather)
        opt = zero
    elif r.data == "zeropp" and r.outer == "zero1":
        # ZeRO-1 over the second data axis of the FSDP shards: their gradients reduce-scattered, the
        # updated shards all-gathered (FSDP's reduce-scatter has divided by the first axis's size)
        zero = FlatZero(params, mesh[r.data_axes[1]].get_group(), 1, r.optimizer, float(r.sizes[r.data_axes[1]]),
                        r.regather)
        opt = zero
    else:
        opt = make_optimizer(r.optimizer, params)
        if r.data == "zeropp":
            outer_group, outer_n = mesh[r.data_axes[1]].get_group(), r.sizes[r.data_axes[1]]

            def outer_sync() -> None:
                # the FSDP gradient shards, replicated on the second data axis: averaged over it
                for q in params:
                    if q.grad is not None:
                        g = local(q.grad)
                        dist.all_reduce(g, group=outer_group)
                        g.div_(outer_n)
    return zero, opt, outer_sync, tied_zero


def _schedule(r, stages: list, m: int, zero, norm_box: list):
    """The realisation's schedule over ``stages`` and whether gradients are reduced per microbatch
    (ZeRO-2): the loss function's scale follows from it."""
    from torch.distributed.pipelining import schedules

    from .training import _loss_sum

    per_microbatch = r.data == "zero2"
    scale = 1 if per_microbatch else m

    def loss_fn(out, target):
        # the schedule divides the gradients by m (not under ZeRO-2, whose whole gradients are freed
        # before): times that over the normaliser gives the plan's loss
        return _loss_sum(out, target) * scale / norm_box[0]

    if per_microbatch:
        for stage in stages:
            stage.backward_one_chunk = _then(stage.backward_one_chunk, zero.reduce_gradients)
    if r.schedule == "zeropp":
        return zeropp_schedule(stages, m, loss_fn, r.unit), scale
    cls = getattr(schedules, _SCHEDULES[r.schedule])
    return cls(stages if r.chunks > 1 else stages[0], n_microbatches=m, loss_fn=loss_fn,
               scale_grads=not per_microbatch), scale


def _train(job, mesh, device, coords: dict, parts: dict) -> dict:
    """The measured steps: each step's collectives, the reported losses, the tokens, the held
    bytes and the peak of live saved activations of the last step, the first step's whole
    gradients."""
    from contextlib import nullcontext

    from torch.distributed.tensor.parallel import loss_parallel

    from .activations import LiveSavedPeak
    from .training import _batch, held_bytes, loss_normaliser, tokens_of

    r, shape = job.realisation, job.shape
    p, m = r.stages, shape.microbatches
    pp_rank = coords[r.pipeline_axis]
    dp_index = 0
    for a in r.data_axes:
        dp_index = dp_index * r.sizes[a] + coords[a]
    tp = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    named, zero, opt, schedule, tagger = parts["named"], parts["zero"], parts["opt"], parts["schedule"], parts["tagger"]
    tied, tied_zero, tie_group, clip = parts["tied"], parts["tied_zero"], parts["tie_group"], parts["clip"]
    norm_box, scale, per_microbatch = parts["norm_box"], parts["scale"], r.data == "zero2"
    first, last = pp_rank == 0, pp_rank == p - 1
    dp = r.data_size
    rows = shape.microbatch * m
    global_batch = rows * dp
    steps, losses, tokens = [], [], []
    held: dict = {}
    saved_peak = 0
    grads0, whole0 = None, None
    for step in range(job.steps):
        x, y = _batch(shape, global_batch, job.seed, step)
        lo, hi = dp_index * rows, (dp_index + 1) * rows
        norm_box[0] = loss_normaliser(r, tokens_of(y), tokens_of(y[lo:hi]))
        tokens.append(tokens_of(y[lo:hi]))
        counter = CollectiveCounter()
        tagger.counter = counter
        mb_losses: list = []
        peak = LiveSavedPeak()
        recording = peak.recording(parts["inner"]) if step == job.steps - 1 and job.steps > 1 else nullcontext()
        with counter, (loss_parallel() if parts["vocab_parallel"] else nullcontext()):
            counter.phase = "schedule"
            args = (x[lo:hi].to(device),) if first else ()
            kwargs = {"target": y[lo:hi].to(device), "losses": mb_losses} if last else {}
            with recording:  # the last step's schedule: every microbatch the stage keeps in flight
                schedule.step(*args, **kwargs)
            if tie_group is not None and r.tie_reduce:
                counter.phase = "backward"
                if tied_zero is not None:  # ZeRO-2: the two copies' reduced shards summed
                    dist.all_reduce(tied_zero.shard_grad, group=tie_group)
                for q in tied if tied_zero is None else ():
                    # the first stage's embedding and the last stage's copy: their gradients summed
                    dist.all_reduce(local(q.grad), group=tie_group)  # replicated on the data axis: local is whole
            if clip is not None:
                counter.phase = "clip"
                clip()
            if parts["outer_sync"] is not None:
                counter.phase = "backward"
                parts["outer_sync"]()
            if zero is not None and not per_microbatch:
                counter.phase = "backward"
                zero.reduce_gradients()
            if step == 0:  # this stage's gradients as the optimizer receives them: copied, no collective
                grads0 = _copy_gradients(named, zero)
            counter.phase = "optimizer"
            opt.step()
        tagger.counter = None
        counter.check()
        steps.append([rec.__dict__ for rec in counter.records])
        if step == 0:  # made whole: collectives, after the counted step
            whole0 = {}
            for n, g in _whole_gradients(named, grads0):
                # the last stage's copy of a tied embedding: one process's gradient of the embedding
                key = "embed.weight" if shape.tied_embeddings and n == "head.weight" else n
                whole0.setdefault(key, g.detach().cpu().float())
        loss = torch.stack([local(t.detach()) for t in mb_losses]).mean() * (m / scale) if last else torch.zeros(())
        dist.all_reduce(loss)  # only the last stage's ranks (one per data-parallel and tensor rank) hold a loss
        losses.append(loss.item() / (dp * tp))
        if step == job.steps - 1:
            held = held_bytes(parts["params"], opt.state, zero.held_gradients() if zero is not None else None)
            saved_peak = peak.peak if job.steps > 1 else None
        opt.zero_grad()
    return {"collectives": steps, "losses": losses, "tokens": tokens, "held": held, "whole0": whole0,
            "saved_peak": saved_peak, "global_batch": global_batch}


def _equivalence(job, named, pp_group, trained: dict) -> dict:
    """The run against one process: parameters, losses and first-step gradients; the whole
    model's parameter count and fingerprint (this stage's part summed over the pipeline axis)."""
    from .training import _reference, gradient_difference

    shape = job.shape
    losses = trained["losses"]
    ref, ref_losses, ref_grads = _reference(job, trained["global_batch"])
    grad_diff = gradient_difference(trained["whole0"], ref_grads, "no step ran", partial=True)
    worst_abs, worst_name, scale = 0.0, "", max(t.abs().max().item() for t in ref.values())
    whole = [(name, q.full_tensor() if hasattr(q, "full_tensor") else q) for name, q in named]  # TP shards gathered
    for name, q in whole:
        want = ref["embed.weight"] if name == "head.weight" and shape.tied_embeddings else ref[name]
        diff = (q.detach().cpu() - want).abs().max().item()
        if diff > worst_abs or not worst_name:
            worst_abs, worst_name = diff, name
    # whole-model quantities: this stage's part summed over the pipeline axis
    # (the last stage's copy of a tied embedding is not a parameter of the model: counted once)
    once = [(n, q) for n, q in whole if not (shape.tied_embeddings and n == "head.weight")]
    totals = torch.tensor([sum(q.detach().double().pow(2).sum().item() for _, q in once),
                           float(sum(q.numel() for _, q in once))], dtype=torch.float64)
    dist.all_reduce(totals, group=pp_group)
    return {
        "param_count": int(totals[1].item()),
        "fingerprint": totals[0].item(),
        "reference_losses": ref_losses,
        "param_abs_diff": worst_abs,
        "param_rel_diff": worst_abs / max(scale, 1e-30),
        "param_worst": worst_name,
        "loss_abs_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
        "loss_rel_diff": max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref_losses)),
        **grad_diff,
    }


def run_pipeline_job(job, mesh, device, coords: dict) -> dict:
    """Build the stages (``_build_stages``), the optimizer (``_optimizer``) and the schedule
    (``_schedule``), train (``_train``), compare with one process (``_equivalence``)."""
    r, shape = job.realisation, job.shape
    p = r.stages
    pp_rank = coords[r.pipeline_axis]
    pp_group = mesh[r.pipeline_axis].get_group()
    inner, stages, tagger, vocab_parallel = _build_stages(job, mesh, device, pp_rank)
    named = [(n, q) for sub in inner for n, q in sub.named_parameters()]
    params = [q for _, q in named]
    tied = [q for sub in inner for q in ((sub.embed.weight,) if sub.embed is not None else ())
            + ((sub.head.weight,) if sub.head is not None else ())] if shape.tied_embeddings and p > 1 else []
    tie_group = embedding_groups(mesh, r) if shape.tied_embeddings and p > 1 else None
    zero, opt, outer_sync, tied_zero = _optimizer(r, mesh, params, tied)
    norm_box = [1.0]
    clip = pipeline_clip(r, named, mesh, MAX_NORM, shape.tied_embeddings and p > 1) if r.clip else None
    schedule, scale = _schedule(r, stages, shape.microbatches, zero, norm_box)
    parts = {"inner": inner, "named": named, "params": params, "tied": tied, "tie_group": tie_group, "zero": zero,
             "opt": opt, "outer_sync": outer_sync, "tied_zero": tied_zero, "clip": clip, "schedule": schedule,
             "scale": scale, "norm_box": norm_box, "tagger": tagger, "vocab_parallel": vocab_parallel}
    trained = _train(job, mesh, device, coords, parts)
    held = trained["held"]
    return {
        "key": job.key,
        "coords": coords,
        "collectives": trained["collectives"],
        "held": {k: {"storage": a, "elements": b} for k, (a, b) in held.items()},
        "tensor_replicated_param_bytes": 0,
        "param_tensors": len(named),
        "optimizer_param_tensors": sum(len(g["params"]) for g in opt.param_groups),
        "losses": trained["losses"],
        "tokens": trained["tokens"],
        # the peak of the saved storages alive at once over the last step's schedule (``LiveSavedPeak``)
        "saved_activation_peak": trained["saved_peak"],
        **_equivalence(job, named, pp_group, trained),
    }
