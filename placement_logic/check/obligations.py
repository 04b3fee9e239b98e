"""The obligation catalogue of one plan: step models in, obligations out.

Input: the plan's step model, its correct derivation and the replay context (see
``plan.PlanChecker``). Output: ``Obligation`` records, each with the z3 encoder of its
negation (``encode``) and the concrete replay of a witness (``replay``, ``replay_state``):
gradient integrity per group on the whole plan and its per-aspect explanations, state
consistency of every replicated value and of the update, and the composition rules.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import NO_SPAN, Span
from . import aspects, checkpoint_check, encode_norm, kvjoint, kvproduct, losses, replay_norm, sources, steps, undecided
from . import encode as en
from . import replay as rp
from . import replay_state as rs
from .obligation import Obligation
from .rules import GRADIENT_INTEGRITY, RULES, STATE_CONSISTENCY

ALL_GROUPS = "*"  # an explanation of every group's whole-plan gradient integrity


def _filter_notes(step: steps.StepModel) -> tuple[str, ...]:
    """The duplicate filters of the norm reduction, derived or stated, one note per filter."""
    by: dict[tuple[tuple[str, ...], bool, Span], list[str]] = {}
    for g in step.groups:
        if g.clip_filter:
            by.setdefault((g.clip_filter, g.clip_filter_stated, g.clip_filter_span), []).append(g.group)
    out = []
    for (axes, stated, span), names in by.items():
        how = ("stated" + (f" at line {span.line}" if span != NO_SPAN else "")) if stated else "derived"
        out.append(f"duplicate filter ({how}): the copies of {', '.join(names)} over ({', '.join(axes)}) counted on "
                   "one rank there in the norm")
    for g in step.groups:  # K kv heads copied over a summed axis, each copy group counted once (check.kvnorm)
        if kvproduct.several(g):
            axes = [d.axis for d in g.dims if d.part == steps.COPY_PART and d.axis in (g.clip_axes or ())
                    and d.axis not in g.clip_copies]
            if axes:
                out.append(f"duplicate filter: each kv head ({g.group}) counted on the first rank of its copy group "
                           f"(a run of ranks of {', '.join(axes)}) in the norm")
            continue
        for d in g.dims:
            if d.joint and d.part == steps.COPY_PART and d.axis in (g.clip_axes or ()) and d.axis not in g.clip_copies:
                out.append(f"duplicate filter: each of the {d.heads} kv heads ({g.group}) counted on the first rank of "
                           f"its copy group (a run of {kvjoint.copies(d)} ranks of the joint index of {kvjoint.text(d)}) "
                           "in the norm")
            elif d.part == steps.COPY_PART and d.axis in (g.clip_axes or ()) and d.axis not in g.clip_copies:
                out.append(f"duplicate filter: each of the {d.heads} kv heads ({g.group}) copied on {d.axis}/{d.heads} "
                           f"ranks counted on the first rank of its copy group in the norm")
    return tuple(out)


def _span(span: Span, fallback: Span) -> Span:
    return fallback if span == NO_SPAN else span


def _gradient_obligations(step: steps.StepModel, ctx: rp.Context, P: Span) -> list[Obligation]:
    """Each group's gradient: whole (GI grads[g]), each aspect of it, and its replicas' agreement (SC grads[g])."""
    obs: list[Obligation] = []
    for g in step.groups:
        obs.append(Obligation(
            f"GI grads[{g.group}]", GRADIENT_INTEGRITY, _span(g.span, P),
            f"the {g.group} gradient that enters every update equals the global-batch {_objective(g)} gradient: the "
            "plan's reductions, accumulation, loss weights and divisor taken together",
            lambda env, g=g: en.gi_negation(env, g, f"gi_{g.group}"),
            lambda w, g=g: rp.replay_gi(ctx, w, g, None), whole=g.group))
        for aspect in aspects.gi_aspects(g):
            h = aspects.isolate(g, aspect)
            label, checked = _gi_text(g, aspect)
            obs.append(Obligation(
                f"GI grads[{g.group}] {label}", GRADIENT_INTEGRITY, _span(g.span_of(aspect), P), checked,
                lambda env, h=h, a=aspect: en.gi_negation(env, h, f"gi_{h.group}_{_slug(a)}"),
                lambda w, h=h, a=aspect: rp.replay_gi(ctx, w, h, a), aspect_of=g.group))
    for g in step.groups:
        obs.append(Obligation(
            f"SC grads[{g.group}]", STATE_CONSISTENCY, _span(g.span, P),
            f"replicas that update the same {g.group} elements receive identical reduced gradients",
            lambda env, g=g: en.gi_replica_negation(env, g, f"sc_{g.group}"),
            lambda w: rp.replay_replica(ctx, w)))
    return obs


def obligations(step: steps.StepModel, derived: steps.StepModel, ctx: rp.Context,
                plan: ir.Plan | None = None) -> list[Obligation]:
    """``plan``: when given, a placement-caused obligation points at its source (the binding of
    the axis, or the block of the group whose own mode causes it) and names its groups."""
    obs: list[Obligation] = []
    P = step.plan_span

    def placed(span: Span, states: tuple[ir.State, ...], axis: str | None, bad, defect: bool
               ) -> tuple[Span, tuple[str, ...]]:
        if plan is None or not defect or span != NO_SPAN or axis is None:  # an override (or the placement) gave it
            return _span(span, P), ()
        src = sources.placement_source(plan, tuple(g.group for g in step.groups), states, axis, bad)
        every = len(src.groups) == len(step.groups)
        return src.span, () if every else src.groups
    obs += _gradient_obligations(step, ctx, P)
    obs.append(Obligation(
        "SC clip_norm", STATE_CONSISTENCY, _span(step.clip_span, P),
        "every device's grad norm (and so its clip coefficient) equals the global norm over all shards and "
        "stages, each parameter counted once",
        lambda env: encode_norm.norm_negation(env, "clip", False), lambda w: replay_norm.replay_norm(ctx, w, False),
        _filter_notes(step)))
    obs.append(Obligation(
        "SC overflow", STATE_CONSISTENCY, _span(step.overflow_span, P),
        "every device takes the same loss-scale overflow decision (skip or step), the global one",
        lambda env: encode_norm.norm_negation(env, "ovf", True), lambda w: replay_norm.replay_norm(ctx, w, True)))
    obs.append(Obligation(
        "SC dropout_seed", STATE_CONSISTENCY, _span(step.seed_span, P),
        "dropout seeds are identical over axes where the region is replicated and distinct where it is split",
        lambda env: en.seed_negation(env), lambda w: rs.replay_seed(ctx, w),
        () if step.tensor_axes else ("vacuous: no tensor-parallel axis",)))
    from .stepstate import state_obligations  # initial state, optimizer identity, RNG state

    obs += state_obligations(step, ctx, Obligation)
    obs += _stated_parts(step, ctx, plan, P)
    for a in step.data_axes + step.context_axes:
        where, groups = placed(step.params_span, (ir.State.PARAMS,), a,
                               lambda m: m[ir.State.PARAMS] in (ir.Mode.S, ir.Mode.O), a in step.unusable_axes)
        obs.append(Obligation(
            f"SC params usable over {a}", STATE_CONSISTENCY, where,
            f"the forward on every {a} rank uses the whole parameters: params are replicated, gathered (S*) or "
            f"fetched over {a}, never left sharded (S)" + _named(step, "usable", a),
            lambda env, a=a: en.axes_negation(env, "usable", [(a, env.sess.true() if a in step.unusable_axes
                                                                 else env.sess.false())]),
            lambda w: rs.replay_usable(ctx, w), groups=groups))
    for a, times in step.gather_counts:
        where, groups = placed(step.params_span, (ir.State.PARAMS,), a, lambda m: m[ir.State.PARAMS] is ir.Mode.S_STAR,
                               times != 1)
        obs.append(Obligation(
            f"SC params gathered over {a}", STATE_CONSISTENCY, where,
            f"params sharded-with-gather (S*) over {a} are all-gathered over {a} exactly once before each use"
            + _named(step, "gather", a),
            lambda env, a=a, times=times: en.axes_negation(
                env, "usable", [(a, env.sess.true() if times != 1 else env.sess.false())]),
            lambda w, times=times: rs.replay_usable(ctx, {**w, "times": times}), groups=groups))
    split_grads = [a for a in step.axes if a in step.grads_split_axes]
    for a in split_grads:
        where, groups = placed(step.optimizer_span, (ir.State.GRADS, ir.State.OPTIMIZER), a,
                               lambda m: m[ir.State.GRADS] in (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.M, ir.Mode.O)
                               and m[ir.State.OPTIMIZER] is ir.Mode.R, a in step.optimizer_mismatch)
        obs.append(Obligation(
            f"SC optimizer step over {a}", STATE_CONSISTENCY, where,
            f"gradients are sharded over {a}, so the optimizer state is sharded over {a} too and every rank steps "
            "exactly the elements whose reduced gradient it holds" + _named(step, "optimizer", a),
            lambda env, a=a: en.axes_negation(env, "optimizer", [(a, env.sess.true() if a in step.optimizer_mismatch
                                                                     else env.sess.false())]),
            lambda w: rs.replay_optimizer(ctx, w), groups=groups))
    missing = [a for a in step.regather_needed if a not in step.regather_axes]
    own_rg = next((a for a in missing if _source(step, "regather", a)), None)
    where, groups = placed(step.regather_span, (ir.State.PARAMS, ir.State.OPTIMIZER), missing[0] if missing else None,
                           lambda m: m[ir.State.PARAMS] is ir.Mode.R and m[ir.State.OPTIMIZER].shards, bool(missing))
    obs.append(Obligation(
        "SC params re-gather", STATE_CONSISTENCY, where,
        "after a sharded optimizer step, params replicated over an axis are all-gathered over it"
        + (_named(step, "regather", own_rg) if own_rg else ""),
        lambda env: en.axes_negation(env, "regather", [(a, env.sess.true()) for a in missing]),
        lambda w: rs.replay_regather(ctx, w),
        () if step.regather_needed else ("vacuous: no axis with replicated params and a sharded optimizer",),
        groups=groups))
    # ---------------------------------------------------------------- composition rules
    multi = [a for a, bound in step.axis_bindings if len(bound) > 1]
    obs.append(_rule("CR01", P, lambda env: en.axes_negation(env, "roles", [(a, env.sess.true()) for a in multi]),
                     lambda w: rs.replay_axis_roles(ctx, w)))
    group_spans = [g.span for g in step.groups if g.span != NO_SPAN]
    obs.append(_rule("CR02", group_spans[0] if group_spans else P, lambda env: en.typing_negation(env),
                     lambda w: rp.replay_structural(ctx, w["group"], w["sizes"], w["dim"])))
    obs[-1].aspect_of = ALL_GROUPS
    bad_gather = [a for a in step.gather_axes if a in step.gather_unsharded]
    obs.append(_rule("CR03", _span(step.gather_span, P),
                     lambda env: en.axes_negation(env, "gather", [(a, env.sess.true()) for a in bad_gather]),
                     lambda w: rs.replay_gather(ctx, w),
                     () if step.gather_axes else ("vacuous: params are gathered over no axis",)))
    obs.append(_rule("CR04", _span(step.fetch_span, P),
                     lambda env: en.flag_negation(env, "fetch", step.offloaded and not step.fetch),
                     lambda w: rs.replay_fetch(ctx, w),
                     () if step.offloaded else ("vacuous: params stay on device",)))
    sp_bad = []
    if step.sequence_parallel:
        for gname in ("norms", "biases"):
            if gname in [g.group for g in step.groups]:
                g = step.group(gname)
                sp_bad += [(gname, d.name) for d in g.dims if d.axis in step.tensor_axes and d.k != 1]
    obs.append(_rule("CR05", _span(step.sp_span, P),
                     lambda env: _sp_negation(env, step, sp_bad),
                     lambda w: (rp.replay_structural(ctx, w["group"], w["sizes"], w["dim"]) if w.get("dim") else
                                _sp_without_tp(ctx, w)),
                     () if step.sequence_parallel else ("vacuous: no sequence parallelism",)))
    acc_applies = bool(step.grads_sharded_data) and step.pipelined
    obs.append(_rule("CR06", _span(step.accumulation_span, P),
                     lambda env: en.flag_negation(env, "accumulation", not step.accumulation_buffer, needs_m=True),
                     lambda w: rp.replay_structural(ctx, "dense", w["sizes"], steps.MICROBATCHES),
                     _accumulation_notes(step, acc_applies)))
    has_experts = "experts" in [g.group for g in step.groups]
    obs.append(_rule("CR07", _span(step.group("experts").span, P) if has_experts else P, lambda env: _expert_negation(env, step),
                     lambda w: rp.replay_gi(ctx, w),
                     () if has_experts else ("vacuous: no expert parameters",)))
    tie_applies = step.tied and bool(step.pipeline_axes)
    tie_k = next((d.k for d in step.group("embedding").dims if d.tie), 1)
    obs.append(_rule("CR08", _span(step.group("embedding").span, P),
                     lambda env: en.axes_negation(env, "tie", [(a, env.sess.true() if tie_k != 1 else env.sess.false())
                                                               for a in step.pipeline_axes] if tie_applies else []),
                     lambda w: rs.replay_tie(ctx, w),
                     () if tie_applies else ("vacuous: no tied weights across pipeline stages",)))
    obs += checkpoint_check.obligations(step, ctx)  # only where the plan states a checkpoint
    if plan is not None and plan.model.loss_terms:  # loss terms besides the main loss (check.losses)
        obs += losses.obligations(plan, derived, ctx)
        from . import encode_auxstats  # the groups the aux term's routing statistics are taken over

        obs += encode_auxstats.obligations(plan, ctx)
    from . import encode_capacity  # the MoE dispatch's capacity step, where the plan states it

    obs += encode_capacity.obligations(plan, ctx)
    from . import encode_capdrop  # what the capacity step's dropped pairs add to the combine

    obs += encode_capdrop.obligations(plan, ctx)
    from . import router  # the MoE router's top-k choice, where the plan states it

    obs += router.obligations(plan, ctx)
    from . import router_bias  # the routing bias's token counts, where the plan states them

    obs += router_bias.obligations(plan, ctx)
    return undecided.apply(_extended(obs, step, ctx, plan), step, ctx.pinned)



def _stated_parts(step: steps.StepModel, ctx, plan: ir.Plan | None, P) -> list[Obligation]:
    """The obligations of the step's parts beside its gradients: whole-matrix updates, the buckets' layout, the
    activations per layer region, and where the plan states them, operations on partial activations, context
    parallelism's layouts, its sliding window and chunks, and Ulysses' head split."""
    obs: list[Obligation] = []
    if plan is not None and plan.optimizers:  # updates that need whole matrices (check.matrixwise)
        from .matrixwise import obligations as matrixwise

        obs += matrixwise(plan, ctx, Obligation)
    from .encode_buckets import obligation as bucket_layout  # the flat gradient buffers' layout per rank

    obs.append(bucket_layout(step, ctx, Obligation))
    from .actflow_obligations import act_obligations  # activations and activation gradients per layer region

    obs += act_obligations(step, ctx, Obligation)
    if plan is not None:  # operations on a region's row-parallel output before its reduction (check.actpartial)
        from .actpartial import obligations as partial_ops

        obs += partial_ops(plan, ctx, Obligation)
    if plan is not None:  # the layout of context parallelism's blocks, where the plan states one (check.encode_cplayout)
        from . import encode_cplayout as cplayout

        obs += cplayout.obligations(cplayout.model(plan, step.context_axes), ctx, P, Obligation)
        from . import encode_cpwindow as cpwindow  # the sliding window under context parallelism

        obs += cpwindow.obligations(plan, step.context_axes, ctx, P, Obligation)
        from . import encode_cpchunk as cpchunk  # chunked (local) attention under context parallelism

        obs += cpchunk.obligations(plan, step.context_axes, ctx, P, Obligation)
        from . import encode_ulysses_heads as heads  # Ulysses' uneven head split, where the plan states one

        obs += heads.obligations(heads.model(plan, ctx.bindings, step.tensor_axes), ctx, P, Obligation)
    return obs

def _extended(obs: list[Obligation], step: steps.StepModel, ctx, plan) -> list[Obligation]:
    """The obligations rewritten and extended by the passes over the whole list: the micro-step a
    sync is armed on, a pipeline schedule's rounds, a count clamped before its sum, per-rank
    operations and reductions over part of an axis."""
    from . import nested_replay, partial_replay  # rounds of a pipeline schedule; a count clamped before its sum
    from .timing import wrap  # the micro-step the gradient sync is armed on

    obs = nested_replay.wrap(partial_replay.wrap(wrap(obs, step, ctx, plan), step, ctx, plan), step, ctx, plan)
    from . import carryover  # the gradient buffer carried over from the previous optimizer step

    obs = carryover.wrap(obs, step, ctx, plan)
    from . import microupdate  # an optimizer update after every micro-step

    obs = microupdate.wrap(obs, step, ctx, plan)
    from . import rereduce  # the accumulated buffer reduced again after every micro-step

    obs = rereduce.wrap(obs, step, ctx, plan)
    from . import resummed  # the accumulating buffer summed in place after every micro-step

    obs = resummed.wrap(obs, step, ctx, plan)
    from . import mtpstage  # the embedding copy of an MTP block on a middle pipeline stage

    obs = mtpstage.wrap(obs, step, ctx, plan)
    from . import ignored  # ignored tokens counted in the normaliser

    obs = ignored.wrap(obs, step, ctx, plan)
    from . import encode_ignored_loss as ignored_loss  # ignored tokens' terms summed into the loss

    obs = ignored_loss.wrap(obs, step, ctx, plan)
    from .encode_rankupdate import extend  # a clip or a divisor on rank 0 only, the loss scale, ε on the norm

    obs = extend(obs, step, ctx, plan, Obligation)
    from . import encode_scalerstate  # the loss scaler's counters read from each rank's own flag

    obs = encode_scalerstate.extend(obs, step, ctx, plan, Obligation)
    from . import encode_amax  # the fp8 amax read from each rank's own maximum

    obs = encode_amax.extend(obs, step, ctx, plan, Obligation)
    from . import encode_amax_blocks  # per-block / per-row fp8 scales taken from each rank's own shard

    obs = encode_amax_blocks.extend(obs, step, ctx, plan, Obligation)
    from . import encode_subgroups  # a reduction over blocks of an axis's ranks

    obs = encode_subgroups.extend(obs, step, ctx, plan, Obligation)
    from . import encode_rankcount_multi as rankcount_multi  # a norm counted on a rank set over several axes at once

    obs = rankcount_multi.extend(obs, step, ctx, plan)
    from . import rank0_unsummed  # a norm counted on rank 0 of an axis it is not summed over: unknown

    return rank0_unsummed.extend(obs, step, plan)


def _slug(aspect: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in aspect)


def _objective(g: steps.GroupModel) -> str:
    return "sum-loss" if g.objective == "sum" else "mean-loss"


def _gi_text(g: steps.GroupModel, aspect: str) -> tuple[str, str]:
    """The obligation's name suffix and what it states."""
    if aspect == steps.NORMALISATION:
        return "normalisation", (
            f"with every reduction and the accumulation of the {g.group} gradient as derived, the loss weights"
            + (", token count and divisor make it the global-batch mean-loss gradient (the mean over all tokens of the step)"
               if g.objective == "mean" else " and divisor make it the global-batch sum-loss gradient (the sum over all "
               "tokens of the step, no normaliser)"))
    if aspect == steps.MICROBATCHES:
        return "over microbatches", (
            f"the {g.group} gradient of every microbatch is accumulated exactly once "
            "(every reduction over mesh axes and the normalisation as derived)")
    d = g.dim(aspect)
    if d.tie:
        return f"over {d.axis}", (
            f"the tied {g.group} gradient halves on the first and last {d.axis} stage are summed exactly once "
            "(every other reduction and the normalisation as derived)")
    if d.part == steps.COPY_PART:
        over = kvjoint.text(d) if d.joint else d.axis
        return f"over {over} copy groups", (
            f"the {g.group} gradient is split over each copy group of {over} (the {kvproduct.share(d)} ranks holding "
            "one kv head), so every partial contribution is all-reduced over its copy group exactly once "
            "(every other reduction and the normalisation as derived)")
    if d.implicit:
        what = f"summed by the all-to-all over {d.axis} and not reduced over it again"
    elif d.kind in (steps.TOKEN, steps.SPLIT):
        what = f"split over {d.axis}, so every partial contribution is all-reduced over {d.axis} exactly once"
    elif d.kind == steps.INVARIANT:
        what = f"identical on every {d.axis} rank, so it is not reduced over {d.axis}"
    elif d.joint:  # the kv heads over the joint index of several axes (kvjoint)
        over = kvjoint.text(d)
        return f"over {over}", (f"the {g.group} gradient is sharded over {over} (each copy group holds its own kv "
                                f"head), so different heads are never added over {over} (every other reduction and "
                                "the normalisation as derived)")
    else:
        what = f"sharded over {d.axis}, so different elements are never added over {d.axis}"
    return f"over {d.axis}", (f"the {g.group} gradient is {what} "
                              "(every other reduction and the normalisation as derived)")


