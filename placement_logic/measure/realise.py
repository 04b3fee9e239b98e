"""Decide how PyTorch realises a plan, or say plainly why it cannot.

Input: an ``ir.Plan`` and the mesh axis sizes of the run. Output: a ``Realisation``
(which PyTorch implementation runs each axis, which overrides are reproduced and how
faithfully) or an ``Unrealised`` with the reasons. Pure data; knows nothing of torch.

Realised today, per axis role:
  data (one axis): (R,R,R) -> DistributedDataParallel; (R,S,R) -> ZeRO-1 and
    (R,S,S) -> ZeRO-2 (the harness's ``FlatZero``: whole parameters, a flat optimizer
    shard, gradients reduce-scattered into it, updated shards all-gathered after the
    step; ZeRO-2 frees the whole gradients once reduced); (S*,S,S) -> fully_shard with
    the plan's reshard_after_forward.
  data (two axes, R then S*/S/S): FSDP2 HYBRID_SHARD over a 2-D DeviceMesh.
  tensor: DTensor tensor parallelism (ColwiseParallel / RowwiseParallel) on the blocks,
    the vocabulary-parallel embedding and head of Megatron-LM (RowwiseParallel on the
    embedding, ColwiseParallel on the head with ``loss_parallel``), with sequence
    parallelism (SequenceParallel on the norms) when the plan asks for it.
  pipeline (schedule gpipe, 1f1b, interleaved): ``torch.distributed.pipelining`` stages
    (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B), with DDP or DDP +
    data-parallel replication (``replicate``, FSDP2-based DDP) or nothing on one data axis.
Recomputation: full -> every block under ``torch.utils.checkpoint`` (its forward, with its
  tensor-parallel collectives, runs again in backward); selective -> the attention core
  (softmax(q·kᵀ)·v, no collectives) under ``checkpoint``, as Megatron-LM's selective recompute.
Overrides reproduced: grads reduce over () (no gradient all-reduce) or over the data axis
twice (a second all-reduce by hand after DDP's), grads divide by X with loss global_mean
or per_device_mean (the reduced sum divided by the matching factor), clip_norm reduce
over () (clip coefficient from the local shard's norm, FSDP or tensor parallel),
clip_norm reduce over (the axes the gradients are sharded on, and replicated data axes with
the duplicate filter stated: clip_norm dedupe over them) (correct global clipping) and params
no_regather (ZeRO's step without its parameter all-gather), grads no_zero_grad (DDP's
buffers not cleared after the step), optimizer step_every_microbatch (DDP synchronising and
stepping after every microbatch, every group or the named groups' own optimizer) and grads reduce_accumulated_every_microbatch (ZeRO's whole
buffer kept and reduce-scattered into the shard's gradient after every microbatch).
The decisions are made by the named passes of ``realise_passes`` (offload, schedule,
axes, data strategy, tensor, pipeline, context, experts, overrides and their constraints,
groups, model, widths), each over one ``Draft``; ``realise`` runs them in order.
Byte widths (``realised_widths``): as the spec's ``bytes`` section states them — parameters
and gradients in bfloat16 (2) or fp32 (4), optimizer = 12 as an fp32 master copy and Adam's
moments — on data axes; fp32 when the spec states none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping

from .. import ir
from .realise_passes import PASSES, Draft
from .widths import Widths


@dataclass(frozen=True)
class Realisation:
    plan: str
    mesh: tuple[tuple[str, int], ...]  # (axis, size) in mesh order
    implementation: str  # what PyTorch runs, in words
    data: str | None = None  # ddp | zero1 | zero2 | fsdp | hsdp
    data_axes: tuple[str, ...] = ()
    reshard_after_forward: bool = True
    tensor_axis: str | None = None
    sequence_parallel: bool = False
    grad_reduce: str = "mean"  # mean | none (no reduction at all) | twice (reduced again by hand)
    grad_divide: Fraction = Fraction(0)  # the reduced gradient sum is divided by this (0: the data-parallel size)
    sync_every_microbatch: bool = False  # DDP without no_sync: the buckets all-reduced after every backward
    carry_gradients: bool = False  # grads: no_zero_grad, the buffers not cleared after the step (DDP)
    step_every_microbatch: bool = False  # optimizer.step() and zero_grad() after every microbatch's backward (DDP)
    stepped_groups: tuple[str, ...] = ()  # the groups stepped after every microbatch (none named: every one)
    # ZeRO: the whole buffer reduce-scattered after every microbatch into the shard's gradient, and not cleared
    reduce_accumulated: bool = False
    clip: str | None = None  # global | local | stage (under a pipeline: the norm of each stage's own gradients)
    clip_double_count: bool = False  # the tied embedding's two copies (first and last stage) both in the norm
    optimizer: str = "adam"  # adam | sgd_momentum | sgd
    # global_mean | per_device_mean | per_microbatch_mean: what each rank's loss is normalised by
    loss: str = "global_mean"
    regather: bool = True  # ZeRO-1 broadcasts the updated parameters after the step
    pipeline_axis: str | None = None
    schedule: str | None = None  # gpipe | 1f1b | interleaved
    chunks: int = 1  # model chunks per pipeline stage (interleaved, zeropp: v)
    unit: int = 1  # zeropp: microbatches per scheduling unit (U)
    outer: str | None = None  # zeropp: the second data axis, ddp (replicated) or zero1 (optimizer sharded)
    recompute: str = "none"  # none | selective (the attention core) | full (every block), torch.utils.checkpoint
    # parameter groups (norms, biases: the whole copies on the tensor axis) whose gradients the plan
    # reduces otherwise than tensor parallelism does: under sequence parallelism not over the tensor
    # axis (their partial sums kept), without it over the tensor axis as well (summed again)
    tensor_unreduced: tuple[str, ...] = ()
    tensor_reduced_again: tuple[str, ...] = ()
    # context parallelism: the sequence split over this axis (ring attention), gradients reduced over it too
    context_axis: str | None = None
    # expert parallelism: each rank holds E/ep whole experts, tokens routed to them by all-to-all;
    # the other parameters replicated over the axis, their gradients averaged over it by hand
    expert_axis: str | None = None
    expert_divide: Fraction = Fraction(0)  # the experts' reduced gradient sum is divided by this (0: data × expert size)
    tokens_over: tuple[str, ...] | None = None  # the axes the token count is summed over (None: all the data's)
    # hidden dropout with masks fixed by position in the global batch: "" none, "vary" (the tensor
    # ranks' seeds apart in a replicated region), "same" (one seed for every sequence-parallel slice)
    dropout: str = ""
    tie_reduce: bool = True  # tied embeddings across stages: the two copies' gradients summed (False: the bug that skips it)
    # byte widths that run: parameters and gradients in torch.bfloat16 (2) or torch.float32 (4); the
    # optimizer holds an fp32 master copy of the parameters beside its own state when master_copy
    param_bytes: int = 4
    master_copy: bool = False
    approximations: tuple[str, ...] = ()  # where the realisation differs from the plan

    @property
    def world(self) -> int:
        n = 1
        for _, s in self.mesh:
            n *= s
        return n

    @property
    def data_size(self) -> int:
        """The ranks the global batch's tokens are divided over: the data axes and a context axis."""
        n = 1
        for a in self.data_axes + tuple(x for x in (self.context_axis, self.expert_axis) if x):
            n *= self.sizes[a]
        return n

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def stages(self) -> int:
        return self.sizes[self.pipeline_axis] if self.pipeline_axis else 1


