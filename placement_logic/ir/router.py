"""The plan's statement about the MoE router's top-k choice (``override router: same | vary over (AXES) |
input_partial over (AXES)``; the checker's side is check.router): which axes it can change, and what no
step can read.

The router runs, on every rank, on the tokens the rank holds. Along a tensor axis without sequence parallelism
every rank holds the same tokens (the attention's output is all-reduced to a replica before the MoE layer);
along a tensor axis under sequence parallelism each rank holds a sequence shard of its own, and along the
data, context, expert and pipeline axes the ranks hold different tokens (or, on a pipeline axis, other layers).

* ``vary`` (the jitter / gate noise drawn with a per-rank seed) differs from the single device exactly along a
  named axis whose ranks hold the same tokens (``replicated``);
* ``input_partial`` (the router reading the row-parallel linear's partial sums) differs along a named tensor axis,
  with or without sequence parallelism (a reduce-scatter's input is partial too).

The routing bias's statements (``counts_reduce over (AXES) | counts_recomputed``; check.router_bias) say how
its per-expert token counts are taken: ``token_axes`` are the axes whose ranks hold different tokens, which the
sum must cover. A statement without the model's bias, ``counts_recomputed`` (a factor the update's sign cannot
see) and one on a group change nothing (PL506); a pipeline axis summed over is PL270.

Input: an ``ir.Plan``. Output: (code, message, span, notes) for a statement that changes nothing (PL506): in a
model without experts, on a group, or naming no tensor axis (the only axes whose ranks can hold the same tokens or
a row-parallel linear's partial sums; a tensor axis under sequence parallelism is read, and proved, for ``vary``).
"""

from __future__ import annotations

from ..diagnostics import Code
from .nodes import Role
from .overrides import OverrideTarget, OverrideVerb
from .views import view
from .walker import fold

# the routing bias's statements (check.router_bias), apart from the top-k choice's
BIAS_VERBS = (OverrideVerb.COUNTS_REDUCE, OverrideVerb.COUNTS_RECOMPUTED)


def stated(plan):
    """The plan's last ``router`` statement about the top-k choice, or None."""
    said = [o for o in plan.overrides if o.target == OverrideTarget.ROUTER and o.verb not in BIAS_VERBS]
    return said[-1] if said else None


def counts_stated(plan):
    """The plan's last ``router: counts_reduce over (AXES)`` statement, or None."""
    said = [o for o in plan.overrides if o.target == OverrideTarget.ROUTER and o.verb == OverrideVerb.COUNTS_REDUCE]
    return said[-1] if said else None


def token_axes(plan) -> tuple[str, ...]:
    """The axes whose ranks hold different tokens at the router (data, context, expert, and the tensor axes
    under sequence parallelism): the axes the routing bias's counts must be summed over."""
    tensor = tensor_axes(plan) if sequence_parallel(plan) else ()
    return tuple(a for a in view(plan).axes_with_role(Role.DATA, Role.CONTEXT, Role.EXPERT, Role.TENSOR,
                                                       Role.SEQUENCE)
                 if a in tensor or a not in tensor_axes(plan))


def counts_missing(plan, o) -> tuple[str, ...]:
    """The axes whose ranks hold different tokens that the statement's sum leaves out."""
    return tuple(a for a in token_axes(plan) if a not in (o.axes or ()))


def tensor_axes(plan) -> tuple[str, ...]:
    """The axes that split the dense layers' weights (tensor, or tensor under sequence parallelism)."""
    return view(plan).axes_with_role(Role.TENSOR, Role.SEQUENCE)


def sequence_parallel(plan) -> bool:
    return bool(plan.sequence_parallel or view(plan).axes_with_role(Role.SEQUENCE))


def replicated(plan) -> tuple[str, ...]:
    """The axes whose ranks hold the same tokens at the router: the tensor axes without sequence parallelism."""
    return () if sequence_parallel(plan) else tensor_axes(plan)