def _rule(code: str, span: Span, encode, replay, notes: tuple[str, ...] = ()) -> Obligation:
    r = RULES[code]
    return Obligation(f"{code} {r.name}", code, span, r.description, encode, replay, notes)


def _sp_negation(env: en.Env, step: steps.StepModel, bad: list[tuple[str, str]]):
    import z3

    ctx = env.sess.ctx
    if step.sequence_parallel and not step.tensor_axes:
        return [z3.BoolVal(True, ctx)], lambda m: {"kind": "sp", "sizes": env.size_values(m), "dim": None}
    conds = [((gr, d), env.size(d) >= 2) for gr, d in bad]
    cons = [z3.Or([c for _, c in conds])] if conds else [z3.BoolVal(False, ctx)]

    def extract(model):
        from ..solver.session import value_of

        gr, d = next(key for key, c in conds if value_of(model, c))
        return {"kind": "sp", "sizes": env.size_values(model), "group": gr, "dim": d}

    return cons, extract


def _sp_without_tp(ctx: rp.Context, w: dict):
    from .report import Counterexample

    return Counterexample(ctx.sizes_tuple(w["sizes"]), (), (("tensor axes", "none"),),
                          "sequence parallel is enabled but no axis has the tensor role",
                          ("sequence parallelism splits the tensor-parallel region's sequence; without a tensor axis "
                           "it has no group to run on",), ctx.command(w["sizes"]))


