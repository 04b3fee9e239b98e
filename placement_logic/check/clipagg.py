"""How a plan aggregates the squared gradient norms over an axis (docs/semantics.md, "Global
reductions"): ``clip_norm[g]: reduce over (AXES)`` sums them (the default), ``average over
(AXES)`` averages them (an all-reduce with AVG: the sum divided by the axis size), ``max over
(AXES)`` takes their maximum (right for copies, wrong for shards: the max of the pieces of a sum
is not the sum), and ``clip_norm: sqrt_before_reduce`` takes each rank's square root before the
reduction, a nonlinear operation on a value whose sum over the axis is still pending
(sqrt(a) + sqrt(b) != sqrt(a + b)): the local norm summed instead of the squared one.

Input: the plan's overrides and the step's ``GroupModel`` records. Output: the records with
their duplicate filter (``filters``: derived, or stated by ``clip_norm: dedupe over``), their
aggregation (``clip_agg``) and root-before-reduce flag (``clip_sqrt``) set. No solver here.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb

AGG_VERBS = ("reduce", "average", "max")  # a stated norm reduction and how it combines the ranks' values
AGG_OF = {"reduce": "sum", "average": "average", "max": "max"}


def stated(overrides: tuple[ir.Override, ...], group: str) -> ir.Override | None:
    """The stated norm reduction of ``group``: its own, else the plan's (``all``, then no group)."""
    for who in (group, "all", None):
        found = [o for o in overrides if o.target == OverrideTarget.CLIP_NORM and o.verb in AGG_VERBS and o.group == who]
        if found:
            return found[-1]
    return None


def apply(groups: list, overrides: tuple[ir.Override, ...]) -> list:
    """Each group's aggregation and root-before-reduce flag; ``sqrt_before_reduce`` over no
    reduction changes nothing (PL506)."""
    sq = [o for o in overrides if o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.SQRT_BEFORE_REDUCE]
    out = []
    for g in groups:
        o = stated(overrides, g.group)
        root = next((x for x in reversed(sq) if x.group in (None, "all", g.group)), None)
        out.append(replace(g, clip_agg=AGG_OF[o.verb] if o is not None else "sum", clip_sqrt=root is not None,
                           clip_span=root.span if root is not None and o is None else g.clip_span))
    for o in sq:
        hit = [g for g in out if o.group in (None, "all", g.group)]
        if hit and not any(g.clip_axes for g in hit):
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override clip_norm{f'[{o.group}]' if o.group else ''}: sqrt_before_reduce changes "
                "nothing: the norm is reduced over no axis, so every rank's root is of its whole value", o.span)])
    return out


def pending(g, sizes_ge2) -> list[str]:
    """The axes over which g's squared norm is still a partial value (distinct pieces, or copies
    counted on every rank) when a nonlinear aggregation reaches it: ``max`` over an axis g is
    sharded on; a root taken before a reduction over an axis where more than one rank contributes."""
    # an axis where g is counted on rank 0 only (perrank) has one contributor: nothing pending there
    axes = [a for a in dict.fromkeys(g.clip_axes or ()) if a not in g.clip_rank0]
    if g.clip_sqrt and g.clip_agg == "sum":  # roots of copies summed: (n·sqrt(x))² = n²·x
        return [a for a in axes if (a in g.shard_axes or a not in g.clip_filter) and sizes_ge2(a)]
    if g.clip_sqrt or g.clip_agg == "max":  # an average or a max of copies is the copy
        return [a for a in axes if a in g.shard_axes and sizes_ge2(a)]
    return []


def filters(groups: list, plan_clip: tuple[str, ...], last) -> list:
    """Each group's norm reduction and duplicate filter. A group no `clip_norm: reduce` override
    applies to takes the derived reduction (``plan_clip``, the axes some group is sharded over)
    with the filter on every axis of it the group is replicated on: its copies there are counted
    on one rank only, as Megatron-LM counts tensor-parallel duplicates and a shared embedding
    once. A stated reduction is a plain sum: a group's copies on a summed axis each count, unless
    a `clip_norm: dedupe over (...)` override states the filter."""
    out = []
    for g in groups:
        if g.clip_axes is None:
            filt = tuple(a for a in dict.fromkeys(plan_clip) if a not in g.shard_axes)
            out.append(replace(g, clip_axes=plan_clip, clip_filter=filt))
            continue
        o = last(OverrideTarget.CLIP_NORM, OverrideVerb.DEDUPE, g.group) or last(OverrideTarget.CLIP_NORM, OverrideVerb.DEDUPE, "all") \
            or last(OverrideTarget.CLIP_NORM, OverrideVerb.DEDUPE, None)
        if o is None:
            out.append(g)
            continue
        filt = tuple(a for a in dict.fromkeys(o.axes or ()) if a in g.clip_axes and a not in g.shard_axes)
        out.append(replace(g, clip_filter=filt, clip_filter_stated=True, clip_filter_span=o.span))
    return out


def plan_norm(plan: ir.Plan, groups) -> tuple[tuple[str, ...], str]:
    """The plan's norm reduction (its axes, an axis twice when stated twice) and how it combines
    the ranks' values (sum, average or max): where each rank's ε goes."""
    o = stated(plan.overrides, "all")
    if o is not None:
        return tuple(o.axes or ()), AGG_OF[o.verb]
    return tuple(dict.fromkeys(a for g in groups for a in g.shard_axes)), "sum"
