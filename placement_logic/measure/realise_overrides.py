"""The overrides of a plan as the measurement harness reproduces them (no torch).

Input: a plan, the axes its run gives each role, the spec's bindings and the list of reasons
the plan cannot be realised. Output: ``HarnessOverrides``, what the ranks do differently from
the library strategies (a gradient reduction skipped or repeated, a divisor, a loss
normalisation, a clip norm over other axes and its duplicate filter, dropout seeds, the tied embedding's reduction,
no re-gather, a reduction after every microbatch, the gradients carried into the next step, an
update after every microbatch, the accumulated buffer reduced again after every microbatch); an
override the harness cannot reproduce
adds its reason, so the plan is reported unrealised rather than run as something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Mapping, NamedTuple

from .. import ir
from ..ir import groups as pg
from ..ir.overrides import OverrideTarget, OverrideVerb
from .shape import ShapeError, value_of

TENSOR_WHOLE_GROUPS = ("norms", "biases")  # kept whole on a tensor axis: norm weights and biases, row-parallel biases


class RunAxes(NamedTuple):
    data: tuple[str, ...]
    tensor: str | None
    context: str | None
    expert: str | None
    pipeline: str | None


@dataclass
class HarnessOverrides:
    grad_reduce: str = "mean"  # mean | none | twice
    clip: str | None = None  # global | local | stage
    regather: bool = True
    tie_reduce: bool = True
    double_count: bool = False
    unreduced: list[str] = field(default_factory=list)  # groups left unreduced over the tensor axis
    reduced_again: list[str] = field(default_factory=list)  # groups reduced over it once more
    every: bool = False  # reduced after every microbatch (DDP without no_sync)
    loss: str = "global_mean"
    divide_by: Fraction | None = None
    tokens_over: tuple[str, ...] | None = None
    expert_divide_by: Fraction | None = None
    dropout: str = ""  # "" | vary | same
    carry: bool = False  # grads: no_zero_grad, the buffers never cleared after the step
    step_each: bool = False  # optimizer: step_every_microbatch, an update after every microbatch's backward
    stepped_groups: list[str] = field(default_factory=list)  # optimizer[G]: ..., the groups G (empty: every one)
    whole_stepped: bool = False  # a statement without a group (or all) among them
    # grads: reduce_accumulated_every_microbatch, the uncleared buffer reduced and added into the shard's
    # gradient after every microbatch
    reaccumulate: bool = False


@dataclass
class _Reading:
    """What one override is read against: the plan, its run's axes, the bindings, the overrides read
    so far and the reasons the plan cannot be realised."""

    plan: ir.Plan
    axes: RunAxes
    bindings: Mapping
    reasons: list[str]
    ov: HarnessOverrides


def _whole(o: ir.Override) -> bool:
    return o.group in (None, "all")


def _grads_reduce(r: _Reading, o: ir.Override) -> bool:
    data_axes, tensor_axis = r.axes.data, r.axes.tensor
    if _whole(o):
        # the harness's DDP reduces over the data axes and the context axis (each context rank holds the gradient
        # of its own sequence block): a reduction leaving the context axis out is not what it runs
        derived = set(data_axes) | ({r.axes.context} if r.axes.context else set())
        if not o.axes:
            r.ov.grad_reduce = "none"
        elif len(data_axes) == 1 and r.axes.context is None and list(o.axes) == [data_axes[0]] * 2:
            r.ov.grad_reduce = "twice"
        elif set(o.axes) != derived or len(o.axes) != len(set(o.axes)):
            r.reasons.append(f"override grads: reduce over ({', '.join(o.axes)}) is realised only as (), the data "
                             "and context axes, or one data axis twice (no context axis)")
        return True
    if not (o.group in TENSOR_WHOLE_GROUPS and tensor_axis and len(data_axes) == 1
            and set(o.axes) in ({data_axes[0]}, {data_axes[0], tensor_axis}) and len(o.axes) == len(set(o.axes))):
        return False
    # the group's whole copies on the tensor axis: under sequence parallelism each holds a partial
    # sum (its sequence shard's), reduced over the tensor axis; without it they are equal
    over_tensor = tensor_axis in o.axes
    if r.plan.sequence_parallel and not over_tensor:
        r.ov.unreduced.append(o.group)
    elif not r.plan.sequence_parallel and over_tensor:
        r.ov.reduced_again.append(o.group)
    return True


def _grads_divide(r: _Reading, o: ir.Override) -> bool:
    if _whole(o):
        try:
            r.ov.divide_by = value_of(o.by, r.bindings) if o.by is not None else None
        except ShapeError as exc:
            r.reasons.append(f"override grads: divide has no value: {exc}")
        return True
    if o.group != "experts" or r.axes.expert is None:
        return False
    try:
        r.ov.expert_divide_by = value_of(o.by, r.bindings)
    except ShapeError as exc:
        r.reasons.append(f"override grads[experts]: divide has no value: {exc}")
    return True


def _loss(r: _Reading, o: ir.Override) -> bool:
    if o.group is not None:
        return False
    r.ov.loss = o.verb
    return True


def _seed_vary(r: _Reading, o: ir.Override) -> bool:
    tensor_axis = r.axes.tensor
    if not (tensor_axis and list(o.axes or ()) == [tensor_axis] and not r.plan.sequence_parallel):
        return False
    r.ov.dropout = "vary"
    return True


def _seed_same(r: _Reading, o: ir.Override) -> bool:
    if not (r.axes.tensor and r.plan.sequence_parallel):
        return False
    r.ov.dropout = "same"
    return True


def _tokens_reduce(r: _Reading, o: ir.Override) -> bool:
    context_axis = r.axes.context
    if not (o.group is None and context_axis is not None and o.axes and set(o.axes) <= set(r.axes.data) | {context_axis}):
        return False
    r.ov.tokens_over = tuple(o.axes)
    return True


def _tie_reduce(r: _Reading, o: ir.Override) -> bool:
    if o.group is not None:
        return False
    if not o.axes:
        r.ov.tie_reduce = False
    elif list(o.axes) != [r.axes.pipeline]:
        r.reasons.append(f"override embedding: tie_reduce over ({', '.join(o.axes)}) is realised only as () or "
                         "the pipeline axis")
    return True


def _no_regather(r: _Reading, o: ir.Override) -> bool:
    if not _whole(o):
        return False
    r.ov.regather = False
    return True


def _double_count(r: _Reading, o: ir.Override) -> bool:
    tf = r.plan.model.transformer
    if not (o.group == "embedding" and r.axes.pipeline is not None and tf is not None and tf.tied_embeddings):
        return False
    r.ov.clip, r.ov.double_count = r.ov.clip or "global", True
    return True


def _clip_reduce(r: _Reading, o: ir.Override) -> bool:
    if not _whole(o):
        return False
    data_axes, tensor_axis, pipeline_axis = r.axes.data, r.axes.tensor, r.axes.pipeline
    if pipeline_axis:
        # under a pipeline: the norm over every stage (the pipeline axis and a tensor axis), or
        # each stage's own (the tensor axis alone)
        model_axes = {pipeline_axis} | ({tensor_axis} if tensor_axis else set())
        if len(set(o.axes)) != len(o.axes):
            r.reasons.append(f"override clip_norm: reduce over ({', '.join(o.axes)}) sums twice over an axis, "
                             "which the harness does not realise")
        elif model_axes <= set(o.axes) <= model_axes | set(data_axes):
            r.ov.clip = "global"
        elif tensor_axis and set(o.axes) == {tensor_axis}:
            r.ov.clip = "stage"
        else:
            r.reasons.append(f"override clip_norm: reduce over ({', '.join(o.axes)}) is not realised")
        return True
    # the global norm: summed at least over the axes the gradients are sharded on (the tensor
    # axis, data axes with sharded gradients), each axis once; copies summed over a replicated
    # axis ask for a stated filter (_filters_realised)
    grads = r.plan.placement(ir.State.GRADS)
    sharded = {a for a in data_axes if grads.mode(a) is not ir.Mode.R} | ({tensor_axis} if tensor_axis else set())
    if not o.axes:
        r.ov.clip = "local"
    elif sharded <= set(o.axes) <= set(data_axes) | sharded and len(set(o.axes)) == len(o.axes):
        r.ov.clip = "global"
    else:
        r.reasons.append(f"override clip_norm: reduce over ({', '.join(o.axes)}) is not realised")
    return True


def _every_microbatch(r: _Reading, o: ir.Override) -> bool:
    if not _whole(o):
        return False
    r.ov.every = True
    return True


def _no_zero_grad(r: _Reading, o: ir.Override) -> bool:
    if not _whole(o):
        return False
    r.ov.carry = True
    return True


STEPPED_GROUPS = ("matrices", "mlp", "norms", "final_norm", "biases", "embedding", "head")  # ranks/stepped.py


def _step_every_microbatch(r: _Reading, o: ir.Override) -> bool:
    r.ov.step_each = True
    if _whole(o):
        r.ov.stepped_groups.clear()
        r.ov.whole_stepped = True
        return True
    tf = r.plan.model.transformer
    try:
        dense = tf is not None and value_of(tf.experts, r.bindings) <= 1 and not tf.qk_norm
    except ShapeError:
        dense = False
    if not dense or o.group not in STEPPED_GROUPS or (tf.tied_embeddings and o.group in ("embedding", "head")):
        r.reasons.append(f"override optimizer[{o.group}]: step_every_microbatch is realised for every group, or for "
                         f"the groups {', '.join(STEPPED_GROUPS)} of a dense transformer (untied for embedding and "
                         "head): the groups the harness tells apart in its model")
    elif not r.ov.whole_stepped:
        r.ov.stepped_groups.append(o.group)
    return True


def _reduce_accumulated(r: _Reading, o: ir.Override) -> bool:
    if not _whole(o):
        return False
    r.ov.reaccumulate = True
    return True


# what the harness runs for each override it can reproduce, by (target, verb): each reads the override
# into the harness's settings (or adds the reason it cannot) and answers False where the override's group
# or the run's axes are not ones it realises
_READERS: dict[tuple[str, str], Callable[[_Reading, ir.Override], bool]] = {
    (OverrideTarget.GRADS, OverrideVerb.REDUCE): _grads_reduce,
    (OverrideTarget.GRADS, OverrideVerb.DIVIDE): _grads_divide,
    (OverrideTarget.GRADS, OverrideVerb.REDUCE_EVERY_MICROBATCH): _every_microbatch,
    (OverrideTarget.GRADS, OverrideVerb.NO_ZERO_GRAD): _no_zero_grad,
    (OverrideTarget.GRADS, OverrideVerb.REDUCE_ACCUMULATED_EVERY_MICROBATCH): _reduce_accumulated,
    (OverrideTarget.OPTIMIZER, OverrideVerb.STEP_EVERY_MICROBATCH): _step_every_microbatch,
    **{(OverrideTarget.LOSS, v): _loss
       for v in (OverrideVerb.GLOBAL_MEAN, OverrideVerb.PER_DEVICE_MEAN, OverrideVerb.PER_MICROBATCH_MEAN)},
    (OverrideTarget.DROPOUT_SEED, OverrideVerb.VARY): _seed_vary,
    (OverrideTarget.DROPOUT_SEED, OverrideVerb.SAME): _seed_same,
    (OverrideTarget.TOKENS, OverrideVerb.REDUCE): _tokens_reduce,
    (OverrideTarget.EMBEDDING, OverrideVerb.TIE_REDUCE): _tie_reduce,
    (OverrideTarget.PARAMS, OverrideVerb.NO_REGATHER): _no_regather,
    (OverrideTarget.CLIP_NORM, OverrideVerb.DOUBLE_COUNT): _double_count,
    (OverrideTarget.CLIP_NORM, OverrideVerb.REDUCE): _clip_reduce,
}


def read_overrides(plan: ir.Plan, axes: RunAxes, bindings: Mapping, reasons: list[str]) -> HarnessOverrides:
    """What the harness runs for each of ``plan``'s overrides; ``reasons`` gains each one it cannot run."""
    r = _Reading(plan, axes, bindings, reasons, HarnessOverrides())
    clip_sum: tuple[str, ...] | None = None  # the axes of a plan-wide `clip_norm: reduce`
    filters: list[ir.Override] = []  # `clip_norm: dedupe` overrides
    for o in plan.overrides:
        if o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.REDUCE and _whole(o):
            clip_sum = tuple(o.axes or ())
        if o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.DEDUPE:
            filters.append(o)
            continue
        reader = _READERS.get((o.target, o.verb))
        if reader is None or not reader(r, o):
            group = f"[{o.group}]" if o.group else ""
            reasons.append(f"override {o.target}{group}: {o.verb} is not realised by the harness")
    if r.ov.clip in ("global", "stage") and clip_sum is not None:
        _filters_realised(plan, axes, clip_sum, filters, reasons)
    elif filters:
        reasons.append("override clip_norm: dedupe is realised only beside a norm reduction the harness runs over "
                       "the stages, the tensor axis or the data axes")
    return r.ov


