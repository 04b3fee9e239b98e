"""The passes that decide how PyTorch realises a plan (``realise.realise`` runs them in order).

Each pass reads the ``Draft`` (the plan, the run's sizes and bindings, and what the earlier
passes decided) and adds to it: the axis each role runs on, the library strategy of the data
axes, the implementation in words, the approximations, and the reasons the plan cannot run.
A pass never drops a construct of the plan: what the harness cannot run becomes a reason.
Pure data; knows nothing of torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping

from .. import ir
from ..ir import views
from ..ir.overrides import OverrideTarget, OverrideVerb
from .realise_overrides import HarnessOverrides, RunAxes, read_overrides, time_realised
from .shape import ShapeError, value_of
from .widths import Widths, realised_widths

M = ir.Mode

DATA_WITH_WIDTHS = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
PIPELINE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                    "zeropp": "ScheduleLoopedBFS (breadth-first: a chunk's whole unit of microbatches in a row)"}
FSDP_UNITS = ("layer", "block")  # fully_shard per transformer block: the unit the harness gathers


@dataclass
class Draft:
    """A plan on its way to a ``Realisation``: the input and each pass's decisions."""

    plan: ir.Plan
    sizes: Mapping[str, int]
    bindings: Mapping[str, ir.Value]
    reasons: list[str] = field(default_factory=list)
    approx: list[str] = field(default_factory=list)
    impl: list[str] = field(default_factory=list)
    schedule: str | None = None
    chunks: int = 1
    unit: int = 1
    pipeline_axis: str | None = None
    moe: bool = False
    data_axes: list[str] = field(default_factory=list)
    tensor_axis: str | None = None
    context_axis: str | None = None
    expert_axis: str | None = None
    data: str | None = None
    raf: bool = True
    zeropp_outer: str | None = None
    ov: HarnessOverrides = field(default_factory=HarnessOverrides)
    divisor: Fraction = Fraction(0)
    n_data: int = 1
    widths: Widths | None = None

    @property
    def tf(self) -> ir.TransformerShape | None:
        return self.plan.model.transformer


def modes(plan: ir.Plan, axis: str) -> tuple[M, M, M]:
    return (
        plan.placement(ir.State.PARAMS).mode(axis),
        plan.placement(ir.State.OPTIMIZER).mode(axis),
        plan.placement(ir.State.GRADS).mode(axis),
    )


def product(sizes: Mapping[str, int], axes) -> int:
    n = 1
    for a in axes:
        n *= sizes[a]
    return n


def divisor_given(plan: ir.Plan) -> bool:
    return any(o.target == OverrideTarget.GRADS and o.verb == OverrideVerb.DIVIDE for o in plan.overrides)


def offload(d: Draft) -> None:
    for p in d.plan.placements:
        if p.offloaded:
            # not realised on any device: the harness moves no state to the host (on CUDA it could
            # be; on the CPU, the local launcher's device, an offload is indistinguishable)
            d.reasons.append(f"{p.state.value} is offloaded to {p.residency.value}: not realised, the harness keeps "
                             "every state on the device the run computes on (a CPU run has no separate device "
                             "memory to offload from)")


def schedule(d: Draft) -> None:
    s = d.plan.schedule
    if s is None:
        return
    kind = s.kind
    d.schedule, d.pipeline_axis = kind.value, s.axis
    try:
        d.chunks = int(value_of(s.chunks, d.bindings)) if kind in (ir.ScheduleKind.INTERLEAVED, ir.ScheduleKind.ZEROPP) else 1
        d.unit = int(value_of(s.unit, d.bindings)) if kind is ir.ScheduleKind.ZEROPP else 1
    except ShapeError as exc:
        d.reasons.append(f"the schedule's chunk count or unit has no value: {exc}")
    if kind is ir.ScheduleKind.ZEROPP and d.unit != 2 * d.sizes[d.pipeline_axis]:
        # the run's step is 2p microbatches (docs/validation.md)
        d.reasons.append(f"the zeropp schedule is realised with one scheduling unit per step (U = 2p = "
                         f"{2 * d.sizes[d.pipeline_axis]} microbatches); this plan's U is {d.unit}")


