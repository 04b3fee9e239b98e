"""The step model: what one training step does to each value the safety conditions read.

Input: a checked ``ir.Plan``. Output: a ``StepModel`` (plain frozen data, no solver):
for every parameter group the dimensions its gradient is computed over (each classified
as token-split, split, invariant or sharded, with how many times it is reduced), the
loss normalisation and divisor, and for the plan the clip-norm, overflow, dropout-seed,
re-gather, gather and fetch behaviour. The *derived* model is what a correct system does
given the placements; ``ir.Override`` statements replace parts of it with what a real
system does. ``derive(plan, overrides=False)`` gives the reference the report compares
against.

``derive`` runs named passes over one typed input (``_Read``: the plan with its axes by role, its
collective schedule and its loss): ``_dims`` and ``_normalisation`` per group, ``_group`` for the
group's record, ``_norms`` for the clip-norm aggregation of every group, ``_seed`` for the dropout
seeds, ``_no_effect`` for the overrides that change nothing, and ``_model`` for the plan-wide facts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

from .. import ir
from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir import collectives as sc
from ..ir import groups as pg
from ..ir import heads, views
from ..ir.buffers import PayloadTensor, group_grads
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import actflow as _actflow
from . import buckets as _buckets
from . import checkpoint as ckpt
from . import clipagg
from . import gathered as _gathered
from . import identity as _identity
from . import kvjoint as _kvjoint
from . import kvnorm as _kvnorm
from . import nested as _nested
from . import partial as _partial
from . import perrank as _perrank
from . import rankupdate as _rankupdate
from . import rng as _rng
from . import subgroups as _subgroups
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
from .stepmodel import GroupModel, StepModel  # noqa: F401  (re-exported: the records every reader names)
from .wellformed import SPLIT_MODES, filter_no_effect, no_effect, persistent_modes, tied, well_typed


def _groups_present(plan: ir.Plan) -> tuple[str, ...]:
    """The gradient groups of the plan's parameter-group model (``ir.groups``), shared with costs."""
    has_experts = bool(views.view(plan).axes_with_role(ir.Role.EXPERT))
    return heads.checker_groups(plan, pg.check_groups(plan.model, has_experts))


def _expert_axes(plan: ir.Plan, expert: tuple[str, ...]) -> tuple[str, ...]:
    """The axes the experts are split over while the other groups are reduced there: the plan's
    expert axes, or under folding the experts' own expert axes over data or context devices."""
    fold = views.expert_group(plan)
    if fold is None:
        return expert
    return tuple(a for a in views.group_axes(plan, fold, ir.Role.EXPERT)
                 if views.view(plan).role(a) in (ir.Role.DATA, ir.Role.CONTEXT, ir.Role.EXPERT))


def _tied(plan: ir.Plan) -> bool:
    return tied(plan)


def _err(code: str, msg: str, span: Span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span)])


def _binding_span(plan: ir.Plan, axis: str) -> Span:
    for b in plan.bindings:
        if axis in b.axes:
            return b.span
    return plan.span


@dataclass(frozen=True, eq=False)
class _Read:
    """What every pass reads: the plan (overrides filtered), its axes by role, the collective schedule
    the cost engine prices (the same reductions and gathers) and the main loss."""

    plan: ir.Plan
    axes: tuple[str, ...]
    data: tuple[str, ...]
    context: tuple[str, ...]
    tensor: tuple[str, ...]
    pipeline: tuple[str, ...]
    expert: tuple[str, ...]
    sp: bool
    tied: bool
    colls: tuple
    loss: str
    loss_o: ir.Override | None
    tok_o: ir.Override | None

    @property
    def token_axes(self) -> tuple[str, ...]:
        return self.data + self.context + self.expert  # every axis that splits the global batch's tokens

    def last(self, target: str, verb: str | None = None, group: str | None = "*") -> ir.Override | None:
        found = None
        for o in self.plan.overrides:
            if o.target == target and (verb is None or o.verb == verb) and (group == "*" or o.group == group):
                found = o
        return found

    def group_last(self, target: str, verb: str, g: str) -> ir.Override | None:
        """The override for group g: its own, else the plan's (``all``, then no group)."""
        return self.last(target, verb, g) or self.last(target, verb, "all") or self.last(target, verb, None)