@dataclass(frozen=True)
class Unrealised:
    plan: str
    reasons: tuple[str, ...] = field(default=())


def widths_of(r: Realisation) -> dict[str, Fraction]:
    return Widths(r.param_bytes, r.optimizer, r.master_copy).as_dict()


def realise(plan: ir.Plan, sizes: Mapping[str, int], bindings: Mapping[str, ir.Value]) -> Realisation | Unrealised:
    """How PyTorch runs ``plan`` on a mesh of ``sizes``: the passes of ``realise_passes`` in order,
    then the record of what they decided, or the reasons the plan cannot run."""
    d = Draft(plan, sizes, bindings)
    for step in PASSES:
        step(d)
    if d.reasons:
        return Unrealised(plan.name, tuple(d.reasons))
    return _record(d)


def _record(d: Draft) -> Realisation:
    plan, ov = d.plan, d.ov
    return Realisation(
        plan=plan.name,
        mesh=tuple((a, d.sizes[a]) for a in plan.mesh.names),
        implementation=" + ".join(d.impl),
        data=d.data,
        data_axes=tuple(d.data_axes),
        reshard_after_forward=d.raf,
        tensor_axis=d.tensor_axis,
        sequence_parallel=plan.sequence_parallel and d.tensor_axis is not None,
        grad_reduce=ov.grad_reduce,
        grad_divide=d.divisor,
        sync_every_microbatch=ov.every,
        carry_gradients=ov.carry,
        step_every_microbatch=ov.step_each,
        stepped_groups=tuple(ov.stepped_groups),
        reduce_accumulated=ov.reaccumulate,
        clip=ov.clip,
        clip_double_count=ov.double_count,
        optimizer=d.widths.optimizer,
        loss=ov.loss,
        regather=ov.regather,
        pipeline_axis=d.pipeline_axis,
        schedule=d.schedule,
        chunks=d.chunks,
        unit=d.unit,
        outer=d.zeropp_outer,
        recompute=plan.recompute.value,
        tensor_unreduced=tuple(ov.unreduced),
        tensor_reduced_again=tuple(ov.reduced_again),
        context_axis=d.context_axis,
        expert_axis=d.expert_axis,
        expert_divide=Fraction(0) if ov.expert_divide_by is None else
        ov.expert_divide_by * (d.n_data if ov.loss == "global_mean" else 1),
        tokens_over=ov.tokens_over,
        dropout=ov.dropout,
        tie_reduce=ov.tie_reduce,
        param_bytes=d.widths.params,
        master_copy=d.widths.master_copy,
        approximations=tuple(d.approx),
    )


PIPELINE_SCHEDULES = (ir.ScheduleKind.GPIPE, ir.ScheduleKind.ONE_F_ONE_B, ir.ScheduleKind.INTERLEAVED)
