"""Well-formedness of a plan's placements and overrides, before the step model is built.

Input: an ``ir.Plan``. Output: nothing, or a located ``DiagnosticError``: params or optimizer
state placed ``M`` (PL505), an override the step cannot read (PL506). Also the axes along
which every rank's update covers whole parameters, which the optimizer-step condition reads.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir import views
from ..ir.overrides import OverrideTarget, OverrideVerb
from ..ir.welltyped import ill_typed

# params modes under which a tensor or expert axis splits the computation itself; under S* every
# rank gathers the whole weights first, under R and M it holds them whole
SPLIT_MODES = (ir.Mode.S, ir.Mode.O)
TENSOR_ROLES = (ir.Role.TENSOR, ir.Role.SEQUENCE)


def _err(code: str, msg: str, span: Span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span)])


def whole_update_axes(plan: ir.Plan) -> tuple[str, ...]:
    """Axes along which every rank's optimizer step covers whole parameters: the axes that split
    the batch (data, context), and tensor and expert axes whose params are not split (``S``/``O``)
    by the axis's own rule. Pipeline stages always split the parameters."""
    par = plan.placement(ir.State.PARAMS)
    out = []
    for a in plan.mesh.names:
        role = views.view(plan).role(a)
        if role in (ir.Role.DATA, ir.Role.CONTEXT):
            out.append(a)
        elif role in TENSOR_ROLES + (ir.Role.EXPERT,) and par.mode(a) not in SPLIT_MODES:
            out.append(a)
    return tuple(out)


def persistent_modes(plan: ir.Plan) -> None:
    """Params and optimizer state live from one step to the next: ``M`` (materialized only
    transiently) does not apply to them."""
    for state in (ir.State.PARAMS, ir.State.OPTIMIZER):
        pl = plan.placement(state)
        bad = pl.axes_with(ir.Mode.M)
        if bad:
            raise _err(Code.TRANSIENT_PERSISTENT_STATE, f"{state.value} are placed M (materialized only transiently) over "
                       f"({', '.join(bad)}), but {state.value} persist from one step to the next; M applies to "
                       "gradients and activations", pl.span if pl.span != NO_SPAN else plan.span)


def well_typed(plan: ir.Plan) -> None:
    """Placements with no meaning (``ir.welltyped``: PL136, PL137) are errors, as the resolver
    reports them; plans built without it are checked here."""
    found = ill_typed(plan, lambda s, a: next((b.span for b in plan.bindings if a in b.axes), NO_SPAN))
    if found:
        raise DiagnosticError(found)


def tied(plan: ir.Plan) -> bool:
    t = plan.model.transformer
    return bool(t.tied_embeddings) if t is not None else plan.model.tied_embeddings


def no_effect(plan: ir.Plan, groups: tuple[str, ...], needs_regather: bool, offloaded: bool) -> None:
    """Overrides the step cannot read are errors, not silent no-ops (PL506)."""
    losses = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.group is None
              and o.verb != OverrideVerb.ON_GATHERED_SEQUENCE]
    summed = bool(losses) and losses[-1].verb == OverrideVerb.SUM
    for o in plan.overrides:
        why = None
        if o.target in (OverrideTarget.LOSS, OverrideTarget.TOKENS) and o.group is not None:
            continue  # a loss term's path: check.losses reads it
        if o.target in (OverrideTarget.ACTIVATIONS, OverrideTarget.ACTIVATION_GRADS, OverrideTarget.LAYOUT,
                        OverrideTarget.HEADS):
            continue  # a layer region's collectives: check.actflow; a block layout: check.encode_cplayout; a head
            # split: check.encode_ulysses_heads
        if o.target == OverrideTarget.TOKENS and summed and o.verb != OverrideVerb.IGNORED_IN_LOSS:  # a term summed
            why = "the loss is a sum over tokens (loss: sum), so no token count normalises it"
        elif o.group not in (None, "all") and o.group not in groups and not (
                o.target == OverrideTarget.OPTIMIZER and o.verb in (
                    OverrideVerb.GATHER, OverrideVerb.ROUND_ROBIN, OverrideVerb.STEP_EVERY_MICROBATCH)):  # resolve.optimizers checks these
            why = (f"the plan has no '{o.group}' parameter group (its groups: {', '.join(groups)})")
        elif o.target == OverrideTarget.PARAMS and o.verb == OverrideVerb.NO_FETCH and not offloaded:
            why = "params stay on the device, so there is nothing to fetch"
        elif o.target == OverrideTarget.PARAMS and o.verb == OverrideVerb.NO_REGATHER and not needs_regather:
            why = "no axis has replicated params with a sharded optimizer, so nothing is re-gathered"
        elif o.target == OverrideTarget.EMBEDDING and o.verb == OverrideVerb.TIE_REDUCE and not (
                tied(plan) and views.view(plan).axes_with_role(ir.Role.PIPELINE)):  # mtp_stage: check.mtpstage
            why = "the embedding is not tied across pipeline stages (no tied embeddings or no pipeline axis)"
        elif o.target == OverrideTarget.GRADS and o.verb == OverrideVerb.REDUCE_EVERY_MICROBATCH:
            why = _every_microbatch_no_effect(plan, o)
        elif o.target == OverrideTarget.GRADS and o.verb == OverrideVerb.NO_ACCUMULATION_BUFFER:
            every = next((x for x in plan.overrides if x.target == OverrideTarget.GRADS and x.verb == OverrideVerb.REDUCE_EVERY_MICROBATCH
                          and x.group in (None, "all")), None)
            if every is not None:
                why = (f"every microbatch's gradient is reduced before the next backward (override grads: "
                       f"reduce_every_microbatch, line {every.span.line}), so no accumulation buffer is needed")
        if why:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb} changes "
                       f"nothing: {why}", o.span)


