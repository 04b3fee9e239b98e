"""The typed view of a plan: the one interpretation every reader shares.

``view(plan)`` is the plan's ``PlanView``, built once per plan object (kept while the plan
lives) and read by the collective schedule, the costs, the checker, the measurements, the
search and the exporters:

- the role of every axis (``role``, ``axes_with_role``) and of every axis for a parameter group
  (``group_role``: parallel folding, below);
- the effective placement of a state for a group (``effective``), one per (group, state);
- the partition of the parameter groups into buffers placed alike (``buffers``);
- ``once(derivation, *args)``: any per-plan derivation of a higher layer (the collective
  schedule ``ir.collectives.schedule``, the checker's step model), computed on first use and
  then read from the view.

Parallel folding: Megatron-LM's MoE parallel folding lays the experts out on the same devices
as the dense parameters but groups them differently: expert-parallel ranks folded over the data
and context ranks, an expert tensor size of its own, and the expert-data group (data × tensor /
(ep × etp) devices) that reduces the expert gradients and shards their optimizer state. Here the
mesh axes are whole units: a group's ``role = {axis: data | tensor | expert}`` says what an axis
is for that group, the plan's binding says what it is for the rest. ``role_of`` is an axis's
role for a group; ``effective`` is a state's placement as the group sees it: on an axis whose
role the group changes, an expert or tensor role divides every model state (S) and a data role
takes the mode the plan's data axes give that state (replicated parameters, the distributed
optimizer's shards, reduced or scattered gradients).

One effective placement per (parameter group, state, axis): a ``group`` block may give a
parameter group modes of its own (``params``, ``optimizer``, ``grads``, ``placement``). Its
states are then placed as the plan places them with those modes in place (``groups.effective``),
and everything that follows from a placement — the collectives that reduce, gather and re-gather
the group's buffers, the checker's reduction counts and optimizer-step obligations, the cost of
each collective — follows from that view, exactly as it would from the same modes written at
plan level.

``class_view(plan, cls, schedule)``: a ``GroupView`` (params, optimizer and grads placements)
of one of the checker's gradient classes.
``buffers(plan)``: the plan's parameter groups partitioned by view: one part per distinct
placement, each with the plan re-placed as that part sees it (``Part.plan``). The part whose
view is the plan's own (the groups without own modes, or whose own modes restate the plan's)
is the ``rest``: its collectives carry ``without`` (the other parts' groups); every other part
carries ``groups`` (its members). A plan without own modes has one part, the plan itself.
``member_key(model, cls)``: the name a checker gradient class answers to in those payloads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from . import groups as pg
from .nodes import Mode, Placement, Plan, Role, State

MODEL_STATES = (State.PARAMS, State.OPTIMIZER, State.GRADS)


class PlanView:
    """What a plan means, computed once per plan object (``view``)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.roles: dict[str, Role | None] = {}
        for a in plan.mesh.names:
            try:
                self.roles[a] = plan.role(a)
            except KeyError:
                self.roles[a] = None
        self._memo: dict[tuple, object] = {}

    def role(self, axis: str) -> Role | None:
        """The role the plan's bindings give ``axis`` (None: an axis no binding names)."""
        return self.roles.get(axis)

    def axes_with_role(self, *roles: Role) -> tuple[str, ...]:
        """The mesh axes, in mesh order, whose role is one of ``roles``."""
        return tuple(a for a, r in self.roles.items() if r in roles)

    def group_role(self, group, axis: str) -> Role | None:
        """The role ``axis`` plays for ``group`` (a ``groups.ParamGroup``): its own, else the plan's."""
        for a, r in group.roles:
            if a == axis:
                return r
        return self.roles.get(axis)

    def once(self, derivation: Callable, *args):
        """``derivation(plan, *args)``, computed on first use and then read from the view."""
        key = (derivation, *args)
        if key not in self._memo:
            self._memo[key] = derivation(self.plan, *args)
        return self._memo[key]


_SLOT = "_view"  # where a plan keeps its view, as ``functools.cached_property`` keeps a value


def view(plan: Plan) -> PlanView:
    """The plan's view, built on the first request for this plan object and kept with it (not
    in its fields: equality, hashing, ``replace`` and pickling see the plan alone)."""
    v = plan.__dict__.get(_SLOT)
    if v is None:
        v = PlanView(plan)
        object.__setattr__(plan, _SLOT, v)
    return v


# --------------------------------------------------------------------------- parallel folding


def role_of(plan: Plan, group, axis: str) -> Role:
    """The role ``axis`` plays for ``group`` (a ``groups.ParamGroup``)."""
    return view(plan).group_role(group, axis)


def data_mode(plan: Plan, state: State) -> Mode:
    """The mode the plan's data axes give ``state`` (R without a data axis)."""
    pl = plan.placement(state)
    for a in view(plan).axes_with_role(Role.DATA):
        m = pl.mode(a)
        return Mode.R if m is Mode.M and state is not State.GRADS else m
    return Mode.R


def effective(plan: Plan, pl: Placement, group, dense_as_data: bool = False) -> Placement:
    """The plan's placement of one state with the group's roles and own modes in place (once
    per plan, state and group).

    ``dense_as_data``: a group no expert axis divides takes, on an expert axis, the mode of
    the plan's data axes (its replicas there are data-parallel replicas, so a distributed
    optimizer shards its state over them too)."""
    return view(plan).once(_effective, pl, group, dense_as_data)


