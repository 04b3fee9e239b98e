"""The step model: what one training step does to each value the safety conditions read.

Input: a checked ``ir.Plan``. Output: a ``StepModel`` (plain frozen data, no solver):
for every parameter group the dimensions its gradient is computed over (each classified
as token-split, split, invariant or sharded, with how many times it is reduced), the
loss normalisation and divisor, and for the plan the clip-norm, overflow, dropout-seed,
re-gather, gather and fetch behaviour. The *derived* model is what a correct system does
given the placements; ``ir.Override`` statements replace parts of it with what a real
system does. ``derive(plan, overrides=False)`` gives the reference the report compares
against.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from .. import ir
from ..diagnostics import NO_SPAN, Diagnostic, DiagnosticError, Span
from ..ir import collectives as sc
from ..ir import folding, heads, views
from ..ir import groups as pg
from . import checkpoint as ckpt
from . import clipagg
from . import identity as _identity
from . import nested as _nested
from . import partial as _partial
from . import perrank as _perrank
from . import rng as _rng
from .dims import (  # noqa: F401  (the dimension vocabulary, used by the modules that read a StepModel)
    COPY_PART,
    DATA_ROLES,
    HEAD_PART,
    INVARIANT,
    MICROBATCHES,
    NORMALISATION,
    SHARDED,
    SPLIT,
    TENSOR_ROLES,
    TOKEN,
    GradDim,
    axis_dims,
)
from .microsteps import check_override as check_microsteps
from .parts import gather_counts as _gather_counts
from .parts import own_sources as _own_sources
from .parts import par_needed
from .parts import parts as _parts
from .wellformed import SPLIT_MODES, filter_no_effect, no_effect, persistent_modes, tied, well_typed


@dataclass(frozen=True)
class GroupModel:
    group: str
    dims: tuple[GradDim, ...]
    norm_dims: tuple[str, ...]  # token dims the loss normaliser (token count) is summed over
    divisor_axes: tuple[str, ...]  # divisor = product of these sizes ...
    divisor_value: ir.Value | None  # ... or this value, when an override gives one
    shard_axes: tuple[str, ...]  # mesh axes over which the stored gradient is sharded
    double_count: bool = False  # counted twice in the global grad norm
    span: Span = NO_SPAN  # where the behaviour comes from (override or binding)
    spans: tuple[tuple[str, Span], ...] = ()  # per GI aspect (dimension or NORMALISATION): its source
    clip_axes: tuple[str, ...] | None = None  # axes this group's squared norm is summed over (None: the plan's)
    clip_span: Span = NO_SPAN
    # axes of clip_axes over which the group's copies (it is replicated there) are counted on one rank only:
    # the duplicate filter of a model-parallel norm, derived on every replicated axis of the derived
    # reduction, or stated (`override clip_norm[g]: dedupe over (...)`) beside a stated `reduce over`
    clip_filter: tuple[str, ...] = ()
    clip_filter_stated: bool = False  # the filter is stated by an override (else derived)
    clip_filter_span: Span = NO_SPAN  # the stated filter's override
    objective: str = "mean"  # "mean": the global token mean; "sum": the sum over tokens (loss: sum)
    clip_agg: str = "sum"  # how the ranks' squared norms are combined over clip_axes: sum | average | max (clipagg)
    clip_sqrt: bool = False  # each rank's root taken before the reduction (clip_norm: sqrt_before_reduce)
    clip_rank0: tuple[str, ...] = ()  # axes of clip_axes where the group is counted on rank 0 only (perrank)
    clip_rank0_span: Span = NO_SPAN
    undecided: str = ""  # a fact the step model lacks to decide this group's gradient (its obligations: unknown)
    replicated_params: tuple[str, ...] = ()  # mesh axes over which the group's params are whole copies

    def span_of(self, aspect: str) -> Span:
        return dict(self.spans).get(aspect, NO_SPAN)

    def dim(self, name: str) -> GradDim:
        for d in self.dims:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def token_dims(self) -> tuple[GradDim, ...]:
        return tuple(d for d in self.dims if d.kind == TOKEN)


@dataclass(frozen=True)
class StepModel:
    plan: str
    axes: tuple[str, ...]  # mesh axes in order
    roles: tuple[tuple[str, str], ...]  # (axis, role)
    groups: tuple[GroupModel, ...]
    loss: str  # global_mean | per_device_mean | per_microbatch_mean
    loss_span: Span
    clip_axes: tuple[str, ...]  # axes the squared grad norm is summed over (repetition = twice)
    clip_span: Span
    overflow_axes: tuple[str, ...]
    overflow_span: Span
    seed_vary: tuple[str, ...]  # axes the dropout seed of the residual region varies over
    seed_span: Span
    tensor_axes: tuple[str, ...]
    sequence_parallel: bool
    sp_span: Span
    regather_axes: tuple[str, ...]  # axes the updated params are all-gathered over after the step
    regather_needed: tuple[str, ...]  # axes where params are R but the optimizer is sharded
    regather_span: Span
    gather_axes: tuple[str, ...]  # axes S* params are gathered over before use
    gather_span: Span
    param_modes: tuple[tuple[str, str], ...]  # (axis, mode) of params
    offloaded: bool  # params resident off-device
    fetch: bool  # an offloaded param is fetched before use
    fetch_span: Span
    grads_sharded_data: tuple[str, ...]  # data axes with S/M/O grads
    accumulation_buffer: bool
    accumulation_span: Span
    pipelined: bool
    axis_bindings: tuple[tuple[str, tuple[str, ...]], ...]  # axis -> strategies bound to it
    tied: bool
    pipeline_axes: tuple[str, ...]
    expert_axes: tuple[str, ...]
    data_axes: tuple[str, ...]
    context_axes: tuple[str, ...]
    plan_span: Span = NO_SPAN
    microbatch_symbol: str | None = None  # the let symbol the model's microbatches is, if any
    unusable_axes: tuple[str, ...] = ()  # data/context axes with params S: never reassembled for the forward
    gather_counts: tuple[tuple[str, int], ...] = ()  # (axis, gathers before each use) for every S* axis of params
    optimizer_mismatch: tuple[str, ...] = ()  # axes with grads sharded and the optimizer state replicated
    grads_split_axes: tuple[str, ...] = ()  # axes over which the gradients are sharded or streamed (S, S*, M, O)
    grads_span: Span = NO_SPAN
    optimizer_span: Span = NO_SPAN
    params_span: Span = NO_SPAN
    equal_tokens: bool = False  # `override tokens: equal`: every device and microbatch has the same count
    # (aspect, axis, group, span): an obligation a group's own modes cause ("optimizer", "regather",
    # "gather", "usable"), reported at the group's line
    group_sources: tuple[tuple[str, str, str, Span], ...] = ()
    gather_unsharded: tuple[str, ...] = ()  # axes params are gathered over where they are not sharded
    checkpoint: ckpt.CheckpointModel | None = None  # save, load and reshard (``override checkpoint``), if stated
    identity: _identity.IdentityModel = _identity.IdentityModel()  # initial params and the optimizer's tensors
    rng: _rng.RngModel = _rng.RngModel()  # the RNG state per rank and region

    def size_aliases(self) -> dict[str, str]:
        """Symbols that name a size of the step: the model's microbatches symbol."""
        return {self.microbatch_symbol: MICROBATCHES} if self.microbatch_symbol else {}

    def group(self, name: str) -> GroupModel:
        for g in self.groups:
            if g.group == name:
                return g
        raise KeyError(name)

    def role(self, axis: str) -> str:
        return dict(self.roles).get(axis, "")