@dataclass
class _Facts:
    """Per-group facts the plan-wide model gathers, in group order."""

    unusable: list[str]
    mismatch: list[str]
    gsplit: list[str]
    sharded_data: list[str]
    sources: list[tuple[str, str, str, Span]]


GRAD_SPLIT = (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.M, ir.Mode.O)


def _read(plan: ir.Plan) -> _Read:
    """The typed input of the passes; PL501 where an override names an axis not on the mesh."""
    axes = plan.mesh.names
    for o in plan.overrides:
        for a in o.axes or ():
            if a not in axes:
                raise _err(Code.OVERRIDE_AXIS, f"override names axis '{a}', which is not on the mesh", o.span)
    loss_o = None
    for o in plan.overrides:  # loss[TERM] overrides are loss terms' paths (check.losses)
        if o.target == OverrideTarget.LOSS and o.group is None and _gathered.is_path(o):
            loss_o = o
    tok_o = None
    for o in plan.overrides:
        if o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.REDUCE and o.group is None:
            tok_o = o
    return _Read(plan, axes, views.view(plan).axes_with_role(*DATA_ROLES), views.view(plan).axes_with_role(ir.Role.CONTEXT),
                 views.view(plan).axes_with_role(*TENSOR_ROLES), views.view(plan).axes_with_role(ir.Role.PIPELINE),
                 views.view(plan).axes_with_role(ir.Role.EXPERT), plan.sequence_parallel or bool(views.view(plan).axes_with_role(ir.Role.SEQUENCE)),
                 _tied(plan), sc.schedule(plan), loss_o.verb if loss_o else "global_mean", loss_o, tok_o)


def _scheduled(r: _Read, cls: pg.ParamGroup) -> Counter:
    """How often the schedule reduces this group's gradients over each mesh axis (the
    reductions of the buffer its own placement puts it in, ``ir.views``; a reduction over each copy
    group of an axis counts as (axis, "copies"))."""
    sync = [c for c in r.colls if c.phase is sc.Phase.GRAD_SYNC and c.state is ir.State.GRADS]
    key = views.member_key(r.plan.model, cls)
    return Counter(a if c.size is None else (a, "copies") for c in sync if (
                   c.payload.tensor == group_grads(cls.name)
                   or (views.carries(c.payload, key) and (
                       c.payload.tensor == PayloadTensor.GRADS
                       or (c.payload.tensor == PayloadTensor.DENSE_GRADS and cls.checks_as != pg.GradClass.EXPERTS)
                       or (c.payload.tensor == PayloadTensor.EXPERT_GRADS and cls.checks_as == pg.GradClass.EXPERTS))))
                   for a in c.axes)


