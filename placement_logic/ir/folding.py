"""Parallel folding: an expert group's own roles on the mesh axes.

Megatron-LM's MoE parallel folding lays the experts out on the same devices as the dense
parameters but groups them differently: expert-parallel ranks folded over the data and
context ranks, an expert tensor size of its own, and the expert-data group (data × tensor /
(ep × etp) devices) that reduces the expert gradients and shards their optimizer state.
Here the mesh axes are whole units: a group's ``role = {axis: data | tensor | expert}``
says what an axis is for that group, the plan's binding says what it is for the rest. The
group's sizes are products of whole mesh axes, so they always multiply to the mesh.

``role_of`` is an axis's role for a group; ``effective`` is a state's placement as the group
sees it: on an axis whose role the group changes, an expert or tensor role divides every
model state (S) and a data role takes the mode the plan's data axes give that state
(replicated parameters, the distributed optimizer's shards, reduced or scattered gradients).
"""

from __future__ import annotations

from dataclasses import replace

from . import groups as pg
from .nodes import Mode, Placement, Plan, Role, State


def role_of(plan: Plan, group, axis: str) -> Role:
    """The role ``axis`` plays for ``group`` (a ``groups.ParamGroup``)."""
    own = dict(group.roles)
    return own[axis] if axis in own else plan.role(axis)


def data_mode(plan: Plan, state: State) -> Mode:
    """The mode the plan's data axes give ``state`` (R without a data axis)."""
    pl = plan.placement(state)
    for a in plan.axes_with_role(Role.DATA):
        m = pl.mode(a)
        return Mode.R if m is Mode.M and state is not State.GRADS else m
    return Mode.R


def effective(plan: Plan, pl: Placement, group, dense_as_data: bool = False) -> Placement:
    """The plan's placement of one state with the group's roles and own modes in place.

    ``dense_as_data``: a group no expert axis divides takes, on an expert axis, the mode of
    the plan's data axes (its replicas there are data-parallel replicas, so a distributed
    optimizer shards its state over them too)."""
    modes = []
    for a, m in pl.modes:
        role = role_of(plan, group, a)
        if role is not plan.role(a):
            m = Mode.S if role in (Role.EXPERT, Role.TENSOR) else data_mode(plan, pl.state)
        elif dense_as_data and role is Role.EXPERT and not group.expert:
            m = data_mode(plan, pl.state)
        modes.append((a, m))
    own = group.own_modes(pl.state)
    return replace(pl, modes=tuple((a, own.get(a, m)) for a, m in modes))


def expert_group(plan: Plan):
    """The expert group when it has roles of its own (parallel folding), else None."""
    if not any(d.name == "experts" and d.roles for d in plan.model.groups):
        return None
    return pg.class_of(plan.model, "experts")


def group_axes(plan: Plan, group, role: Role) -> tuple[str, ...]:
    """The mesh axes that play ``role`` for ``group``."""
    return tuple(a.name for a in plan.mesh.axes if role_of(plan, group, a.name) is role)


def role_getter(plan: Plan, group):
    """``role_of`` for one group, as a function of the axis."""
    own = dict(group.roles)
    return lambda axis: own[axis] if axis in own else plan.role(axis)