def filter_no_effect(overrides: tuple[ir.Override, ...], groups) -> None:
    """A duplicate filter (`clip_norm[g]: dedupe over (AXES)`) must count some group's copies once
    that a stated norm reduction would otherwise sum: over an axis where every group it names is
    sharded it has no copies to count (PL150); over an axis no such group's norm is summed, or where
    the derived reduction filters already, it changes nothing (PL506). ``groups``: the step's
    ``GroupModel`` records, with their norm reductions and filters."""
    for o in overrides:
        if o.target != OverrideTarget.CLIP_NORM or o.verb != OverrideVerb.DEDUPE:
            continue
        head = f"override clip_norm{f'[{o.group}]' if o.group else ''}: dedupe over ({', '.join(o.axes or ())})"
        targets = [g for g in groups if o.group in (None, "all") or g.group == o.group]
        named = o.group not in (None, "all")
        if not o.axes:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: it names no axis", o.span)
        for a in dict.fromkeys(o.axes):
            if o.axes.count(a) > 1:
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing the second time it names {a}: a filter counts each "
                           "copy once however often it is stated", o.span)
            # a group sharded over a but whose kv heads are copied there has copies too (check.kvnorm)
            copies = [g for g in targets if a not in g.shard_axes or any(d.part == "copies" and a in (d.axis, *dict(d.joint)) for d in g.dims)]
            if not copies:
                raise _err(Code.FILTER_ON_SHARDS, f"{head}: the gradient of {o.group if named else 'every group'} is sharded over "
                           f"{a}, so its pieces there are distinct values, not copies of one; a duplicate filter "
                           "applies to a group replicated on the axis", o.span)
            who = o.group if named else f"every group replicated on {a} ({', '.join(g.group for g in copies)})"
            summed = [g for g in copies if a in g.clip_axes]
            if not summed:
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: the squared norm of {who} is not summed over {a}, so "
                           f"its copies on {a} are counted once already", o.span)
            if all(not g.clip_filter_stated and (a in g.clip_filter or a in g.shard_axes) for g in summed):
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: no `clip_norm: reduce` override states the norm "
                           f"reduction of {who}, and the derived one counts its copies on {a} once already", o.span)


def _every_microbatch_no_effect(plan: ir.Plan, o: ir.Override) -> str | None:
    """Why ``override grads: reduce_every_microbatch`` changes nothing, or None: it applies to the
    whole gradient buffer, needs gradient accumulation, and must move some reduction that is
    otherwise made once per step (a gradient sharded on every reducing axis is reduce-scattered
    after every microbatch already)."""
    from dataclasses import replace

    from ..ir import collectives

    if o.group not in (None, "all"):
        return (f"the gradient buffer is reduced as one; it cannot be reduced every microbatch for "
                f"'{o.group}' alone (write override grads: reduce_every_microbatch)")
    m = plan.model.microbatches
    if isinstance(m, ir.Const) and m.value == 1:
        return "the model has one microbatch per step (microbatches = 1), so nothing is accumulated"
    without = replace(plan, overrides=tuple(x for x in plan.overrides if x is not o))
    if collectives.derive(without) == collectives.schedule(plan):
        return ("every gradient reduction of the plan is made after each microbatch already (gradients sharded "
                "S/M over each reducing axis are reduce-scattered per microbatch)")
    return None
