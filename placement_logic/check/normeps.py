"""The grad norm's own epsilon on some ranks: ``override clip_norm: eps_on_ranks over (AXES) ranks (R1, ...)
by EPS``.

Input: a plan and its step's groups. Output: the statement (``stated``), the located errors of one the step
cannot read (``check_override``), the norm axes its epsilon is summed over and, by hand, how many times a
device's norm holds it (``count``, for the replay). No solver call here (the z3 arm:
``check.encode_normeps``).

The named ranks of the process group over AXES (a rank's index its coordinates there, the first axis most
significant: ``check.rankset``) each add ε to their squared norm before the norm's all-reduce, as
``if rank == 0: total_norm_sq += eps`` does. The reduction sums the ranks of the plan's norm axes, so a
device's norm holds S + c·ε, c the named devices of its reduction group: the distinct named ranks that
are ranks of the group (whole numbers in [0, n)) times the sizes of the norm axes AXES does not name.
Single-device training adds ε once (S + ε): right iff c = 1 at every size, or ε = 0 (``SC clip_norm``).
``ranks (0)`` over every norm axis is right; over some of them, the other norm axes multiply it; a set
of ranks several adds it several times. AXES must be norm axes (an axis the norm is not summed over keeps
a norm per rank: PL170), the norm a sum (an average or a maximum of the ranks' norms is its own finding:
PL129), one statement (PL122 beside another or beside ``eps_before_reduce``).
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import clipagg, rankset

VERB = OverrideVerb.EPS_ON_RANKS


def stated(plan: ir.Plan) -> ir.Override | None:
    found = [o for o in plan.overrides if o.target == OverrideTarget.CLIP_NORM and o.verb == VERB]
    return found[0] if found else None


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def check_override(plan: ir.Plan, groups) -> None:
    found = [o for o in plan.overrides if o.target == OverrideTarget.CLIP_NORM
             and o.verb in (VERB, OverrideVerb.EPS_BEFORE_REDUCE)]
    o = stated(plan)
    if o is None:
        return
    head = rankset.head(o)
    if len(found) > 1:
        other = next(x for x in found if x is not o)
        raise _err(Code.BAD_OVERRIDE, f"{head}: the norm's epsilon is stated twice (override clip_norm: {other.verb} "
                   f"at line {other.span.line}); state one", other if other.span.line > o.span.line else o)
    if o.group is not None:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing for the group alone: the epsilon is added to a "
                   "rank's whole squared norm; state it without a group", o)
    if isinstance(o.by, ir.Const) and o.by.value == 0:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: the epsilon is 0", o)
    rankset.check_one(o, rankset.file_sizes(plan))
    axes, how = clipagg.plan_norm(plan, groups)
    if how != "sum":
        raise _err(Code.NOT_MODELLED, f"{head}: an epsilon on some ranks of a norm whose ranks' values are combined "
                   f"by {how} is not modelled (the {how} is its own finding); state it beside a summed norm", o)
    off = [a for a in o.axes or () if a not in axes]
    if off:
        raise _err(Code.RANK0_UNREDUCED_AXIS, f"{head}: the squared norm is not summed over ({', '.join(off)}) (its "
                   f"reduction: ({', '.join(axes) or 'none'})): each rank there keeps a norm of its own, and a rank "
                   "set over it is not one of the norm's reduction groups", o)


def norm_axes(plan: ir.Plan, groups) -> tuple[str, ...]:
    """The axes the norm is summed over, an axis twice where it is reduced twice."""
    return clipagg.plan_norm(plan, groups)[0]


def multipliers(o: ir.Override, axes: tuple[str, ...]) -> list[str]:
    """The reductions that multiply the named ranks' ε: every one over an axis AXES does not name, and every one
    after the first over an axis it does."""
    seen: set[str] = set()
    out = []
    for a in axes:
        if a in (o.axes or ()) and a not in seen:
            seen.add(a)
            continue
        out.append(a)
    return out


def count(o: ir.Override, axes: tuple[str, ...], sizes: dict, leaf) -> int:
    """How many times a device's norm holds ε (by hand): the named ranks times the other reductions' sizes."""
    n = len(rankset.applied(o, rankset.group_size(o, sizes), leaf))
    for a in multipliers(o, axes):
        n *= sizes[a]
    return n
