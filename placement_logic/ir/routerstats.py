"""The MoE load-balancing loss's routing statistics: which mesh axes split the router's tokens, which
axes a plan sums the statistics over, and the all-reduce that sums them (docs/costs.md,
"Collectives"; the checker's side is check.auxstats).

Input: an ``ir.Plan`` whose model states ``losses { aux_stats = ... }``. Output: the axes, and one
all-reduce of the E per-expert statistics (E fp32 values) per MoE layer and microbatch in forward
over the axes the plan's path gathers them over (nothing where the model states no scope, or the
path gathers over no axis). Megatron-LM's router all-reduces its tokens-per-expert count this way
(over the tensor and context group for ``aux_loss`` and ``seq_aux_loss``, with the data group for
``global_aux_loss``).
"""

from __future__ import annotations

from ..diagnostics import Code
from . import losses, views
from .buffers import Collective, Kind, Payload, Phase, link_of
from .buffers import PayloadTensor as PT
from .nodes import Role, State
from .overrides import OverrideTarget
from .walker import fold


def token_axes(plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the axes whose ranks route different tokens, those of them that split one sequence: context
    axes, and tensor axes under sequence parallelism)."""
    v = views.view(plan)
    split = v.axes_with_role(Role.CONTEXT)
    if plan.sequence_parallel or v.axes_with_role(Role.SEQUENCE):  # each tensor rank routes its slice
        split += tuple(a for a in v.axes_with_role(Role.TENSOR, Role.SEQUENCE) if a not in split)
    token = v.axes_with_role(Role.DATA) + tuple(a for a in v.axes_with_role(Role.EXPERT) if a not in split) + split
    return tuple(dict.fromkeys(token)), split


def stated(plan, verbs: tuple[str, ...] = losses.GROUP_VERBS):
    """The plan's last ``loss[aux]: stats_* over (AXES)`` statement (``probs_*`` with ``losses.PROBS_VERBS``), or None."""
    found = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb in verbs]
    return found[-1] if found else None


def problems(plan, bindings=None) -> list[tuple[str, str, object, tuple[str, ...]]]:
    """(code, message, span, notes) for each statement about the statistics that no step can read: one
    in a plan whose model states no ``aux_stats`` (PL214), an axis named twice or one whose ranks hold the
    same tokens (PL215). Resolution reports them, so every command (check, cost, ...) refuses the plan."""
    said = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb in losses.STATS_VERBS]
    if not said:
        return []
    if plan.model.aux_stats is None:
        return [(Code.STATS_SCOPE_UNSTATED, f"'loss[aux]: {said[-1].verb}' states which tokens the aux term's statistics "
                 "are gathered over, but the model states no objective for them", said[-1].span,
                 ("state it in the model: losses { aux_stats = global_batch | per_microbatch | per_sequence }",))]
    token, _ = token_axes(plan)
    out = _row_problems(plan, said)
    for o in said:
        axes = tuple(o.axes or ())
        for i, a in enumerate(axes):
            if a in axes[:i]:
                out.append((Code.STATS_AXIS, f"'loss[aux]: {o.verb}' names {a} twice", o.span, ()))
            elif a not in token:
                out.append((Code.STATS_AXIS, f"'loss[aux]: {o.verb} over ({', '.join(axes)})': the ranks of {a} hold the "
                            "same tokens, so the router's statistics do not differ over it", o.span,
                            (f"the axes that split the router's tokens here: {', '.join(token) or 'none'}",)))
    return out or _cell_problems(plan, said, bindings or {})  # PL264, PL265 once the axes are sound


def _row_problems(plan, said) -> list:
    """PL506 for ``stats_per_row`` where the model states no packed rows: a row is then one sequence, and the
    statement is ``stats_per_sequence`` (check.auxpacked)."""
    if plan.model.aux_packed is None:
        return [(Code.OVERRIDE_NO_EFFECT, f"override loss[aux]: {o.verb} changes nothing: the model states no packed "
                 f"rows (losses {{ {losses.PACKED_KEY} = true }}), so each row is one sequence and its statistics are "
                 "the sequence's", o.span, ("state 'stats_per_sequence over (AXES)', or the packing in the model",))
                for o in said if o.verb in (losses.ROW_VERB, losses.LENGTH_VERB)]
    fo, po = stated(plan), stated(plan, losses.PROBS_VERBS)
    fv = fo.verb if fo is not None else {"per_sequence": "stats_per_sequence"}.get(plan.model.aux_stats[0], "")
    pv = po.verb if po is not None else fv
    if fv.endswith("_per_sequence") or pv.endswith("_per_sequence"):  # some factor per document: cells per document
        return []
    return [(Code.OVERRIDE_NO_EFFECT, f"override loss[aux]: {o.verb} changes nothing: the path takes f and P over "
             "whole rows or more, so a row holds one group and there are no documents to weight", o.span,
             ("length weighting applies to per-document statistics (stats_per_sequence or probs_per_sequence)",))
            for o in said if o.verb == losses.LENGTH_VERB]