def reach(plan, o) -> tuple[str, ...]:
    """The named axes along which the statement can make the routing differ from the single device's."""
    if o.verb == OverrideVerb.SAME:
        return ()
    can = replicated(plan) if o.verb == OverrideVerb.VARY else tensor_axes(plan)
    return tuple(a for a in dict.fromkeys(o.axes or ()) if a in can)


def problems(plan, bindings=None) -> list[tuple[str, str, object, tuple[str, ...]]]:
    out = []
    for o in (o for o in plan.overrides if o.target == OverrideTarget.ROUTER and o.verb not in BIAS_VERBS):
        head = f"override router{f'[{o.group}]' if o.group else ''}: {o.verb}"
        if o.axes:
            head += f" over ({', '.join(o.axes)})"
        tf = plan.model.transformer
        why = None
        if tf is None or fold(tf.experts, bindings or {}) == 1:
            why = "the model has no experts, so no router chooses any"
        elif o.group is not None:
            why = "a MoE layer has one router for every parameter group; state it without a group"
        elif o.verb != OverrideVerb.SAME and not set(o.axes or ()) & set(tensor_axes(plan)):
            why = (f"the ranks of {', '.join(o.axes or ())} hold different tokens (or layers), each routed once by the "
                   "rank that holds it, so a per-rank noise seed routes no token differently from the single device"
                   if o.verb == OverrideVerb.VARY else
                   f"no axis of {', '.join(o.axes or ())} is a tensor axis, so the router's input is the whole "
                   "activation there, not a row-parallel linear's partial sum")
        if why:
            out.append((Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: {why}", o.span,
                        ("the router's choice differs between ranks that hold the same tokens: the tensor axes "
                         f"without sequence parallelism ({', '.join(replicated(plan)) or 'none in this plan'})",)))
    return out + bias_problems(plan, bindings)


def bias_problems(plan, bindings=None) -> list[tuple[str, str, object, tuple[str, ...]]]:
    """The routing bias's statements: PL506 where one changes nothing, PL270 for a pipeline axis's counts."""
    out = []
    tf = plan.model.transformer
    pipeline = view(plan).axes_with_role(Role.PIPELINE)
    for o in (o for o in plan.overrides if o.target == OverrideTarget.ROUTER and o.verb in BIAS_VERBS):
        head = f"override router{f'[{o.group}]' if o.group else ''}: {o.verb}"
        head += f" over ({', '.join(o.axes)})" if o.axes else ""
        why = None
        if tf is None or fold(tf.experts, bindings or {}) == 1:
            why = "the model has no experts, so no router has a load-balancing bias"
        elif not tf.router_bias:
            why = ("the router has no load-balancing bias (state it in the model: transformer { router_bias = true }), "
                   "so no update reads the counts")
        elif o.group is not None:
            why = "a MoE layer has one router bias for every parameter group; state it without a group"
        elif o.verb == OverrideVerb.COUNTS_RECOMPUTED:
            why = ("the recomputed forward routes the same tokens with the same bias, so every count of every rank "
                   "is doubled alike, and the update's sign(mean - count_e) is the same for 2·count")
        if why:
            out.append((Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: {why}", o.span,
                        ("the update bias_e += u * sign(mean - count_e) reads the counts up to a common factor: what "
                         "matters is which axes whose ranks hold different tokens the sum leaves out "
                         f"({', '.join(token_axes(plan)) or 'none in this plan'})",)))
        elif set(o.axes or ()) & set(pipeline):
            axis = next(a for a in o.axes or () if a in pipeline)
            out.append((Code.ROUTER_COUNTS_PIPELINE, f"{head}: '{axis}' is a pipeline axis, whose ranks hold other "
                        "layers, each with a routing bias of its own; a sum of their counts is not modelled", o.span,
                        ("name the axes whose ranks hold different tokens of the same layers: "
                         f"{', '.join(token_axes(plan)) or 'none in this plan'}",)))
    return out
