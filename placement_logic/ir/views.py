"""One effective placement per (parameter group, state, axis): the view every reader shares.

A ``group`` block may give a parameter group modes of its own (``params``, ``optimizer``,
``grads``, ``placement``). Its states are then placed as the plan places them with those
modes in place (``groups.effective``), and everything that follows from a placement — the
collectives that reduce, gather and re-gather the group's buffers, the checker's reduction
counts and optimizer-step obligations, the cost of each collective — follows from that view,
exactly as it would from the same modes written at plan level.

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

from . import folding
from . import groups as pg
from .nodes import Mode, Placement, Plan, Role, State

MODEL_STATES = (State.PARAMS, State.OPTIMIZER, State.GRADS)


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
    ``schedule`` (``ir.collectives.derive``) reduce-scatters its buffer over the axis, whole
    (``R``) where it all-reduces it."""
    key = member_key(plan.model, cls)
    pls = []
    for s in MODEL_STATES:
        pl = folding.effective(plan, plan.placement(s), cls)
        own = cls.own_modes(s)
        params = {**dict(plan.placement(State.PARAMS).modes), **cls.own_modes(State.PARAMS)}
        modes = []
        for a, m in pl.modes:
            if (not cls.expert and a not in own and plan.role(a) is Role.EXPERT
                    and folding.role_of(plan, cls, a) is Role.EXPERT and params[a] in (Mode.S, Mode.O)):
                m = _replica_mode(plan, s, a, key, schedule)
            modes.append((a, m))
        pls.append(replace(pl, modes=tuple(modes)))
    return GroupView(cls, *pls)


def _replica_mode(plan: Plan, state: State, axis: str, key: str, schedule) -> Mode:
    if state is not State.GRADS:
        return folding.data_mode(plan, state)
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
    plan: Plan  # the plan re-placed as the part's groups see it
    groups: tuple[str, ...] | None  # the members (None: the rest, every group not in ``without``)
    without: tuple[str, ...] = ()


def _key(plan: Plan, g: pg.ParamGroup) -> tuple:
    return tuple(pg.effective(plan.placement(s), g).modes for s in MODEL_STATES)


def buffers(plan: Plan) -> tuple[Part, ...]:
    """The plan's parameter groups partitioned by their effective placements."""
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
