"""Process groups over part of an axis, and operations on a set of an axis's ranks other than rank 0.

Input: a plan and the step's ``GroupModel`` records. Output: the located errors of a statement the
step cannot read (``check_override``: PL181, PL182, PL183, PL506), the statements themselves and
the per-rank predicates the obligations and the replay read (``check.encode_subgroups``). No
solver here.

A subgroup of an axis is a block of B consecutive ranks: rank i of an axis of n ranks belongs to
block ⌊i / B⌋ (the last block shorter where B does not divide n), the product form of the mesh
kept, each axis cut into blocks (docs/semantics.md, "Process groups over part of an axis"):

* ``override grads[g]: reduce_blocks over (AXES) by B`` -- g's gradient reduction over each axis of
  AXES runs within blocks of B consecutive ranks (a process group per node, or groups built from
  ``ranks[k*B:(k+1)*B]``) instead of over the whole axis: each rank holds the sum over its block
  only, and where B < n the blocks hold different partial sums (``GI grads[g] blocks``).
* ``override clip_norm: reduce_blocks over (AXES) by B`` -- the grad norm's reduction over each axis
  of AXES runs within blocks of B ranks: where B < n each block's norm misses the other blocks'
  shards (``SC clip_norm``).

A set of ranks other than rank 0: ``override grads[g]: divide_except_last over (AXES) by X`` (every
rank of AXES but the last divides g's gradient by X: every pipeline stage but the last scaling again,
DeepSpeed#8152 with any number of stages) and ``divide_last_only over (AXES) by X`` (only the last
rank divides). Both are read by ``check.rankupdate`` beside the rank-0 operations (``SC update[g]``):
the ranks a divisor is applied on are a non-empty proper subset of the axes' ranks as soon as one
of them has two or more ranks.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from .clipagg import plan_norm

BLOCKS = OverrideVerb.REDUCE_BLOCKS
EXCEPT_LAST = OverrideVerb.DIVIDE_EXCEPT_LAST
LAST_ONLY = OverrideVerb.DIVIDE_LAST_ONLY
SUBSET_VERBS = (EXCEPT_LAST, LAST_ONLY)


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def head(o: ir.Override) -> str:
    text = f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb}"
    if o.axes is not None:
        text += f" over ({', '.join(o.axes)})"
    return text + (f" by {ir.show(o.by)}" if o.by is not None else "")


def applies(verb: str, coords: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Whether a divisor stated with ``verb`` over axes of ``sizes`` is applied at ``coords`` there:
    rank 0 of every axis, the last rank of every axis, or every rank but that one."""
    if verb == OverrideVerb.DIVIDE_RANK0_ONLY or verb == OverrideVerb.CLIP_RANK0_ONLY:
        return all(c == 0 for c in coords)
    last = all(c == n - 1 for c, n in zip(coords, sizes))
    return last if verb == LAST_ONLY else not last


def where(verb: str) -> str:
    """The ranks a rank-set verb applies on, for messages."""
    return {EXCEPT_LAST: "every rank but the last", LAST_ONLY: "the last rank"}.get(verb, "rank 0")


def grad_blocks(plan: ir.Plan, group: str) -> ir.Override | None:
    """The block reduction of ``group``'s gradient: its own statement, else the plan's (``all``, then none)."""
    for who in (group, "all", None):
        found = [o for o in plan.overrides if o.target == OverrideTarget.GRADS and o.verb == BLOCKS and o.group == who]
        if found:
            return found[-1]
    return None


def norm_blocks(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.CLIP_NORM and o.verb == BLOCKS),
                None)


def reduced_axes(g) -> tuple[str, ...]:
    """The axes ``g``'s gradient is reduced over in the step (derived, or stated by grads: reduce)."""
    return tuple(dict.fromkeys(d.axis for d in g.dims if d.axis is not None and d.k >= 1))


def _axes_once(o: ir.Override) -> None:
    if not o.axes:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: it names no axis", o)
    twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
    if twice is not None:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing the second time it names {twice}: an axis is "
                   "cut into blocks once", o)


def _block_size(o: ir.Override, plan: ir.Plan) -> None:
    """PL183 where B is a number that is not a positive integer; PL506 where it covers every axis it names."""
    if not isinstance(o.by, ir.Const):
        return
    b = Fraction(o.by.value)
    if b.denominator != 1 or b < 1:
        raise _err(Code.BLOCK_SIZE, f"{head(o)}: a block of ranks holds a positive whole number of ranks, not "
                   f"{ir.show(o.by)}", o)
    sizes = {a.name: a.size for a in plan.mesh.axes}
    if all(isinstance(sizes.get(a), ir.Const) and sizes[a].value <= b for a in o.axes or ()):
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: a block of {ir.show(o.by)} ranks holds the "
                   "whole of every axis it names, so the reduction is over the whole axis as derived", o)


def _divisors(plan: ir.Plan, groups) -> None:
    """PL184 where a group has two divisors on sets of ranks: together they may divide every rank once
    (the last rank and every rank but it), which the step does not add up."""
    verbs = (OverrideVerb.DIVIDE_RANK0_ONLY,) + SUBSET_VERBS + (OverrideVerb.DIVIDE_ON_RANKS,)
    for g in groups:
        stated = []
        for verb in verbs:
            for who in (g.group, "all", None):
                found = [o for o in plan.overrides if o.target == OverrideTarget.GRADS and o.verb == verb
                         and o.group == who]
                if found:
                    stated.append(found[-1])
                    break
        if len(stated) > 1:
            later = max(stated, key=lambda o: (o.span.line, o.span.column))
            raise _err(Code.RANK_SET_DIVISORS, f"{head(later)}: the {g.group} gradient has another divisor on a set of "
                       f"ranks ({', '.join(o.verb for o in stated if o is not later)}); state one per group (two may "
                       "add up to a division on every rank: state that as grads: divide by)", later)


def check_override(plan: ir.Plan, groups) -> None:
    """The located errors of the statements the step cannot read."""
    _divisors(plan, groups)
    for o in plan.overrides:
        if o.verb != BLOCKS or o.target not in (OverrideTarget.GRADS, OverrideTarget.CLIP_NORM):
            continue
        _axes_once(o)
        if o.target == OverrideTarget.GRADS:
            named = [g for g in groups if o.group in (None, "all", g.group)]
            for g in named:
                if grad_blocks(plan, g.group) is not o:
                    continue
                missing = next((a for a in o.axes if a not in reduced_axes(g)), None)
                if missing is not None:
                    raise _err(Code.BLOCKS_UNREDUCED_AXIS, f"{head(o)}: the {g.group} gradient is not reduced over "
                               f"{missing} (its reductions: ({', '.join(reduced_axes(g))})), so there is no reduction "
                               "there to run in blocks", o)
        else:
            if o.group is not None:
                raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: the norm is one all-reduce of every group's squared "
                           "norms; state its blocks without a group", o)
            axes, _ = plan_norm(plan, groups)
            for a in o.axes:
                if a not in axes:
                    raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: the grad norm is not reduced over {a} (its "
                               f"reduction: ({', '.join(axes)})), so there is no reduction there to run in blocks", o)
                if not any(a in g.shard_axes for g in groups):
                    raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: no group's gradient is sharded over {a}, so its "
                               "ranks hold the same squared norms and a reduction there is a count, not a sum of "
                               "pieces; name an axis the norm sums shards over", o)
        _block_size(o, plan)