def _effective(plan: Plan, pl: Placement, group, dense_as_data: bool) -> Placement:
    v = view(plan)
    modes = []
    for a, m in pl.modes:
        role = v.group_role(group, a)
        if role is not v.role(a):
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
    v = view(plan)
    return tuple(a for a in plan.mesh.names if v.group_role(group, a) is role)


# --------------------------------------------------------------------------- group views


@dataclass(frozen=True)
class GroupView:
    """The effective placements of one parameter group's three model states."""

    group: pg.ParamGroup
    params: Placement
    optimizer: Placement
    grads: Placement

    def placement(self, state: State) -> Placement:
        return {State.PARAMS: self.params, State.OPTIMIZER: self.optimizer, State.GRADS: self.grads}[state]


def class_view(plan: Plan, cls: pg.ParamGroup, schedule=()) -> GroupView:
    """The placements the checker reasons with for a gradient class: the group's roles
    (parallel folding) and own modes in place. On a plan expert axis that splits the experts
    (params ``S``/``O`` there, the group's own or the plan's) a group the axis does not divide
    is a data-parallel replica: where it gives no mode of its own, its params and optimizer
    state are placed as on the plan's data axes, and its gradient is sharded (``S``) where
    ``schedule`` (``ir.collectives.schedule``) reduce-scatters its buffer over the axis, whole
    (``R``) where it all-reduces it."""
    return view(plan).once(_class_view, cls, tuple(schedule))


def _class_view(plan: Plan, cls: pg.ParamGroup, schedule: tuple) -> GroupView:
    key = member_key(plan.model, cls)
    pls = []
    for s in MODEL_STATES:
        pl = effective(plan, plan.placement(s), cls)
        own = cls.own_modes(s)
        params = {**dict(plan.placement(State.PARAMS).modes), **cls.own_modes(State.PARAMS)}
        modes = []
        for a, m in pl.modes:
            if (not cls.expert and a not in own and view(plan).role(a) is Role.EXPERT
                    and role_of(plan, cls, a) is Role.EXPERT and params[a] in (Mode.S, Mode.O)):
                m = _replica_mode(plan, s, a, key, schedule)
            modes.append((a, m))
        pls.append(replace(pl, modes=tuple(modes)))
    return GroupView(cls, *pls)


def _replica_mode(plan: Plan, state: State, axis: str, key: str, schedule) -> Mode:
    if state is not State.GRADS:
        return data_mode(plan, state)
    scattered = any(c.kind.value == "reduce_scatter" and c.phase.value == "grad_sync" and axis in c.axes
                    and carries(c.payload, key) for c in schedule)
    return Mode.S if scattered else Mode.R


def differs(plan: Plan, group: pg.ParamGroup) -> bool:
    """Whether the group's own modes change any of its placements."""
    return any(pg.effective(plan.placement(s), group).modes != plan.placement(s).modes for s in MODEL_STATES)


def replaced(plan: Plan, group: pg.ParamGroup) -> Plan:
    """The plan with every state placed as ``group`` sees it."""
    return replace(plan, placements=tuple(pg.effective(pl, group) if pl.state in MODEL_STATES else pl
                                          for pl in plan.placements))


@dataclass(frozen=True)
class Part:
    """The plan as some parameter groups see it (groups with placements of their own)."""

    plan: Plan  # the plan re-placed as the part's groups see it
    groups: tuple[str, ...] | None  # the members (None: the rest, every group not in ``without``)
    without: tuple[str, ...] = ()


def _key(plan: Plan, g: pg.ParamGroup) -> tuple:
    return tuple(pg.effective(plan.placement(s), g).modes for s in MODEL_STATES)


def buffers(plan: Plan) -> tuple[Part, ...]:
    """The plan's parameter groups partitioned by their effective placements (once per plan)."""
    return view(plan).once(_buffers)


def _buffers(plan: Plan) -> tuple[Part, ...]:
    own = [g for g in pg.param_groups(plan.model) if g.modes and differs(plan, g)]
    if not own:
        return (Part(plan, None),)
    parts: dict[tuple, list[pg.ParamGroup]] = {}
    for g in own:
        parts.setdefault(_key(plan, g), []).append(g)
    names = {g.name for g in own}
    rest = [Part(plan, None, tuple(g.name for g in own))]
    if all(g.name in names for g in pg.param_groups(plan.model)):
        rest = []  # every group has placements of its own: no buffer of the plan's own placement
    out = rest + [Part(replaced(plan, gs[0]), tuple(g.name for g in gs)) for gs in parts.values()]
    return tuple(out)


def member_key(model, cls: pg.ParamGroup) -> str:
    """The parameter group whose modes a checker class reasons with: a user group itself, the
    built-in group a class's representative restates, or the class name (no group of its own)."""
    if cls.user:
        return cls.name
    for g in pg.param_groups(model):
        if not g.user and g.checks_as == cls.checks_as and g.restated:
            return g.name
    return cls.name


def carries(payload, key: str) -> bool:
    """Whether a collective's payload holds the buffer of the group named ``key``."""
    if getattr(payload, "groups", None) is not None:
        return key in payload.groups
    return key not in getattr(payload, "without", ())