def _expert_negation(env: en.Env, step: steps.StepModel):
    import z3

    if "experts" not in [g.group for g in step.groups]:
        return [z3.BoolVal(False, env.sess.ctx)], lambda m: {}
    eq = en.Env(env.sess, env.step, env.bindings, env.pinned, env.bound, True, True)
    eq.sizes, eq.side, eq.pins, eq.fixed = env.sizes, env.side, env.pins, env.fixed
    # the experts with their own divisor, and every other group over the expert axes
    # (reduced there once, as over the rest of the data group), each judged in isolation
    parts = [en.gi_negation(eq, step.group("experts"), "cr07")]
    for g in step.groups:
        if g.group == "experts":
            continue
        for d in g.dims:
            if d.axis in step.expert_axes and not d.tie:
                parts.append(en.gi_negation(eq, aspects.isolate(g, d.name), f"cr07_{g.group}_{d.name}"))
    if len(parts) == 1:
        return parts[0]
    pick = [env.sess.bool(f"cr07_part_{i}") for i in range(len(parts))]
    cons = [z3.Or(*pick)] + [z3.Implies(b, z3.And(*c)) for b, (c, _) in zip(pick, parts)]

    def extract(model):
        from ..solver.session import value_of

        i = next(i for i, b in enumerate(pick) if value_of(model, b))
        return parts[i][1](model)

    return cons, extract


def _accumulation_notes(step: steps.StepModel, applies: bool) -> tuple[str, ...]:
    if not applies:
        return ("vacuous: no gradients sharded over a data axis under pipeline accumulation",)
    axes = ", ".join(step.grads_sharded_data)
    n = "·".join(step.grads_sharded_data)
    n = n if len(step.grads_sharded_data) == 1 else f"({n})"
    return (f"cost: gradients sharded over ({axes}) with pipeline accumulation take one reduce-scatter per "
            f"microbatch (microbatches × ({n}-1)/{n}·|G| sent per device per step) unless a full-size "
            "accumulation buffer is kept",)


# --------------------------------------------------------------------------- running


def _source(step, aspect: str, axis: str):
    """(group, span) when a group's own modes cause the obligation on ``axis``, else None."""
    return next(((g, sp) for asp, a, g, sp in step.group_sources if asp == aspect and a == axis), None)


def _named(step, aspect: str, axis: str) -> str:
    src = _source(step, aspect, axis)
    return f" (group {src[0]}: its own modes)" if src else ""