def experts(d: Draft) -> None:
    if d.tf is None:
        return
    try:
        d.moe = value_of(d.tf.experts, d.bindings) > 1
    except ShapeError as exc:
        d.reasons.append(f"the model's expert count has no value: {exc}")


def axes(d: Draft) -> None:
    for axis in d.plan.mesh.names:
        role = views.view(d.plan).role(axis)
        if role is ir.Role.DATA:
            d.data_axes.append(axis)
        elif role is ir.Role.CONTEXT and d.context_axis is None:
            d.context_axis = axis
        elif role is ir.Role.EXPERT and d.expert_axis is None:
            d.expert_axis = axis
        elif role in (ir.Role.TENSOR, ir.Role.SEQUENCE) and d.tensor_axis is None:
            d.tensor_axis = axis
        elif role is ir.Role.PIPELINE and axis == d.pipeline_axis:
            continue
        else:
            d.reasons.append(f"axis '{axis}' with role {role.value} is not realised by the harness")


def data_strategy(d: Draft) -> None:
    plan = d.plan
    if len(d.data_axes) == 1:
        ms = modes(plan, d.data_axes[0])
        d.raf = plan.placement(ir.State.PARAMS).reshard_after_forward
        if ms == (M.R, M.R, M.R):
            d.data, d.impl = "ddp", ["DistributedDataParallel"]
        elif ms == (M.R, M.S, M.R):
            d.data, d.impl = "zero1", ["ZeRO-1 (reduce-scatter of gradients, all-gather of updated parameters)"]
        elif ms == (M.R, M.S, M.S):
            d.data, d.impl = "zero2", ["ZeRO-2 (reduce-scatter of gradients, all-gather of updated parameters)"]
        elif ms == (M.S_STAR, M.S, M.S):
            d.data, d.impl = "fsdp", [f"fully_shard(reshard_after_forward={d.raf})"]
        else:
            d.reasons.append("data-axis placement (params, optimizer, grads) = (" + ", ".join(m.value for m in ms)
                             + ") has no PyTorch implementation")
    elif len(d.data_axes) == 2:
        outer, inner = modes(plan, d.data_axes[0]), modes(plan, d.data_axes[1])
        d.raf = plan.placement(ir.State.PARAMS).reshard_after_forward
        if d.schedule == "zeropp" and outer == (M.S_STAR, M.S, M.S) and inner in ((M.R, M.R, M.R), (M.R, M.S, M.R)) \
                and d.raf and plan.placement(ir.State.PARAMS).unit == "chunk":
            d.data, d.zeropp_outer = "zeropp", "ddp" if inner == (M.R, M.R, M.R) else "zero1"
            d.impl = [f"fully_shard per model chunk over '{d.data_axes[0]}' (gathered once per scheduling unit in "
                      "forward and once in backward) + "
                      + (f"its gradient shards all-reduced over '{d.data_axes[1]}'" if d.zeropp_outer == "ddp" else
                         f"ZeRO-1 of its shards over '{d.data_axes[1]}'")]
        elif outer == (M.R, M.R, M.R) and inner == (M.S_STAR, M.S, M.S):
            d.data, d.impl = "hsdp", [f"fully_shard(mesh=2-D (replicate, shard), reshard_after_forward={d.raf}) "
                                      "(HYBRID_SHARD)"]
        else:
            d.reasons.append("two data axes are realised only as HYBRID_SHARD (R on the first, S*/S/S on the second)")
    elif len(d.data_axes) > 2:
        d.reasons.append("more than two data axes are not realised")