def _dims(r: _Read, g: str, cls: pg.ParamGroup, role_of, pls) -> tuple[list[GradDim], Span, dict[str, Span]]:
    """The group's gradient dimensions with the reductions the plan applies (the schedule's, or a
    `grads: reduce` override's; the tied reduction; no accumulation buffer), the span of the
    behaviour and each aspect's source."""
    plan = r.plan
    dims = axis_dims(plan, r.axes, cls, role_of, pls, _scheduled(r, cls), r.sp, r.tied)
    dims.append(GradDim(MICROBATCHES, None, TOKEN, 1, why="gradient accumulation over microbatches"))
    span = NO_SPAN
    spans = {d.name: _binding_span(plan, d.axis) for d in dims if d.axis is not None}
    own_axes = {a for st in views.MODEL_STATES for a in cls.own_modes(st)}
    if cls.span != NO_SPAN:  # a dimension on an axis the group places itself: the group's line
        spans.update({d.name: cls.span for d in dims if d.axis in own_axes})
    red = r.group_last(OverrideTarget.GRADS, OverrideVerb.REDUCE, g)
    if red is not None:
        counts = Counter(red.axes or ())
        span = red.span
        spans.update({d.name: red.span for d in dims if d.name != MICROBATCHES})
        # a tie or a part of an axis (K/V copies) is reduced by a reduction over its axis
        dims = [d if d.name == MICROBATCHES else replace(d, k=counts.get(d.axis, 0)) for d in dims]
        dims = _kvjoint.recount(dims, counts)  # copy groups crossing the tensor axes
    tie_o = r.last(OverrideTarget.EMBEDDING, OverrideVerb.TIE_REDUCE)
    if cls.checks_as == pg.GradClass.EMBEDDING and tie_o is not None:
        for a in tie_o.axes or ():
            if a not in r.pipeline:
                raise _err(Code.TIE_AXIS, f"tie_reduce over '{a}', which is not a pipeline axis", tie_o.span)
        counts = Counter(tie_o.axes or ())
        dims = [replace(d, k=counts.get(d.axis, 0)) if d.tie else d for d in dims]
        span = tie_o.span
        spans.update({d.name: tie_o.span for d in dims if d.tie})
    acc_o = r.last(OverrideTarget.GRADS, OverrideVerb.NO_ACCUMULATION_BUFFER)
    if acc_o is not None and acc_o.group in (None, "all", g):
        dims = [replace(d, k=0) if d.name == MICROBATCHES else d for d in dims]
        span = acc_o.span
        spans[MICROBATCHES] = acc_o.span
    return dims, span, spans


def _normalisation(r: _Read, g: str) -> tuple[tuple[str, ...], tuple[str, ...], ir.Override | None]:
    """(the token dims the normaliser is summed over, the divisor's axes, the divisor override); the
    axes a loss computed on the gathered sequence counts whole (check.gathered)."""
    norm, div_axes = _gathered.normalisation(r.loss, r.token_axes, r.tok_o, _gathered.axes(r.plan))
    return norm, div_axes, r.group_last(OverrideTarget.GRADS, OverrideVerb.DIVIDE, g)


def _group(r: _Read, g: str, facts: _Facts) -> GroupModel:
    """Group g's record, its per-group facts added to ``facts``."""
    plan, axes = r.plan, r.axes
    cls = pg.class_of(plan.model, g)
    # the group's effective placements (``ir.views``): its roles and own modes in place
    cv = views.class_view(plan, cls, r.colls)
    par_pl, opt_pl, grads_pl = cv.params, cv.optimizer, cv.grads
    role_of = partial(views.view(plan).group_role, cls)
    g_whole = tuple(a for a in axes if role_of(a) in (ir.Role.DATA, ir.Role.CONTEXT)
                    or (role_of(a) in TENSOR_ROLES + (ir.Role.EXPERT,) and par_pl.mode(a) not in SPLIT_MODES))
    unusable_g = [a for a in axes if role_of(a) in (ir.Role.DATA, ir.Role.CONTEXT) and par_pl.mode(a) in SPLIT_MODES]
    mismatch_g = [a for a in g_whole if grads_pl.mode(a) in GRAD_SPLIT and opt_pl.mode(a) is ir.Mode.R]
    facts.unusable += unusable_g
    facts.mismatch += mismatch_g
    facts.gsplit += [a for a in g_whole if grads_pl.mode(a) in GRAD_SPLIT]
    facts.sources += _own_sources(cls, (("optimizer", mismatch_g), ("usable", unusable_g)))
    grads_sharded_g = tuple(a for a in axes if role_of(a) in DATA_ROLES and grads_pl.mode(a) in GRAD_SPLIT)
    facts.sharded_data += [a for a in grads_sharded_g if a in r.data]
    dims, span, spans = _dims(r, g, cls, role_of, (par_pl, opt_pl))
    norm, div_axes, div_o = _normalisation(r, g)
    if div_o is not None:
        span = div_o.span
    norm_src = div_o or r.loss_o or r.tok_o
    if norm_src is not None:
        spans[NORMALISATION] = norm_src.span
    shard_axes = tuple(d.axis for d in dims if d.kind == SHARDED and not d.tie) + grads_sharded_g
    if cls.checks_as == pg.GradClass.EXPERTS:
        shard_axes += views.group_axes(plan, cls, ir.Role.EXPERT)
    dc = r.group_last(OverrideTarget.CLIP_NORM, OverrideVerb.DOUBLE_COUNT, g)
    clip_g = clipagg.stated(plan.overrides, g)  # a stated reduction: a sum, an average or a max
    return GroupModel(g, tuple(dims), norm, div_axes, div_o.by if div_o is not None else None,
                      tuple(dict.fromkeys(shard_axes)), double_count=dc is not None, span=span,
                      spans=tuple(spans.items()),
                      clip_axes=tuple(clip_g.axes or ()) if clip_g is not None else None,
                      clip_span=clip_g.span if clip_g is not None else NO_SPAN,
                      objective="sum" if r.loss == "sum" else "mean", undecided=heads.undecided(plan, g) or _kvjoint.undecided(dims),
                      replicated_params=_identity.replicated(axes, dims, par_pl, role_of))