def time_realised(ov: HarnessOverrides, data: str | None, plain: bool, tensor: bool, r: list[str]) -> list[str]:
    """The statements about time within a step (docs/semantics.md: gradient buffers across steps,
    optimizer updates within a step, an accumulated buffer reduced again), against the strategies
    that carry them: DDP's buckets for the first two (without a tensor axis), ZeRO's flat shard for the
    third (``plain``: no pipeline, context or expert axis). ``r`` gains a reason for each one not carried; the answer is
    what the harness runs for the others, in words."""
    impl: list[str] = []
    stated = [w for w, on in (("grads: no_zero_grad", ov.carry), ("optimizer: step_every_microbatch", ov.step_each),
                              ("grads: reduce_accumulated_every_microbatch", ov.reaccumulate)) if on]
    if len(stated) > 1:
        r.append(f"overrides {' and '.join(stated)} together are not realised by the harness")
    if ov.carry and not (data == "ddp" and plain and not tensor):
        r.append("override grads: no_zero_grad is realised only with DistributedDataParallel on one data axis "
                 "(no pipeline, tensor, context or expert axis)")
    elif ov.carry:
        impl.append("no zero_grad after the step: each backward adds into the earlier steps' reduced gradients")
    if ov.step_each and not (data == "ddp" and plain and not tensor and ov.clip is None):
        r.append("override optimizer: step_every_microbatch is realised only with DistributedDataParallel on one "
                 "data axis (no pipeline, tensor, context or expert axis, no gradient clipping)")
    elif ov.step_each:
        which = f"the {', '.join(ov.stepped_groups)} groups' own optimizer: " if ov.stepped_groups else ""
        impl.append(f"{which}optimizer.step() and zero_grad() after every microbatch (no no_sync: each microbatch's "
                    "gradient all-reduced before its update)")
    if ov.reaccumulate and not (data in ("zero1", "zero2") and plain and not ov.unreduced and not ov.reduced_again):
        r.append("override grads: reduce_accumulated_every_microbatch is realised only with ZeRO-1 or ZeRO-2 on one "
                 "data axis (no pipeline, context or expert axis, no group's own reduction over the tensor axis)")
    elif ov.reaccumulate:
        impl.append("the whole gradient buffer reduce-scattered after every microbatch and added into the shard's "
                    "gradient, the buffer not cleared")
    return impl