def tensor(d: Draft) -> None:
    if d.tensor_axis is None:
        return
    if modes(d.plan, d.tensor_axis) != (M.S, M.S, M.S):
        d.reasons.append(f"tensor axis '{d.tensor_axis}' is realised only with params, optimizer, grads all S")
    if d.data not in (None, "fsdp", "ddp", "zero1", "zero2"):
        d.reasons.append("tensor parallelism is combined only with DDP, ZeRO or FSDP on one data axis")
    d.impl.append("DTensor " + ("Colwise/Rowwise + SequenceParallel" if d.plan.sequence_parallel
                                else "ColwiseParallel/RowwiseParallel"))
    if d.tf is not None and d.tf.tied_embeddings:
        d.approx.append(
            "tied embeddings under tensor parallelism: the harness keeps the embedding (which is the head) "
            "whole on the tensor axis, where the plan and Megatron-LM shard it over the vocabulary")


def pipeline(d: Draft) -> None:
    if d.pipeline_axis is None:
        return
    if modes(d.plan, d.pipeline_axis) != (M.S, M.S, M.S):
        d.reasons.append(f"pipeline axis '{d.pipeline_axis}' is realised only with params, optimizer, grads all S")
    if d.data == "ddp":
        d.impl[0] = "replicate (FSDP2-based DDP)"
    if d.schedule in PIPELINE_CLASSES:
        d.impl.append(f"torch.distributed.pipelining {PIPELINE_CLASSES[d.schedule]}"
                      + (f" ({d.chunks} stages per rank)" if d.chunks > 1 else ""))


def context(d: Draft) -> None:
    if d.context_axis is None:
        return
    if modes(d.plan, d.context_axis) != (M.R, M.R, M.R):
        d.reasons.append(f"context axis '{d.context_axis}' is realised only with params, optimizer, grads all R")
    if d.data not in ("ddp", "fsdp") or d.tensor_axis is not None or d.pipeline_axis is not None:
        d.reasons.append("context parallelism is realised only with DDP or FSDP on one data axis (no tensor or "
                         "pipeline axis)")
    elif d.data == "ddp":
        d.impl[0] = f"DistributedDataParallel over ({', '.join(d.data_axes + [d.context_axis])})"
    else:
        d.impl[0] = (f"fully_shard(mesh=2-D ({d.context_axis} replicate, {d.data_axes[0]} shard), "
                     f"reshard_after_forward={d.raf}) (HYBRID_SHARD)")
    d.impl.append(f"ring attention over '{d.context_axis}' (the sequence split into contiguous blocks, keys and "
                  "values passed by send/recv)")


def mixture_of_experts(d: Draft) -> None:
    tf, ea = d.tf, d.expert_axis
    if d.moe:
        if tf.mla or tf.dense_layers is not None or tf.moe_every is not None or tf.mtp_layers is not None:
            d.reasons.append("mixture-of-experts layers are realised only on every layer of a transformer without "
                             "latent attention (MLA) or multi-token prediction")
        if d.tensor_axis is not None or d.pipeline_axis is not None or (d.context_axis and ea):
            d.reasons.append("mixture-of-experts layers are realised only with data, expert or context axes (no "
                             "tensor or pipeline axis, not both an expert and a context axis)")
        if ea is not None and d.data not in ("ddp", "zero1"):
            d.reasons.append("expert parallelism is realised only with DDP or ZeRO-1 on one data axis")
        if ea is not None:
            d.impl.append(f"mixture of experts: experts split over '{ea}', tokens dispatched and combined by "
                          "all_to_all_single (capacity-padded), "
                          + ("the other parameters' optimizer state sharded over it too" if d.data == "zero1" else
                             "the other gradients all-reduced over it"))
        else:
            d.impl.append("mixture of experts (capacity-padded routing, every expert on every rank)")
    elif ea is not None:
        d.reasons.append(f"expert axis '{ea}' without mixture-of-experts layers is not realised")
    if ea is not None and modes(d.plan, ea) != (M.S, M.S, M.S):
        d.reasons.append(f"expert axis '{ea}' is realised only with the experts' params, optimizer, grads S")