def _norms(r: _Read, groups: list) -> tuple[list, tuple[str, ...], ir.Override | None]:
    """Every group's clip-norm reduction, filter, aggregation and rank-0 count, and its divisor
    under nested accumulation; the plan's norm axes and its stated reduction."""
    all_shard = tuple(dict.fromkeys(a for g in groups for a in g.shard_axes))
    clip_o = clipagg.stated(r.plan.overrides, "all")
    plan_clip = tuple(clip_o.axes or ()) if clip_o else all_shard
    groups = clipagg.apply(clipagg.filters(groups, plan_clip, r.last), r.plan.overrides)
    groups = _kvnorm.apply(groups, r.plan.overrides, plan_clip)
    groups = _perrank.apply(groups, r.plan.overrides)
    return _nested.apply(r.plan, groups), plan_clip, clip_o


def _seed(r: _Read) -> tuple[tuple[str, ...], ir.Override | None]:
    """The axes the dropout seed of the residual region varies over, and its override."""
    seed_o = r.last(OverrideTarget.DROPOUT_SEED)
    if seed_o is None:
        return (r.tensor if r.sp else ()), None
    return (() if seed_o.verb == OverrideVerb.SAME else tuple(seed_o.axes or ())), seed_o


def _no_effect(r: _Read, groups: list, needed: tuple[str, ...]) -> None:
    """Overrides the step cannot read are errors (PL506 and the classes' own codes)."""
    par_pl = r.plan.placement(ir.State.PARAMS)
    offloaded = par_pl.offloaded or any(m is ir.Mode.O for _, m in par_pl.modes)
    no_effect(r.plan, tuple(g.group for g in groups), bool(needed), offloaded)
    filter_no_effect(r.plan.overrides, groups)
    check_microsteps(r.plan, groups)
    _partial.check_override(r.plan, r.loss)
    _gathered.check_override(r.plan)
    from .ignored import check_override as check_ignored  # ignored tokens counted in the normaliser

    check_ignored(r.plan)
    from .encode_ignored_loss import check_override as check_ignored_terms  # ignored tokens' terms summed into the loss

    check_ignored_terms(r.plan)
    _rankupdate.check_override(r.plan, groups)
    _subgroups.check_override(r.plan, groups)
    _nested.check_override(r.plan, r.loss)


