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
no_regather (ZeRO's step without its parameter all-gather).
Byte widths (``realised_widths``): as the spec's ``bytes`` section states them — parameters
and gradients in bfloat16 (2) or fp32 (4), optimizer = 12 as an fp32 master copy and Adam's
moments — on data axes; fp32 when the spec states none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping

from .. import ir
from ..ir.overrides import OverrideTarget, OverrideVerb
from .realise_overrides import RunAxes, read_overrides
from .shape import ShapeError, value_of
from .widths import Widths, realised_widths

M = ir.Mode


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


def _modes(plan: ir.Plan, axis: str) -> tuple[M, M, M]:
    return (
        plan.placement(ir.State.PARAMS).mode(axis),
        plan.placement(ir.State.OPTIMIZER).mode(axis),
        plan.placement(ir.State.GRADS).mode(axis),
    )


def realise(plan: ir.Plan, sizes: Mapping[str, int], bindings: Mapping[str, ir.Value]) -> Realisation | Unrealised:
    reasons: list[str] = []
    approx: list[str] = []
    for p in plan.placements:
        if p.offloaded:
            reasons.append(f"{p.state.value} is offloaded to {p.residency.value}: CPU runs have no separate device memory to offload from")
    schedule, chunks, pipeline_axis, unit = None, 1, None, 1
    if plan.schedule is not None:
        kind = plan.schedule.kind
        schedule, pipeline_axis = kind.value, plan.schedule.axis
        try:
            chunks = int(value_of(plan.schedule.chunks, bindings)) \
                if kind in (ir.ScheduleKind.INTERLEAVED, ir.ScheduleKind.ZEROPP) else 1
            unit = int(value_of(plan.schedule.unit, bindings)) if kind is ir.ScheduleKind.ZEROPP else 1
        except ShapeError as exc:
            reasons.append(f"the schedule's chunk count or unit has no value: {exc}")
        if kind is ir.ScheduleKind.ZEROPP and unit != 2 * sizes[pipeline_axis]:
            # the run's step is 2p microbatches (docs/validation.md)
            reasons.append(f"the zeropp schedule is realised with one scheduling unit per step (U = 2p = "
                           f"{2 * sizes[pipeline_axis]} microbatches); this plan's U is {unit}")
    tf = plan.model.transformer
    moe = False
    if tf is not None:
        try:
            moe = value_of(tf.experts, bindings) > 1
        except ShapeError as exc:
            reasons.append(f"the model's expert count has no value: {exc}")
    data_axes, tensor_axis, context_axis, expert_axis = [], None, None, None
    for axis in plan.mesh.names:
        role = plan.role(axis)
        if role is ir.Role.DATA:
            data_axes.append(axis)
        elif role is ir.Role.CONTEXT and context_axis is None:
            context_axis = axis
        elif role is ir.Role.EXPERT and expert_axis is None:
            expert_axis = axis
        elif role in (ir.Role.TENSOR, ir.Role.SEQUENCE) and tensor_axis is None:
            tensor_axis = axis
        elif role is ir.Role.PIPELINE and axis == pipeline_axis:
            continue
        else:
            reasons.append(f"axis '{axis}' with role {role.value} is not realised by the harness")
    data, raf, zeropp_outer = None, True, None
    impl: list[str] = []
    if len(data_axes) == 1:
        modes = _modes(plan, data_axes[0])
        raf = plan.placement(ir.State.PARAMS).reshard_after_forward
        if modes == (M.R, M.R, M.R):
            data, impl = "ddp", ["DistributedDataParallel"]
        elif modes == (M.R, M.S, M.R):
            data, impl = "zero1", ["ZeRO-1 (reduce-scatter of gradients, all-gather of updated parameters)"]
        elif modes == (M.R, M.S, M.S):
            data, impl = "zero2", ["ZeRO-2 (reduce-scatter of gradients, all-gather of updated parameters)"]
        elif modes == (M.S_STAR, M.S, M.S):
            data, impl = "fsdp", [f"fully_shard(reshard_after_forward={raf})"]
        else:
            reasons.append("data-axis placement (params, optimizer, grads) = (" + ", ".join(m.value for m in modes) + ") has no PyTorch implementation")
    elif len(data_axes) == 2:
        outer, inner = _modes(plan, data_axes[0]), _modes(plan, data_axes[1])
        raf = plan.placement(ir.State.PARAMS).reshard_after_forward
        if schedule == "zeropp" and outer == (M.S_STAR, M.S, M.S) and inner in ((M.R, M.R, M.R), (M.R, M.S, M.R)) \
                and raf and plan.placement(ir.State.PARAMS).unit == "chunk":
            data, zeropp_outer = "zeropp", "ddp" if inner == (M.R, M.R, M.R) else "zero1"
            impl = [f"fully_shard per model chunk over '{data_axes[0]}' (gathered once per scheduling unit in "
                    "forward and once in backward) + "
                    + (f"its gradient shards all-reduced over '{data_axes[1]}'" if zeropp_outer == "ddp" else
                       f"ZeRO-1 of its shards over '{data_axes[1]}'")]
        elif outer == (M.R, M.R, M.R) and inner == (M.S_STAR, M.S, M.S):
            data, impl = "hsdp", [f"fully_shard(mesh=2-D (replicate, shard), reshard_after_forward={raf}) (HYBRID_SHARD)"]
        else:
            reasons.append("two data axes are realised only as HYBRID_SHARD (R on the first, S*/S/S on the second)")
    elif len(data_axes) > 2:
        reasons.append("more than two data axes are not realised")
    if tensor_axis is not None:
        modes = _modes(plan, tensor_axis)
        if modes != (M.S, M.S, M.S):
            reasons.append(f"tensor axis '{tensor_axis}' is realised only with params, optimizer, grads all S")
        if data not in (None, "fsdp", "ddp", "zero1", "zero2"):
            reasons.append("tensor parallelism is combined only with DDP, ZeRO or FSDP on one data axis")
        impl.append("DTensor " + ("Colwise/Rowwise + SequenceParallel" if plan.sequence_parallel else "ColwiseParallel/RowwiseParallel"))
        if tf is not None and tf.tied_embeddings:
            approx.append(
                "tied embeddings under tensor parallelism: the harness keeps the embedding (which is the head) "
                "whole on the tensor axis, where the plan and Megatron-LM shard it over the vocabulary")
    if pipeline_axis is not None:
        modes = _modes(plan, pipeline_axis)
        if modes != (M.S, M.S, M.S):
            reasons.append(f"pipeline axis '{pipeline_axis}' is realised only with params, optimizer, grads all S")
        if data == "ddp":
            impl[0] = "replicate (FSDP2-based DDP)"
        if schedule in PIPELINE_CLASSES:
            impl.append(f"torch.distributed.pipelining {PIPELINE_CLASSES[schedule]}"
                        + (f" ({chunks} stages per rank)" if chunks > 1 else ""))
    if context_axis is not None:
        if _modes(plan, context_axis) != (M.R, M.R, M.R):
            reasons.append(f"context axis '{context_axis}' is realised only with params, optimizer, grads all R")
        if data not in ("ddp", "fsdp") or tensor_axis is not None or pipeline_axis is not None:
            reasons.append("context parallelism is realised only with DDP or FSDP on one data axis (no tensor or "
                           "pipeline axis)")
        elif data == "ddp":
            impl[0] = f"DistributedDataParallel over ({', '.join(data_axes + [context_axis])})"
        else:
            impl[0] = (f"fully_shard(mesh=2-D ({context_axis} replicate, {data_axes[0]} shard), "
                       f"reshard_after_forward={raf}) (HYBRID_SHARD)")
        impl.append(f"ring attention over '{context_axis}' (the sequence split into contiguous blocks, keys and "
                    "values passed by send/recv)")
    if moe:
        if tf.mla or tf.dense_layers is not None or tf.moe_every is not None or tf.mtp_layers is not None:
            reasons.append("mixture-of-experts layers are realised only on every layer of a transformer without "
                           "latent attention (MLA) or multi-token prediction")
        if tensor_axis is not None or pipeline_axis is not None or (context_axis and expert_axis):
            reasons.append("mixture-of-experts layers are realised only with data, expert or context axes (no "
                           "tensor or pipeline axis, not both an expert and a context axis)")
        if expert_axis is not None and data not in ("ddp", "zero1"):
            reasons.append("expert parallelism is realised only with DDP or ZeRO-1 on one data axis")
        if expert_axis is not None:
            impl.append(f"mixture of experts: experts split over '{expert_axis}', tokens dispatched and combined by "
                        "all_to_all_single (capacity-padded), "
                        + ("the other parameters' optimizer state sharded over it too" if data == "zero1" else
                           "the other gradients all-reduced over it"))
        else:
            impl.append("mixture of experts (capacity-padded routing, every expert on every rank)")
    elif expert_axis is not None:
        reasons.append(f"expert axis '{expert_axis}' without mixture-of-experts layers is not realised")
    if expert_axis is not None and _modes(plan, expert_axis) != (M.S, M.S, M.S):
        reasons.append(f"expert axis '{expert_axis}' is realised only with the experts' params, optimizer, grads S")
    ov = read_overrides(plan, RunAxes(tuple(data_axes), tensor_axis, context_axis, expert_axis, pipeline_axis),
                        bindings, reasons)
    tokens_over, expert_divide_by, dropout = ov.tokens_over, ov.expert_divide_by, ov.dropout
    grad_reduce, clip, regather, tie_reduce, double_count = (ov.grad_reduce, ov.clip, ov.regather, ov.tie_reduce,
                                                             ov.double_count)
    unreduced, reduced_again, every, loss, divide_by = (ov.unreduced, ov.reduced_again, ov.every, ov.loss,
                                                        ov.divide_by)
    # Every rank's loss is the mean over its own tokens (all ranks hold equally many) and
    # the gradient reduction sums and then divides by ``grad_divide``. That is the plan's
    # gradient when the divisor is dp with a per-device-mean loss, or 1 with a global-mean
    # loss (the loss already divided by the global token count): grad_divide = the
    # plan's divisor × (dp for a global-mean loss).
    n_data = _product(sizes, data_axes + [a for a in (context_axis, expert_axis) if a])
    if divide_by is None:
        divisor = Fraction(n_data)
    else:
        divisor = divide_by * (n_data if loss == "global_mean" else 1)
    if divisor != n_data and data not in ("ddp", "zero1", "zero2", "fsdp", "hsdp"):
        reasons.append("a gradient divisor other than the data-parallel size needs DDP, ZeRO or FSDP")
    if clip is not None and data in ("zero1", "zero2"):
        reasons.append("gradient clipping with ZeRO-1/2 is not realised by the harness")
    if every and (data != "ddp" or pipeline_axis is not None):
        reasons.append("reducing the gradients after every microbatch is realised only with DistributedDataParallel "
                       "(no no_sync) without a pipeline")
    elif every:
        impl.append("no no_sync: the buckets all-reduced after every microbatch")
    if grad_reduce in ("none", "twice") and data != "ddp":
        reasons.append("skipping or repeating the gradient all-reduce is realised only with DistributedDataParallel")
    if clip == "local" and data not in ("fsdp", "hsdp") and tensor_axis is None:
        reasons.append("a local-shard clip norm is realised only with FSDP or tensor parallelism "
                       "(replicated gradients have no shard)")
    if not regather and data not in ("zero1", "zero2"):
        reasons.append("params no_regather is realised only with ZeRO-1 or ZeRO-2")
    if "biases" in unreduced:
        reasons.append("override grads[biases] under sequence parallelism: DTensor's RowwiseParallel adds the "
                       "row-parallel bias before the reduce-scatter into sequence shards, so its gradient comes whole "
                       "from the all-gathered output gradient on every tensor rank and is never reduced over the "
                       "tensor axis (Megatron-LM adds it to the sequence shards): the override has nothing to act on")
    if (unreduced or reduced_again) and data not in ("ddp", "zero1"):
        reasons.append("a parameter group's gradient reduction over the tensor axis is realised only with DDP or "
                       "ZeRO-1 on the data axis")
    if (unreduced or reduced_again) and pipeline_axis is not None:
        reasons.append("gradient-reduction overrides under a pipeline are not realised by the harness")
    if dropout and (pipeline_axis is not None or data not in (None, "ddp")):
        reasons.append("dropout seeds are realised only without a pipeline, with DDP or no data axis")
    if dropout:
        impl.append("hidden dropout (p = 0.1) with masks fixed by position in the global batch, seeded "
                    + ("apart on each tensor rank in the replicated region" if dropout == "vary" else
                       "alike on every sequence-parallel slice"))
    if not tie_reduce and (pipeline_axis is None or tf is None or not tf.tied_embeddings):
        reasons.append("override embedding: tie_reduce over () is realised only with tied embeddings across "
                       "pipeline stages")
    if pipeline_axis is not None:
        if schedule == "zeropp" and data != "zeropp":
            reasons.append("the zeropp schedule is realised only with its own data axes: S* (chunk units) on the "
                           "first, R or ZeRO-1 on the second")
        elif data == "zeropp" and tensor_axis is not None:
            reasons.append("the zeropp schedule is realised without a tensor axis")
        elif data == "zero2" and (chunks > 1 or tensor_axis is not None):
            reasons.append("ZeRO-2 under a pipeline is realised with one model chunk per rank and no tensor axis")
        elif data not in (None, "ddp", "zero1", "zero2", "zeropp"):
            reasons.append("a pipeline is combined only with DDP (replicate), ZeRO-1 or ZeRO-2 on one data axis")
        if loss == "per_microbatch_mean":
            reasons.append("a per-microbatch mean loss under a pipeline is not realised by the harness")
        if clip is not None and (data not in (None, "ddp") or clip not in ("global", "stage")):
            reasons.append("gradient clipping under a pipeline is realised only with DDP (replicate) or no data "
                           "axis, and a norm over the stages or each stage's own")
        if grad_reduce != "mean" or divisor_given(plan):
            reasons.append("gradient-reduction overrides under a pipeline are not realised by the harness")
        if tf is not None and tf.tied_embeddings and tensor_axis is not None and chunks > 1:
            reasons.append("tied embeddings across interleaved pipeline stages with tensor parallelism are not "
                           "realised by the harness")
    if not data_axes and tensor_axis is None and pipeline_axis is None:
        reasons.append("the plan has no data, tensor or pipeline axis to realise")
    reasons += _group_reasons(plan)
    widths = realised_widths(plan.model, bindings)
    if isinstance(widths, str):
        reasons.append(widths)
    elif widths.params != 4 or widths.master_copy:
        if tensor_axis or pipeline_axis or context_axis or expert_axis or moe or data not in DATA_WITH_WIDTHS:
            reasons.append("stated byte widths other than fp32 without a master copy are realised only on data axes "
                           "(DDP, ZeRO-1, ZeRO-2, FSDP, HYBRID_SHARD), without tensor, pipeline, context or expert "
                           "axes")
        if clip is not None:
            reasons.append("gradient clipping with stated byte widths other than fp32 is not realised by the harness "
                           "(clip_grad_norm_ all-reduces its partial norms in the gradients' dtype)")
        if widths.params == 2:
            impl.append("parameters and gradients in torch.bfloat16")
        if widths.master_copy:
            impl.append("an fp32 master copy of the parameters in the optimizer")
    if reasons:
        return Unrealised(plan.name, tuple(reasons))
    mesh = tuple((a, sizes[a]) for a in plan.mesh.names)
    return Realisation(
        plan=plan.name,
        mesh=mesh,
        implementation=" + ".join(impl),
        data=data,
        data_axes=tuple(data_axes),
        reshard_after_forward=raf,
        tensor_axis=tensor_axis,
        sequence_parallel=plan.sequence_parallel and tensor_axis is not None,
        grad_reduce=grad_reduce,
        grad_divide=divisor,
        sync_every_microbatch=every,
        clip=clip,
        clip_double_count=double_count,
        optimizer=widths.optimizer,
        loss=loss,
        regather=regather,
        pipeline_axis=pipeline_axis,
        schedule=schedule,
        chunks=chunks,
        unit=unit,
        outer=zeropp_outer,
        recompute=plan.recompute.value,
        tensor_unreduced=tuple(unreduced),
        tensor_reduced_again=tuple(reduced_again),
        context_axis=context_axis,
        expert_axis=expert_axis,
        expert_divide=Fraction(0) if expert_divide_by is None else
        expert_divide_by * (n_data if loss == "global_mean" else 1),
        tokens_over=tokens_over,
        dropout=dropout,
        tie_reduce=tie_reduce,
        param_bytes=widths.params,
        master_copy=widths.master_copy,
        approximations=tuple(approx),
    )


DATA_WITH_WIDTHS = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
PIPELINE_SCHEDULES = (ir.ScheduleKind.GPIPE, ir.ScheduleKind.ONE_F_ONE_B, ir.ScheduleKind.INTERLEAVED)
PIPELINE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                    "zeropp": "ScheduleLoopedBFS (breadth-first: a chunk's whole unit of microbatches in a row)"}