def overrides(d: Draft) -> None:
    d.ov = read_overrides(d.plan, RunAxes(tuple(d.data_axes), d.tensor_axis, d.context_axis, d.expert_axis,
                                          d.pipeline_axis), d.bindings, d.reasons)
    # Every rank's loss is the mean over its own tokens (all ranks hold equally many) and the
    # gradient reduction sums and then divides by ``grad_divide``: the plan's divisor × (dp for a
    # global-mean loss, whose loss is already divided by the global token count).
    d.n_data = product(d.sizes, d.data_axes + [a for a in (d.context_axis, d.expert_axis) if a])
    d.divisor = Fraction(d.n_data) if d.ov.divide_by is None else \
        d.ov.divide_by * (d.n_data if d.ov.loss == "global_mean" else 1)


def override_constraints(d: Draft) -> None:
    """The overrides the harness reads, against the strategies that can carry them."""
    ov, data, r = d.ov, d.data, d.reasons
    if d.divisor != d.n_data and data not in ("ddp", "zero1", "zero2", "fsdp", "hsdp"):
        r.append("a gradient divisor other than the data-parallel size needs DDP, ZeRO or FSDP")
    if ov.clip is not None and data in ("zero1", "zero2"):
        r.append("gradient clipping with ZeRO-1/2 is not realised by the harness")
    if ov.every and (data != "ddp" or d.pipeline_axis is not None):
        r.append("reducing the gradients after every microbatch is realised only with DistributedDataParallel "
                 "(no no_sync) without a pipeline")
    elif ov.every:
        d.impl.append("no no_sync: the buckets all-reduced after every microbatch")
    if ov.grad_reduce in ("none", "twice") and data != "ddp":
        r.append("skipping or repeating the gradient all-reduce is realised only with DistributedDataParallel")
    if ov.clip == "global" and data == "ddp" and d.tensor_axis is not None:
        # DDP over tensor parallelism runs on the local shards (PyTorch's DDP + TP path swaps the
        # DTensor parameters for them), where clip_grad_norm_ would take each rank's own norm: the bug
        r.append("a clip norm over the tensor axis with DistributedDataParallel is not realised by the harness "
                 "(DDP runs on the local tensor-parallel shards, where clip_grad_norm_ takes each rank's own norm)")
    if ov.clip == "local" and data not in ("fsdp", "hsdp") and d.tensor_axis is None:
        r.append("a local-shard clip norm is realised only with FSDP or tensor parallelism "
                 "(replicated gradients have no shard)")
    if not ov.regather and data not in ("zero1", "zero2"):
        r.append("params no_regather is realised only with ZeRO-1 or ZeRO-2")
    if "biases" in ov.unreduced:
        r.append("override grads[biases] under sequence parallelism: DTensor's RowwiseParallel adds the "
                 "row-parallel bias before the reduce-scatter into sequence shards, so its gradient comes whole "
                 "from the all-gathered output gradient on every tensor rank and is never reduced over the "
                 "tensor axis (Megatron-LM adds it to the sequence shards): the override has nothing to act on")
    if (ov.unreduced or ov.reduced_again) and data not in ("ddp", "zero1"):
        r.append("a parameter group's gradient reduction over the tensor axis is realised only with DDP or "
                 "ZeRO-1 on the data axis")
    if (ov.unreduced or ov.reduced_again) and d.pipeline_axis is not None:
        r.append("gradient-reduction overrides under a pipeline are not realised by the harness")
    if ov.dropout and (d.pipeline_axis is not None or data not in (None, "ddp")):
        r.append("dropout seeds are realised only without a pipeline, with DDP or no data axis")
    if ov.dropout:
        d.impl.append("hidden dropout (p = 0.1) with masks fixed by position in the global batch, seeded "
                      + ("apart on each tensor rank in the replicated region" if ov.dropout == "vary" else
                         "alike on every sequence-parallel slice"))
    if not ov.tie_reduce and (d.pipeline_axis is None or d.tf is None or not d.tf.tied_embeddings):
        r.append("override embedding: tie_reduce over () is realised only with tied embeddings across "
                 "pipeline stages")