def _clip_span(r: _Read, clip_o: ir.Override | None) -> Span:
    found = clip_o
    for verb in (OverrideVerb.REDUCE, OverrideVerb.AVERAGE, OverrideVerb.MAX, OverrideVerb.DOUBLE_COUNT, OverrideVerb.DEDUPE,
                 OverrideVerb.SQRT_BEFORE_REDUCE, _perrank.VERB):
        found = found or r.last(OverrideTarget.CLIP_NORM, verb)
    return (found or r.plan).span


def derive(plan: ir.Plan, overrides: bool = True, keep: tuple[str, ...] = ()) -> StepModel:
    """The step model of ``plan``; with ``overrides=False`` the correct derivation only
    (keeping the overrides whose target is in ``keep``). Each derivation is made once per plan
    (``ir.views``): the plan restricted to its kept overrides is one object per set of overrides,
    the plan itself when there is none to drop, so a plan without overrides is derived once."""
    if not overrides:
        kept = tuple(o for o in plan.overrides if o.target in keep)
        plan = views.view(plan).once(_with_overrides, kept)
    v = views.view(plan)
    if overrides:
        v.once(_checked)
    return v.once(_stepmodel)


def _with_overrides(plan: ir.Plan, kept: tuple) -> ir.Plan:
    return plan if kept == plan.overrides else replace(plan, overrides=kept)


@dataclass(frozen=True, eq=False)
class _Groups:
    """The passes' results before the plan-wide model: the groups' records and the buffers."""

    r: _Read
    groups: list
    facts: _Facts
    parts: tuple
    needed: tuple[str, ...]
    plan_clip: tuple[str, ...]
    clip_o: ir.Override | None


def _passes(plan: ir.Plan) -> _Groups:
    persistent_modes(plan)
    well_typed(plan)
    r = _read(plan)
    facts = _Facts([], [], [], [], [])
    grads_pl = plan.placement(ir.State.GRADS)
    facts.sharded_data += [a for a in r.data if grads_pl.mode(a) in GRAD_SPLIT]
    groups = [_group(r, g, facts) for g in _groups_present(plan)]
    groups, plan_clip, clip_o = _norms(r, groups)
    parts = _parts(plan, list(r.colls))
    needed = tuple(a for a in r.axes if any(a in p.needed for p in parts))
    if r.last(OverrideTarget.PARAMS, OverrideVerb.NO_REGATHER) is None:  # else the override is the cause, at its own line
        facts.sources += [("regather", a, n, sp) for p in parts if p.names for a in p.needed
                          if a not in par_needed(plan) for n, sp in p.names[:1]]
    facts.sources += [("gather", a, n, sp) for p in parts if p.names for a, _ in p.gather_counts
                      for n, sp in p.names[:1]]
    return _Groups(r, groups, facts, tuple(parts), needed, plan_clip, clip_o)


def _checked(plan: ir.Plan) -> bool:
    """The plan's overrides are read by the step (``_no_effect``), else an error."""
    g = views.view(plan).once(_passes)
    _no_effect(g.r, g.groups, g.needed)
    return True


def _stepmodel(plan: ir.Plan) -> StepModel:
    g = views.view(plan).once(_passes)
    return _model(g.r, g.groups, g.facts, list(g.parts), g.needed, g.plan_clip, g.clip_o)


