"""The layout of the flat gradient buffers a bucketed reduction sums (DDP buckets, ZeRO and
FSDP flat parameters, Megatron-LM's distributed-optimizer buffer).

A bucketed collective sums the ranks' buffers element by element, at equal offsets: it pairs
the right elements only if every rank of its group lays the same parameters out in the same
order (with the same padding). The derived step does; ``override grads[G]: bucket_order over
(AXES)`` states that the ranks of AXES do not (rank 0 of each axis in registration order, the
others in another: parameters registered in a rank-dependent order, gradients bucketed in the
order they become ready, a tied embedding placed first on the first pipeline stage and last on
the last).

Input: an ``ir.Plan`` and its groups' ``GroupModel`` records (their gradient dimensions and
shard axes) and roles. Output: a ``BucketModel`` (plain frozen data): per group and axis where the
misalignment reaches a sum, whether the collective over that axis is a flat one (a data, context
or expert axis the group is reduced over, or a sequence-parallel axis its norms are reduced
over: every such collective is misaligned) or the tied embedding's reduction over a pipeline axis
(misaligned only after a reduce-scatter over the data axes the gradient is sharded over: the rank
owning an element's reduced shard on the first stage holds an unreduced copy on the last). The
obligation, its negation and replay are ``check.encode_buckets``. Nothing here moves bytes: a
layout changes what is summed, not how much is sent (no cost).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import OverrideTarget, OverrideVerb
from .dims import SPLIT, TOKEN


@dataclass(frozen=True)
class Misaligned:
    group: str
    axis: str
    scatter: tuple[str, ...]  # (): a flat collective over the axis; else the tie after a reduce-scatter over these
    span: Span


@dataclass(frozen=True)
class BucketModel:
    misaligned: tuple[Misaligned, ...] = ()
    span: Span | None = None  # the first bucket_order override


def _reach(g, axis: str, role_of) -> tuple[bool, tuple[str, ...], str]:
    """(reaches a sum, scatter axes, why not) for group ``g`` (a ``GroupModel``) over ``axis``."""
    dims = [d for d in g.dims if d.axis == axis and not d.part and not d.implicit]
    if any(d.tie for d in dims):
        if not any(d.k >= 1 for d in dims if d.tie):
            return False, (), f"the tied {g.group} gradient is not reduced over {axis}"
        scatter = tuple(a for a in g.shard_axes if role_of(a) is ir.Role.DATA)
        if not scatter:
            return False, (), (f"the {g.group} gradient is all-reduced whole over the data axes, so every rank holds "
                               f"every element reduced before the tie's reduction over {axis}: offsets do not matter")
        return True, scatter, ""
    if any(d.kind in (TOKEN, SPLIT) and d.k >= 1 for d in dims):
        return True, (), ""
    return False, (), f"the {g.group} gradient is not summed over {axis} by a bucketed collective"


def model(plan: ir.Plan, groups) -> BucketModel:
    """``groups``: the step's ``GroupModel`` records. An override that reaches no sum is PL506."""
    found: list[Misaligned] = []
    first = None
    for o in plan.overrides:
        if o.target != OverrideTarget.GRADS or o.verb != OverrideVerb.BUCKET_ORDER:
            continue
        head = f"override grads{f'[{o.group}]' if o.group else ''}: bucket_order over ({', '.join(o.axes or ())})"
        targets = [g for g in groups if o.group in (None, "all") or g.group == o.group]
        if not o.axes:
            raise _no_effect(f"{head} changes nothing: it names no axis", o.span)
        hits, whys = [], []
        for g in targets:
            for a in dict.fromkeys(o.axes):
                ok, scatter, why = _reach(g, a, plan.role)
                if ok:
                    hits.append(Misaligned(g.group, a, scatter, o.span))
                else:
                    whys.append(why)
        if not hits:
            raise _no_effect(f"{head} changes nothing: {whys[0] if whys else 'no group'}", o.span)
        found += hits
        first = first or o.span
    return BucketModel(tuple(dict.fromkeys(found)), first)


def _no_effect(msg: str, span: Span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, msg, span)])