def divisor_given(plan: ir.Plan) -> bool:
    return any(o.target == OverrideTarget.GRADS and o.verb == OverrideVerb.DIVIDE for o in plan.overrides)


def _product(sizes: Mapping[str, int], axes) -> int:
    n = 1
    for a in axes:
        n *= sizes[a]
    return n


def _group_reasons(plan: ir.Plan) -> list[str]:
    """A ``group`` block of the model that changes what the plan runs: the harness builds the layers
    from the transformer shape alone and places every parameter by the plan's modes, so a group of
    the user's own, a restated tensor rule, group modes or roles would be dropped, not run."""
    out = []
    for d in plan.model.groups:
        said = [w for w, present in (("its own size", d.count is not None or d.fraction is not None),
                                     (f"tensor = {d.tensor}", d.tensor is not None),
                                     (f"stage = {d.stage}", d.stage is not None),
                                     ("an expert rule", d.experts is not None), (f"like = {d.like}", d.like is not None),
                                     (f"sees = {d.sees}", d.sees is not None), ("modes of its own", bool(d.modes)),
                                     ("roles of its own (parallel folding)", bool(d.roles))) if present]
        if said:
            out.append(f"group {d.name} ({', '.join(said)}, line {d.span.line}) is not realised by the harness, which "
                       "builds the layers from the transformer shape and places every parameter by the plan's modes")
    return out