def time_constraints(d: Draft) -> None:
    """The statements about time within a step, against the strategies that carry them."""
    plain = d.pipeline_axis is None and d.expert_axis is None and d.context_axis is None
    d.impl += time_realised(d.ov, d.data, plain, d.tensor_axis is not None, d.reasons)


def pipeline_constraints(d: Draft) -> None:
    if d.pipeline_axis is None:
        return
    data, r = d.data, d.reasons
    if d.schedule == "zeropp" and data != "zeropp":
        r.append("the zeropp schedule is realised only with its own data axes: S* (chunk units) on the "
                 "first, R or ZeRO-1 on the second")
    elif data == "zeropp" and d.tensor_axis is not None:
        r.append("the zeropp schedule is realised without a tensor axis")
    elif data == "zero2" and (d.chunks > 1 or d.tensor_axis is not None):
        r.append("ZeRO-2 under a pipeline is realised with one model chunk per rank and no tensor axis")
    elif data not in (None, "ddp", "zero1", "zero2", "zeropp"):
        r.append("a pipeline is combined only with DDP (replicate), ZeRO-1 or ZeRO-2 on one data axis")
    if d.ov.loss == "per_microbatch_mean":
        r.append("a per-microbatch mean loss under a pipeline is not realised by the harness")
    if d.ov.clip is not None and (data not in (None, "ddp") or d.ov.clip not in ("global", "stage")):
        r.append("gradient clipping under a pipeline is realised only with DDP (replicate) or no data "
                 "axis, and a norm over the stages or each stage's own")
    if d.ov.grad_reduce != "mean" or divisor_given(d.plan):
        r.append("gradient-reduction overrides under a pipeline are not realised by the harness")
    if d.tf is not None and d.tf.tied_embeddings and d.tensor_axis is not None and d.chunks > 1:
        r.append("tied embeddings across interleaved pipeline stages with tensor parallelism are not "
                 "realised by the harness")


def something_to_run(d: Draft) -> None:
    if not d.data_axes and d.tensor_axis is None and d.pipeline_axis is None:
        d.reasons.append("the plan has no data, tensor or pipeline axis to realise")


def groups(d: Draft) -> None:
    """A ``group`` block of the model that changes what the plan runs: the harness builds the layers
    from the transformer shape alone and places every parameter by the plan's modes, so a group of
    the user's own, a restated tensor rule, group modes or roles would be dropped, not run."""
    for g in d.plan.model.groups:
        said = [w for w, present in (("its own size", g.count is not None or g.fraction is not None),
                                     (f"tensor = {g.tensor}", g.tensor is not None),
                                     (f"stage = {g.stage}", g.stage is not None),
                                     ("an expert rule", g.experts is not None), (f"like = {g.like}", g.like is not None),
                                     (f"sees = {g.sees}", g.sees is not None), ("modes of its own", bool(g.modes)),
                                     ("roles of its own (parallel folding)", bool(g.roles))) if present]
        if said:
            d.reasons.append(f"group {g.name} ({', '.join(said)}, line {g.span.line}) is not realised by the "
                             "harness, which builds the layers from the transformer shape and places every "
                             "parameter by the plan's modes")


def widths(d: Draft) -> None:
    w = realised_widths(d.plan.model, d.bindings)
    if isinstance(w, str):
        d.reasons.append(w)
        return
    d.widths = w
    if w.params != 4 or w.master_copy:
        if d.tensor_axis or d.pipeline_axis or d.context_axis or d.expert_axis or d.moe or d.data not in DATA_WITH_WIDTHS:
            d.reasons.append("stated byte widths other than fp32 without a master copy are realised only on data axes "
                             "(DDP, ZeRO-1, ZeRO-2, FSDP, HYBRID_SHARD), without tensor, pipeline, context or expert "
                             "axes")
        if d.ov.clip is not None:
            d.reasons.append("gradient clipping with stated byte widths other than fp32 is not realised by the "
                             "harness (clip_grad_norm_ all-reduces its partial norms in the gradients' dtype)")
        if w.params == 2:
            d.impl.append("parameters and gradients in torch.bfloat16")
        if w.master_copy:
            d.impl.append("an fp32 master copy of the parameters in the optimizer")


