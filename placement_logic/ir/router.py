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


def stated(plan):
    """The plan's last ``router`` statement, or None."""
    said = [o for o in plan.overrides if o.target == OverrideTarget.ROUTER]
    return said[-1] if said else None


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
    for o in (o for o in plan.overrides if o.target == OverrideTarget.ROUTER):
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
    return out
