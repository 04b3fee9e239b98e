"""Per-rank operations on the update and on the loss scale, and an epsilon on the norm's pieces.

Input: a plan and the step's ``GroupModel`` records. Output: the located errors of a statement the
step cannot read (``check_override``: PL506), and the statements themselves for the obligations
(``check.encode_rankupdate``). No solver here.

Three statements, each a departure of a real system from the derived step (docs/semantics.md,
"Per-rank operations and partial values"):

* ``override grads[g]: clip_rank0_only over (AXES)`` -- the clip coefficient max_norm / ‖grad‖ is
  applied to g's gradient on rank 0 of each axis of AXES only (the clip under ``if rank == 0``);
  the other ranks step with the unclipped gradient. ``override grads[g]: divide_rank0_only over
  (AXES) by X`` -- g's gradient divided by X on rank 0 of AXES and not on the others (a divisor
  every rank should apply that the others skip, or one too many on rank 0: a pipeline's first
  stage dividing again what the last already divided). Either way the update differs between the
  ranks of an axis with two or more ranks: the replicas of g drift apart, or g's shards are scaled
  unlike one another (``SC update[g]``).
* ``override clip_norm: eps_before_reduce by EPS`` -- each rank adds ε to its squared norm before
  the norm's all-reduce over the plan's norm axes: a sum reduction gives S + P·ε (P the ranks it
  sums) where single-device training takes S + ε once (``SC clip_norm``).
* ``override loss_scale: local over (AXES)`` -- the dynamic loss scale is updated (halved after an
  overflow, grown after a run of clean steps) from each rank's own found-inf flag, not reduced over
  AXES: over an axis where the ranks' gradients differ (sharded there) one rank halves its scale
  while the others keep theirs (``SC loss_scale``), and the next step's gradient all-reduce then
  sums pieces scaled by different factors.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import amax, clipagg, dims, normeps, rankcount, rankset
from .clipagg import plan_norm  # noqa: F401 - read by encode_rankupdate as ru.plan_norm
from .subgroups import SUBSET_VERBS

CLIP = OverrideVerb.CLIP_RANK0_ONLY
DIVIDE = OverrideVerb.DIVIDE_RANK0_ONLY
# the rank-0 operations, and a divisor on another set of an axis's ranks (check.subgroups)
# and a clip or a divisor on any set of one axis's ranks (check.rankset)
RANK0_VERBS = (CLIP, DIVIDE) + SUBSET_VERBS + rankset.VERBS
DIVIDES = (DIVIDE,) + SUBSET_VERBS + (rankset.DIVIDE,)
CLIPS = (CLIP, rankset.CLIP)
AGG_OF = clipagg.AGG_OF


def _err(msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, msg, o.span)])


def head(o: ir.Override) -> str:
    """The statement as written, for messages."""
    text = f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb}"
    if o.axes is not None:
        text += f" over ({', '.join(o.axes)})"
    return text + (f" by {ir.show(o.by)}" if o.by is not None else "")


def rank0_stated(plan: ir.Plan, group: str) -> list[ir.Override]:
    """The per-rank operations on ``group``'s update: per verb every statement of the group's own, else of the
    plan's (``all``, then no group). Several statements combine, none replaces another: a device applies a clip's
    coefficient once per clip statement naming it (check.encode_rankclips) and the product of the divisors
    naming it (check.encode_rankproduct)."""
    out = []
    for verb in RANK0_VERBS:
        for who in (group, "all", None):
            found = [o for o in plan.overrides if o.target == OverrideTarget.GRADS and o.verb == verb and o.group == who]
            if found:
                out.extend(found)
                break
    return out


def eps_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.CLIP_NORM
                 and o.verb == OverrideVerb.EPS_BEFORE_REDUCE), None)


def scale_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.LOSS_SCALE
                 and o.verb == OverrideVerb.LOCAL), None)


def growth_override(plan: ir.Plan) -> ir.Override | None:
    """``loss_scale: growth_local over (AXES)``: the scaler's counters read the rank's own flag (check.scalerstate)."""
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.LOSS_SCALE
                 and o.verb == OverrideVerb.GROWTH_LOCAL), None)


def overflow_axes(plan: ir.Plan, groups) -> tuple[str, ...]:
    o = next((x for x in reversed(plan.overrides) if x.target == OverrideTarget.OVERFLOW
              and x.verb == OverrideVerb.REDUCE), None)
    return tuple(o.axes or ()) if o is not None else tuple(dict.fromkeys(a for g in groups for a in g.shard_axes))


def scale_pending(groups, reduced: tuple[str, ...], local: tuple[str, ...]) -> list[tuple[str, str]]:
    """(group, axis) pairs over which the flag the loss scale reads is still partial: the group's
    gradient differs between the axis's ranks (sharded there) and the flag is not reduced over it
    (not in the overflow reduction, or named local)."""
    read = [a for a in reduced if a not in local]
    return [(g.group, a) for g in groups for a in g.shard_axes if a not in read]


def check_override(plan: ir.Plan, groups) -> None:
    """PL506 where a statement changes nothing (PL191, PL192: check.rankset)."""
    rankset.check_override(plan)
    rankcount.check_override(plan)
    normeps.check_override(plan, groups)  # the norm's epsilon on some ranks
    amax.check_override(plan, groups, plan.sequence_parallel or bool(plan.axes_with_role(ir.Role.SEQUENCE)))
    for o in plan.overrides:
        if o.target == OverrideTarget.GRADS and o.verb in RANK0_VERBS:
            _check_axes(o)
            if o.verb in DIVIDES and isinstance(o.by, ir.Const) and o.by.value == 1:
                raise _err(f"{head(o)} changes nothing: a division by 1 is the same on every rank", o)
    o = eps_override(plan)
    if o is not None:
        if o.group is not None:
            raise _err(f"{head(o)} changes nothing for the group alone: the epsilon is added to each rank's whole "
                       "squared norm; state it without a group", o)
        if isinstance(o.by, ir.Const) and o.by.value == 0:
            raise _err(f"{head(o)} changes nothing: the epsilon is 0", o)
        axes, _ = plan_norm(plan, groups)
        if not axes:
            raise _err(f"{head(o)} changes nothing: the norm is reduced over no axis, so each rank's norm holds its "
                       "epsilon once, as single-device training's does", o)
    for o in (scale_override(plan), growth_override(plan)):
        if o is None:
            continue
        if o.group is not None:
            raise _err(f"{head(o)} changes nothing for the group alone: the loss scale is one value per rank; state it "
                       "without a group", o)
        _check_axes(o)
        reduced = overflow_axes(plan, groups)
        for a in o.axes or ():
            if not any(_apart(g, a) for g in groups):
                raise _err(f"{head(o)} changes nothing over {a}: every rank of {a} holds the same reduced gradients, "
                           "so its own found-inf flag is the reduced one", o)
            if a not in reduced:
                raise _err(f"{head(o)} changes nothing over {a}: the found-inf flag is not all-reduced over {a} (its "
                           f"reduction: ({', '.join(reduced)})), so the loss scale reads the rank's own flag there "
                           "already", o)


def _apart(g, a: str) -> bool:
    """Whether the ranks of axis ``a`` can hold different gradients of group ``g`` at the step: sharded over
    ``a``, or summed over tokens or partial contributions along ``a`` that the plan does not reduce there."""
    return a in g.shard_axes or any(d.axis == a and d.kind in (dims.TOKEN, dims.SPLIT) and d.k == 0 for d in g.dims)


def _check_axes(o: ir.Override) -> None:
    if not o.axes:
        raise _err(f"{head(o)} changes nothing: it names no axis", o)
    twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
    if twice is not None:
        raise _err(f"{head(o)} changes nothing the second time it names {twice}: the ranks of an axis it names are "
                   "the same however often it is named", o)