def _groups_present(plan: ir.Plan) -> tuple[str, ...]:
    """The gradient groups of the plan's parameter-group model (``ir.groups``), shared with costs."""
    has_experts = bool(plan.axes_with_role(ir.Role.EXPERT))
    return heads.checker_groups(plan, pg.check_groups(plan.model, has_experts))


def _expert_axes(plan: ir.Plan, expert: tuple[str, ...]) -> tuple[str, ...]:
    """The axes the experts are split over while the other groups are reduced there: the plan's
    expert axes, or under folding the experts' own expert axes over data or context devices."""
    fold = folding.expert_group(plan)
    if fold is None:
        return expert
    return tuple(a for a in folding.group_axes(plan, fold, ir.Role.EXPERT)
                 if plan.role(a) in (ir.Role.DATA, ir.Role.CONTEXT, ir.Role.EXPERT))


def _tied(plan: ir.Plan) -> bool:
    return tied(plan)


def _err(code: str, msg: str, span: Span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span)])


def _binding_span(plan: ir.Plan, axis: str) -> Span:
    for b in plan.bindings:
        if axis in b.axes:
            return b.span
    return plan.span


def derive(plan: ir.Plan, overrides: bool = True, keep: tuple[str, ...] = ()) -> StepModel:
    """The step model of ``plan``; with ``overrides=False`` the correct derivation only
    (keeping the overrides whose target is in ``keep``)."""
    if not overrides:
        plan = replace(plan, overrides=tuple(o for o in plan.overrides if o.target in keep))
    axes = plan.mesh.names
    persistent_modes(plan)
    well_typed(plan)
    for o in plan.overrides:
        for a in o.axes or ():
            if a not in axes:
                raise _err("PL501", f"override names axis '{a}', which is not on the mesh", o.span)
    roles = tuple((a, plan.role(a).value) for a in axes)
    data = plan.axes_with_role(*DATA_ROLES)
    context = plan.axes_with_role(ir.Role.CONTEXT)
    tensor = plan.axes_with_role(*TENSOR_ROLES)
    pipeline = plan.axes_with_role(ir.Role.PIPELINE)
    expert = plan.axes_with_role(ir.Role.EXPERT)
    sp = plan.sequence_parallel or bool(plan.axes_with_role(ir.Role.SEQUENCE))
    tied = _tied(plan)
    ovs = plan.overrides

    def last(target: str, verb: str | None = None, group: str | None = "*") -> ir.Override | None:
        found = None
        for o in ovs:
            if o.target == target and (verb is None or o.verb == verb) and (group == "*" or o.group == group):
                found = o
        return found

    # The collective schedule the cost engine prices: the same reductions and gathers.
    colls = sc.derive(plan)
    sync = [c for c in colls if c.phase is sc.Phase.GRAD_SYNC and c.state is ir.State.GRADS]
    sched_gathers = [c for c in colls if c.kind is sc.Kind.ALL_GATHER and c.state is ir.State.PARAMS
                     and c.phase is sc.Phase.FORWARD]
    sched_refresh = [c for c in colls if c.kind is sc.Kind.ALL_GATHER and c.state is ir.State.PARAMS
                     and c.phase is sc.Phase.REFRESH]

    def scheduled(cls: pg.ParamGroup) -> Counter:
        """How often the schedule reduces this group's gradients over each mesh axis (the
        reductions of the buffer its own placement puts it in, ``ir.views``; a reduction over each copy
        group of an axis counts as (axis, "copies"))."""
        key = views.member_key(plan.model, cls)
        return Counter(a if c.size is None else (a, "copies") for c in sync if (
                       c.payload.tensor == heads.PAYLOAD + cls.name
                       or (views.carries(c.payload, key) and (
                           c.payload.tensor == "grads"
                           or (c.payload.tensor == "dense_grads" and cls.checks_as != "experts")
                           or (c.payload.tensor == "expert_grads" and cls.checks_as == "experts")))) for a in c.axes)

    grads_pl = plan.placement(ir.State.GRADS)
    opt_pl = plan.placement(ir.State.OPTIMIZER)
    par_pl = plan.placement(ir.State.PARAMS)
    grads_sharded_data = tuple(
        a for a in data if grads_pl.mode(a) in (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.M, ir.Mode.O)
    )

    loss_o = last("loss", group=None)  # loss[TERM] overrides are loss terms' paths (check.losses)
    loss = loss_o.verb if loss_o else "global_mean"
    tok_o = last("tokens", "reduce", group=None)
    token_axes = data + context + expert  # every axis that splits the global batch's tokens

    groups = []
    plan_pls = (par_pl, opt_pl, grads_pl)
    unusable_all: list[str] = []
    mismatch_all: list[str] = []
    gsplit_all: list[str] = []
    grad_split = (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.M, ir.Mode.O)
    sharded_data_all: list[str] = list(grads_sharded_data)
    sources: list[tuple[str, str, str, Span]] = []
    for g in _groups_present(plan):
        cls = pg.class_of(plan.model, g)
        # the group's effective placements (``ir.views``): its roles and own modes in place
        cv = views.class_view(plan, cls, colls)
        par_pl, opt_pl, grads_pl = cv.params, cv.optimizer, cv.grads
        role_of = folding.role_getter(plan, cls)
        kind = cls.checks_as
        g_whole = tuple(a for a in axes if role_of(a) in (ir.Role.DATA, ir.Role.CONTEXT)
                        or (role_of(a) in TENSOR_ROLES + (ir.Role.EXPERT,) and par_pl.mode(a) not in SPLIT_MODES))
        unusable_g = [a for a in axes if role_of(a) in (ir.Role.DATA, ir.Role.CONTEXT)
                      and par_pl.mode(a) in SPLIT_MODES]
        mismatch_g = [a for a in g_whole if grads_pl.mode(a) in grad_split and opt_pl.mode(a) is ir.Mode.R]
        unusable_all += unusable_g
        mismatch_all += mismatch_g
        gsplit_all += [a for a in g_whole if grads_pl.mode(a) in grad_split]
        sources += _own_sources(cls, (("optimizer", mismatch_g), ("usable", unusable_g)))
        grads_sharded_g = tuple(
            a for a in axes if role_of(a) in DATA_ROLES and grads_pl.mode(a) in grad_split)
        sharded_data_all += [a for a in grads_sharded_g if a in data]
        dims: list[GradDim] = []
        k = scheduled(cls)
        dims += axis_dims(plan, axes, cls, role_of, (par_pl, opt_pl), k, sp, tied)
        dims.append(GradDim(MICROBATCHES, None, TOKEN, 1, why="gradient accumulation over microbatches"))

        span = NO_SPAN
        spans = {d.name: _binding_span(plan, d.axis) for d in dims if d.axis is not None}
        own_axes = {a for st in views.MODEL_STATES for a in cls.own_modes(st)}
        if cls.span != NO_SPAN:  # a dimension on an axis the group places itself: the group's line
            spans.update({d.name: cls.span for d in dims if d.axis in own_axes})
        red = last("grads", "reduce", g) or last("grads", "reduce", "all") or last("grads", "reduce", None)
        if red is not None:
            counts = Counter(red.axes or ())
            span = red.span
            spans.update({d.name: red.span for d in dims if d.name != MICROBATCHES})
            new = []
            for d in dims:
                if d.name == MICROBATCHES:
                    new.append(d)
                else:  # a tie or a part of an axis (K/V copies) is reduced by a reduction over its axis
                    new.append(replace(d, k=counts.get(d.axis, 0)))
            dims = new
        tie_o = last("embedding", "tie_reduce")
        if kind == "embedding" and tie_o is not None:
            for a in tie_o.axes or ():
                if a not in pipeline:
                    raise _err("PL502", f"tie_reduce over '{a}', which is not a pipeline axis", tie_o.span)
            counts = Counter(tie_o.axes or ())
            dims = [replace(d, k=counts.get(d.axis, 0)) if d.tie else d for d in dims]
            span = tie_o.span
            spans.update({d.name: tie_o.span for d in dims if d.tie})
        acc_o = last("grads", "no_accumulation_buffer")
        if acc_o is not None and acc_o.group in (None, "all", g):
            dims = [replace(d, k=0) if d.name == MICROBATCHES else d for d in dims]
            span = acc_o.span
            spans[MICROBATCHES] = acc_o.span

        if loss == "global_mean":
            norm = (tuple(tok_o.axes) if tok_o is not None else token_axes) + (MICROBATCHES,)
            div_axes: tuple[str, ...] = ()
        elif loss == "per_device_mean":
            norm = (MICROBATCHES,)
            div_axes = token_axes
        elif loss == "sum":
            norm = ()
            div_axes = ()
        else:
            norm = ()
            div_axes = token_axes + (MICROBATCHES,)
        div_o = last("grads", "divide", g) or last("grads", "divide", "all") or last("grads", "divide", None)
        div_value = div_o.by if div_o is not None else None
        if div_o is not None:
            span = div_o.span
        norm_src = div_o or loss_o or tok_o
        if norm_src is not None:
            spans[NORMALISATION] = norm_src.span
        shard_axes = tuple(
            d.axis for d in dims if d.kind == SHARDED and not d.tie
        ) + tuple(a for a in grads_sharded_g)
        if kind == "experts":
            shard_axes += folding.group_axes(plan, cls, ir.Role.EXPERT)
        dc = last("clip_norm", "double_count", g) or last("clip_norm", "double_count", "all") \
            or last("clip_norm", "double_count", None)
        clip_g = clipagg.stated(plan.overrides, g)  # a stated reduction: a sum, an average or a max
        groups.append(GroupModel(g, tuple(dims), norm, div_axes, div_value, tuple(dict.fromkeys(shard_axes)),
                                 double_count=dc is not None, span=span, spans=tuple(spans.items()),
                                 clip_axes=tuple(clip_g.axes or ()) if clip_g is not None else None,
                                 clip_span=clip_g.span if clip_g is not None else NO_SPAN,
                                 objective="sum" if loss == "sum" else "mean",
                                 undecided=heads.undecided(plan, g),
                                 replicated_params=_identity.replicated(axes, dims, par_pl, role_of)))

    par_pl, opt_pl, grads_pl = plan_pls  # the plan's own placements again, for the plan-wide facts
    all_shard = tuple(dict.fromkeys(a for g in groups for a in g.shard_axes))
    clip_o = clipagg.stated(plan.overrides, "all")
    plan_clip = tuple(clip_o.axes or ()) if clip_o else all_shard
    groups = clipagg.apply(clipagg.filters(groups, plan_clip, last), plan.overrides)
    groups = _perrank.apply(groups, plan.overrides)
    groups = _nested.apply(plan, groups)
    overflow_o = last("overflow", "reduce")
    seed_o = last("dropout_seed")
    if seed_o is None:
        seed_vary = tensor if sp else ()
    elif seed_o.verb == "same":
        seed_vary = ()
    else:
        seed_vary = tuple(seed_o.axes or ())
    parts = _parts(plan, colls)
    needed = tuple(a for a in axes if any(a in p.needed for p in parts))
    if last("params", "no_regather") is None:  # else the override is the cause, at its own line
        sources += [("regather", a, n, sp) for p in parts if p.names for a in p.needed
                    if a not in par_needed(plan) for n, sp in p.names[:1]]
    offloaded_params = par_pl.offloaded or any(m is ir.Mode.O for _, m in par_pl.modes)
    if overrides:
        no_effect(plan, tuple(g.group for g in groups), bool(needed), offloaded_params)
        filter_no_effect(plan.overrides, groups)
        check_microsteps(plan, groups)
        _partial.check_override(plan, loss)
        _nested.check_override(plan, loss)
    rg_o = last("params", "no_regather")
    gather_o = last("params", "gather")
    fetch_o = last("params", "no_fetch")
    acc_o = last("grads", "no_accumulation_buffer")
    offloaded = par_pl.offloaded or any(m is ir.Mode.O for _, m in par_pl.modes)
    axis_bindings = tuple((a, tuple(b.strategy for b in plan.bindings if a in b.axes)) for a in axes)
    unusable = tuple(dict.fromkeys(unusable_all))
    gather_counts = _gather_counts(axes, parts)
    sources += [("gather", a, n, sp) for p in parts if p.names for a, _ in p.gather_counts
                for n, sp in p.names[:1]]
    mismatch = tuple(dict.fromkeys(mismatch_all))
    eq_o = last("tokens", "equal", group=None)
    return StepModel(
        plan=plan.name,
        axes=axes,
        roles=roles,
        groups=tuple(groups),
        loss=loss,
        loss_span=(loss_o or tok_o).span if (loss_o or tok_o) else plan.span,
        clip_axes=plan_clip,
        clip_span=(clip_o or last("clip_norm", "reduce") or last("clip_norm", "average") or last("clip_norm", "max")
                   or last("clip_norm", "double_count") or last("clip_norm", "dedupe")
                   or last("clip_norm", "sqrt_before_reduce") or last("clip_norm", _perrank.VERB) or plan).span,
        overflow_axes=tuple(overflow_o.axes or ()) if overflow_o else all_shard,
        overflow_span=overflow_o.span if overflow_o else plan.span,
        seed_vary=seed_vary,
        seed_span=seed_o.span if seed_o else (_binding_span(plan, tensor[0]) if tensor else plan.span),
        tensor_axes=tensor,
        sequence_parallel=sp,
        sp_span=_binding_span(plan, tensor[0]) if tensor else plan.span,
        regather_axes=tuple(a for c in sched_refresh for a in c.axes),
        regather_needed=needed,
        regather_span=rg_o.span if rg_o else par_pl.span,
        gather_axes=tuple(a for c in sched_gathers for a in c.axes),
        gather_span=gather_o.span if gather_o else par_pl.span,
        param_modes=tuple((a, m.value) for a, m in par_pl.modes),
        offloaded=offloaded,
        fetch=fetch_o is None,
        fetch_span=fetch_o.span if fetch_o else par_pl.span,
        grads_sharded_data=tuple(a for a in data if a in sharded_data_all),
        accumulation_buffer=acc_o is None,
        accumulation_span=acc_o.span if acc_o else grads_pl.span,
        pipelined=bool(pipeline) or plan.schedule is not None,
        axis_bindings=axis_bindings,
        tied=tied,
        pipeline_axes=pipeline,
        expert_axes=_expert_axes(plan, expert),
        data_axes=data,
        context_axes=context,
        plan_span=plan.span,
        microbatch_symbol=plan.model.microbatches.name if isinstance(plan.model.microbatches, ir.Sym) else None,
        unusable_axes=unusable,
        gather_counts=gather_counts,
        optimizer_mismatch=mismatch,
        grads_split_axes=tuple(dict.fromkeys(gsplit_all)),
        grads_span=grads_pl.span,
        optimizer_span=opt_pl.span,
        params_span=(gather_o.span if gather_o else par_pl.span),
        equal_tokens=eq_o is not None,
        group_sources=tuple(dict.fromkeys(sources)),
        gather_unsharded=tuple(dict.fromkeys(a for p in parts for a in p.unsharded_gathers)),
        checkpoint=ckpt.derive(plan, groups, colls, needed, seed_vary),
        identity=_identity.model(plan, {g.group: g.replicated_params for g in groups}),
        rng=_rng.model(plan, tensor, _expert_axes(plan, expert), sp),
    )