def _model(r: _Read, groups: list, facts: _Facts, parts, needed, plan_clip, clip_o) -> StepModel:
    """The plan-wide facts around the groups' records."""
    plan, last, tensor, sp = r.plan, r.last, r.tensor, r.sp
    par_pl, opt_pl, grads_pl = (plan.placement(s) for s in (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS))
    phase = {c: [x for x in r.colls if x.kind is sc.Kind.ALL_GATHER and x.state is ir.State.PARAMS and x.phase is c]
             for c in (sc.Phase.FORWARD, sc.Phase.REFRESH)}
    all_shard = tuple(dict.fromkeys(a for g in groups for a in g.shard_axes))
    overflow_o, rg_o, gather_o = last(OverrideTarget.OVERFLOW, OverrideVerb.REDUCE), last(OverrideTarget.PARAMS, OverrideVerb.NO_REGATHER), last(OverrideTarget.PARAMS, OverrideVerb.GATHER)
    fetch_o, acc_o = last(OverrideTarget.PARAMS, OverrideVerb.NO_FETCH), last(OverrideTarget.GRADS, OverrideVerb.NO_ACCUMULATION_BUFFER)
    seed_vary, seed_o = _seed(r)
    loss_o, tok_o = r.loss_o, r.tok_o
    return StepModel(
        plan=plan.name,
        axes=r.axes,
        roles=tuple((a, views.view(plan).role(a).value) for a in r.axes),
        groups=tuple(groups),
        loss=r.loss,
        loss_span=(loss_o or tok_o).span if (loss_o or tok_o) else plan.span,
        clip_axes=plan_clip,
        clip_span=_clip_span(r, clip_o),
        overflow_axes=tuple(overflow_o.axes or ()) if overflow_o else all_shard,
        overflow_span=overflow_o.span if overflow_o else plan.span,
        seed_vary=seed_vary,
        seed_span=seed_o.span if seed_o else (_binding_span(plan, tensor[0]) if tensor else plan.span),
        tensor_axes=tensor,
        sequence_parallel=sp,
        sp_span=_binding_span(plan, tensor[0]) if tensor else plan.span,
        regather_axes=tuple(a for c in phase[sc.Phase.REFRESH] for a in c.axes),
        regather_needed=needed,
        regather_span=rg_o.span if rg_o else par_pl.span,
        gather_axes=tuple(a for c in phase[sc.Phase.FORWARD] for a in c.axes),
        gather_span=gather_o.span if gather_o else par_pl.span,
        param_modes=tuple((a, m.value) for a, m in par_pl.modes),
        offloaded=par_pl.offloaded or any(m is ir.Mode.O for _, m in par_pl.modes),
        fetch=fetch_o is None,
        fetch_span=fetch_o.span if fetch_o else par_pl.span,
        grads_sharded_data=tuple(a for a in r.data if a in facts.sharded_data),
        accumulation_buffer=acc_o is None,
        accumulation_span=acc_o.span if acc_o else grads_pl.span,
        pipelined=bool(r.pipeline) or plan.schedule is not None,
        axis_bindings=tuple((a, tuple(b.strategy for b in plan.bindings if a in b.axes)) for a in r.axes),
        tied=r.tied,
        pipeline_axes=r.pipeline,
        expert_axes=_expert_axes(plan, r.expert),
        data_axes=r.data,
        context_axes=r.context,
        plan_span=plan.span,
        microbatch_symbol=plan.model.microbatches.name if isinstance(plan.model.microbatches, ir.Sym) else None,
        unusable_axes=tuple(dict.fromkeys(facts.unusable)),
        gather_counts=_gather_counts(r.axes, parts),
        optimizer_mismatch=tuple(dict.fromkeys(facts.mismatch)),
        grads_split_axes=tuple(dict.fromkeys(facts.gsplit)),
        grads_span=grads_pl.span,
        optimizer_span=opt_pl.span,
        params_span=(gather_o.span if gather_o else par_pl.span),
        equal_tokens=last(OverrideTarget.TOKENS, OverrideVerb.EQUAL, group=None) is not None,
        gathered_axes=_gathered.axes(plan),
        group_sources=tuple(dict.fromkeys(facts.sources)),
        gather_unsharded=tuple(dict.fromkeys(a for p in parts for a in p.unsharded_gathers)),
        checkpoint=ckpt.derive(plan, groups, list(r.colls), needed, seed_vary),
        identity=_identity.model(plan, {g.group: g.replicated_params for g in groups}),
        rng=_rng.model(plan, tensor, _expert_axes(plan, r.expert), sp),
        actflow=_actflow.model(plan, r.axes, tensor),
        buckets=_buckets.model(plan, groups),
    )