def _filters_realised(plan: ir.Plan, axes: RunAxes, clip_sum: tuple[str, ...], filters: list[ir.Override],
                      reasons: list[str]) -> None:
    """The harness's clip norm (``clip_grad_norm_`` on DTensors or whole local gradients, or
    Megatron-LM's sum over the stages) counts every copy of a parameter once: it realises a
    written `clip_norm: reduce over (AXES)`, a plain sum, only where the plan states the
    duplicate filter for every group with copies on a summed axis (a data axis with replicated
    gradients: every group; the tensor axis: the groups whole on it; the pipeline axis: a tied
    embedding), and no filter the harness does not apply."""
    data_axes, tensor_axis, _, expert_axis, pipeline_axis = axes
    present = pg.check_groups(plan.model, expert_axis is not None)
    grads = plan.placement(ir.State.GRADS)
    tf = plan.model.transformer
    needed: set[tuple[str, str]] = set()
    for a in set(clip_sum):
        if a in data_axes and grads.mode(a) is ir.Mode.R:
            needed |= {(g, a) for g in present}
        elif a == tensor_axis:
            needed |= {(g, a) for g in TENSOR_WHOLE_GROUPS if g in present}
        elif a == pipeline_axis and tf is not None and tf.tied_embeddings:
            needed.add(("embedding", a))
    stated = {(g, a) for o in filters for a in o.axes or () for g in present
              if g == o.group or (o.group in (None, "all") and (g, a) in needed)}  # no group: those with copies
    missing = sorted(needed - stated, key=lambda x: (x[1], x[0]))
    if missing:
        where = "; ".join(f"{', '.join(g for g, b in missing if b == a)} over {a}"
                          for a in dict.fromkeys(a for _, a in missing))
        reasons.append(f"override clip_norm: reduce over ({', '.join(clip_sum)}) is a plain sum that counts every "
                       f"copy of {where}; the harness's clip counts each parameter once (a duplicate filter), so it "
                       "realises the sum only with that filter stated (override clip_norm: dedupe over (...))")
    extra = sorted(stated - needed)
    if extra:
        reasons.append("override clip_norm: dedupe is realised only for the copies the harness filters: "
                       + "; ".join(f"{g} over {a}" for g, a in extra) + " is not one of them")