# the transformer fields the harness's model builds (measure.shape.scale_down keeps their structure;
# the sizes are scaled down); any other field stated otherwise than its default is not run
TRANSFORMER_BUILT = frozenset({
    "hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "tied_embeddings", "experts", "top_k", "gated_mlp",
    "norm", "bias", "capacity_factor", "qkv_bias", "expert_ffn", "shared_experts", "shared_expert_ffn",
    "shared_expert_gate", "router_bias", "span"})
# model fields the run realises (scaled sizes, widths, groups: their own passes), carries into the
# prediction (the activation conventions) or that price what no run measures (time, host memory, the
# runtime's reserve beside the allocator peak); the rest, stated otherwise than the default, is not run
MODEL_HANDLED = frozenset({
    "params", "bytes_params", "bytes_grads", "bytes_optimizer", "bytes_activations", "seq", "microbatch",
    "microbatches", "transformer", "span", "groups", "activation_count", "activation_allowance", "reserve",
    "reserve_fraction", "attention_flops", "compute_time", "tensor_backward", "host_construction", "host_construction_model",
    "host_buffer_factor", "bytes_stated"})


def _default(cls, name: str):
    f = cls.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def model(d: Draft) -> None:
    """Every field of the model the harness's tiny transformer does not build, stated otherwise than
    its default: a reason naming it (a field added to the language is never silently dropped)."""
    m, tf = d.plan.model, d.tf
    if tf is not None:
        for name in sorted(set(ir.TransformerShape.__dataclass_fields__) - TRANSFORMER_BUILT):
            value = getattr(tf, name)
            if value == _default(ir.TransformerShape, name) or (name == "head_dim" and _head_dim_plain(tf, d.bindings)):
                continue
            d.reasons.append(f"the transformer's {name} (line {tf.span.line}) is not built by the harness's model "
                             "(docs/validation.md, \"How the model is scaled down\")")
    if m.loss_terms:
        d.reasons.append("loss terms besides the language-model loss (" + ", ".join(t for t, _, _ in m.loss_terms)
                         + ") are not realised by the harness, which trains the language-model loss alone")
    try:
        logits = value_of(m.bytes_logits, d.bindings)
    except ShapeError as exc:
        d.reasons.append(f"the logits' byte width has no value: {exc}")
        logits = Fraction(4)
    if logits != 4:
        d.reasons.append(f"logits of {logits} bytes: the harness computes the loss on fp32 logits (4 bytes)")
    for name in sorted(set(ir.Model.__dataclass_fields__) - MODEL_HANDLED - {"loss_terms", "bytes_logits"}):
        if getattr(m, name) != _default(ir.Model, name):
            d.reasons.append(f"the model's {name} is not realised by the harness")
    params = d.plan.placement(ir.State.PARAMS)
    if d.data in ("fsdp", "hsdp") and params.unit not in FSDP_UNITS:
        d.reasons.append(f"params S* with unit = {params.unit}: the harness gathers one transformer block at a time "
                         "(fully_shard per block and the root; unit = layer or block)")
    if any(params.mode(a) is M.S_STAR for a in d.plan.mesh.names) and params.prefetch != 1:
        d.reasons.append(f"params S* with prefetch = {params.prefetch}: the harness runs fully_shard's own "
                         "prefetching (prefetch = 1)")


def _head_dim_plain(tf: ir.TransformerShape, bindings) -> bool:
    """Whether a stated head width is hidden / heads, the width the harness's heads have."""
    try:
        return value_of(tf.head_dim, bindings) * value_of(tf.heads, bindings) == value_of(tf.hidden, bindings)
    except ShapeError:
        return False


PASSES = (offload, schedule, experts, axes, data_strategy, tensor, pipeline, context, mixture_of_experts,
          overrides, override_constraints, time_constraints, pipeline_constraints, something_to_run, groups, widths, model)