def gathered_cells(plan) -> tuple[str, ...]:
    """The dimensions of router calls (the token axes, and ``microbatches``) over which the path gathers f or P:
    the calls whose statistics it combines."""
    fo = stated(plan)
    f = (tuple(objective_axes(plan)) + (("microbatches",) if plan.model.aux_stats[0] == "global_batch" else ())
         if fo is None else tuple(fo.axes or ()) + (("microbatches",) if fo.verb.endswith("_per_step") else ()))
    po = stated(plan, losses.PROBS_VERBS)
    p = f if po is None else tuple(po.axes or ()) + (("microbatches",) if po.verb.endswith("_per_step") else ())
    return tuple(dict.fromkeys(f + p))


def equal_dims(o) -> tuple[str, ...]:
    """The call dimensions a statement weights equally: its axes, or the microbatches (none for other verbs)."""
    if o.verb == losses.EQUAL_WEIGHTS_VERB:
        return tuple(o.axes or ())
    return ("microbatches",) if o.verb == losses.EQUAL_MICROBATCH_VERB else ()


def _cell_problems(plan, said, bindings) -> list:
    """PL264 for equal weights over a dimension whose router calls the path does not combine; PL265 for a capacity step
    that drops nothing: capacity_factor >= experts / top_k, each a number (through the spec's ``bindings``)."""
    out = []
    for o in said:
        dims = equal_dims(o)
        lone = [d for d in dims if d not in gathered_cells(plan)] or (["no axis"] if o.axes == () else [])
        if lone and o.verb in (losses.EQUAL_WEIGHTS_VERB, losses.EQUAL_MICROBATCH_VERB):
            shown = f"{o.verb} over ({', '.join(o.axes or ())})" if o.axes is not None else o.verb
            out.append((Code.STATS_ONE_CELL, f"'loss[aux]: {shown}': the path does not gather the statistics over "
                        f"{', '.join(lone)}, so there are no router calls to weight there", o.span,
                        (f"the path gathers f or P over: {', '.join(gathered_cells(plan)) or 'no router calls'}",)))
        tf = plan.model.transformer
        nums = [getattr(tf, n, None) for n in ("capacity_factor", "experts", "top_k")] if tf is not None else []
        cf, e, k = (fold(x, bindings) for x in nums) if nums else (None, None, None)
        if o.verb == losses.CAPACITY_VERBS[0] and None not in (cf, e, k):
            if cf * k >= e:
                out.append((Code.CAPACITY_NEVER_DROPS, f"'loss[aux]: {o.verb}': capacity_factor = {cf} is at least "
                            f"experts / top_k = {e}/{k}: each expert's capacity holds every token of a router call, so "
                            "no token is dropped and the statement changes nothing", o.span,
                            ("a capacity step drops tokens where capacity_factor < experts / top_k",)))
    return out


def objective_axes(plan) -> tuple[str, ...]:
    """The mesh axes the objective's groups span (``aux_stats``)."""
    token, split = token_axes(plan)
    return token if plan.model.aux_stats[0] == "global_batch" else split


def summed_axes(plan) -> tuple[str, ...]:
    """The mesh axes the plan's path sums the statistics over (the objective's where none is stated)."""
    o = stated(plan)
    return tuple(o.axes or ()) if o is not None else objective_axes(plan)


def collectives(plan, per) -> list[Collective]:
    """The statistics' all-reduce, ``per`` times a step (the MoE layers of one stage times the
    microbatches: ``ir.collectives`` gives it), and the mean probabilities' where ``probs_*`` sums
    them over axes of their own (E fp32 values each). A plan ``problems`` refuses is not priced."""
    if plan.model.aux_stats is None or problems(plan):
        return []
    names = plan.mesh.names
    out = []
    axes = tuple(a for a in names if a in summed_axes(plan))
    if axes:
        pay = Payload(PT.ROUTER_STATS, (), "the per-expert routing statistics (E fp32 values)")
        out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, axes, link_of(plan, axes), Phase.FORWARD, per, pay,
                              "MoE aux loss: all-reduce of the routing statistics per MoE layer and microbatch in "
                              "forward"))
    probs = stated(plan, losses.PROBS_VERBS)
    paxes = tuple(a for a in names if probs is not None and a in (probs.axes or ()))
    if paxes:
        pay = Payload(PT.ROUTER_STATS, (), "the per-expert mean router probabilities (E fp32 values)")
        out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, paxes, link_of(plan, paxes), Phase.FORWARD, per, pay,
                              "MoE aux loss: all-reduce of the mean router probabilities per MoE layer and "
                              "microbatch in forward"))
    return out
