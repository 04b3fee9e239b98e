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

from . import losses, views
from .buffers import Collective, Kind, Payload, Phase, link_of
from .buffers import PayloadTensor as PT
from .nodes import Role, State
from .overrides import OverrideTarget


def token_axes(plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the axes whose ranks route different tokens, those of them that split one sequence: context
    axes, and tensor axes under sequence parallelism)."""
    v = views.view(plan)
    split = v.axes_with_role(Role.CONTEXT)
    if plan.sequence_parallel or v.axes_with_role(Role.SEQUENCE):  # each tensor rank routes its slice
        split += tuple(a for a in v.axes_with_role(Role.TENSOR, Role.SEQUENCE) if a not in split)
    token = v.axes_with_role(Role.DATA) + tuple(a for a in v.axes_with_role(Role.EXPERT) if a not in split) + split
    return tuple(dict.fromkeys(token)), split


def stated(plan):
    """The plan's last ``loss[aux]: stats_* over (AXES)`` statement, or None."""
    found = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb in losses.STATS_VERBS]
    return found[-1] if found else None


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
    microbatches: ``ir.collectives`` gives it)."""
    if plan.model.aux_stats is None:
        return []
    names = plan.mesh.names
    axes = tuple(a for a in names if a in summed_axes(plan))
    if not axes:
        return []
    pay = Payload(PT.ROUTER_STATS, (), "the per-expert routing statistics (E fp32 values)")
    return [Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, axes, link_of(plan, axes), Phase.FORWARD, per, pay,
                       "MoE aux loss: all-reduce of the routing statistics per MoE layer and microbatch in forward")]
