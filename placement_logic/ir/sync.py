"""Gradient reduction and parameter refresh under parallel folding (the expert group has
roles of its own, docs/costs.md "Parallel folding"): the non-expert parameters are reduced
over the dense data group (the data and expert axes of the plan), the experts over their own
expert-data axes. Each buffer gets its own reduce-scatter (or all-reduce) over its own group
and, under a distributed optimizer, its own all-gather of the updated parameters.
"""

from __future__ import annotations

from . import buffers as sc
from . import groups as pg
from . import views
from .nodes import Mode, Plan, Role, State

DENSE = pg.ParamGroup("dense", None)
_REDUCING = (Role.DATA, Role.CONTEXT)


def applies(plan: Plan) -> bool:
    """Whether the expert group has roles of its own (plain expert parallelism keeps one
    gradient buffer over the data axes and reduces the non-expert part over each expert axis)."""
    return views.expert_group(plan) is not None


def _has_experts(plan: Plan) -> bool:
    return any(g.expert for g in pg.param_groups(plan.model))


def _parts(plan: Plan):
    """(group, its (gradient, parameter) buffers, note) for the dense parameters and, when the model has them,
    the experts."""
    out = [(DENSE, sc.DENSE_BUFFERS, " (the non-expert parameters: data and expert axes)")]
    if _has_experts(plan):
        experts = views.expert_group(plan) or pg.class_of(plan.model, "experts")
        out.append((experts, sc.EXPERT_BUFFERS, " (the experts: their expert-data axes)"))
    return out


def _reducing(plan: Plan, group, par) -> list[str]:
    """The axes over which the group's gradient contributions differ: its data and context
    axes; for the dense parameters the expert axes too; for the experts an expert axis that
    does not split them."""
    out = []
    for a in plan.mesh.names:
        role = views.role_of(plan, group, a)
        if role in _REDUCING or (role is Role.EXPERT and (not group.expert or par.mode(a) not in (Mode.S, Mode.O))):
            out.append(a)
    return out


def grad_sync(plan: Plan, per_mb) -> list[sc.Collective]:
    g, opt, th = (plan.placement(s) for s in (State.GRADS, State.OPTIMIZER, State.PARAMS))
    out: list[sc.Collective] = []
    for group, (grads, _), note in _parts(plan):
        eg, eo, ep = (views.effective(plan, pl, group, dense_as_data=True) for pl in (g, opt, th))
        sharded = tuple(a for a, m in eg.modes if m in (Mode.S, Mode.S_STAR, Mode.O))
        out += sc.reduce_buffer(plan, _reducing(plan, group, ep), eg, eo, sharded, per_mb, grads, note)
    return out


def refresh(plan: Plan) -> list[sc.Collective]:
    th, opt = plan.placement(State.PARAMS), plan.placement(State.OPTIMIZER)
    out: list[sc.Collective] = []
    for group, (_, params), note in _parts(plan):
        ep, eo = (views.effective(plan, pl, group, dense_as_data=True) for pl in (th, opt))
        axes = tuple(a for a in plan.mesh.names if ep.mode(a) is Mode.R and eo.mode(a).shards)
        if not axes:
            continue
        rest = ep.axes_with(Mode.S, Mode.S_STAR, Mode.O)
        out.append(sc.Collective(
            sc.Kind.ALL_GATHER, State.PARAMS, axes, sc.link_of(plan, axes), sc.Phase.REFRESH, sc.ONE,
            sc.Payload(params, rest, "updated parameters"),
            "params R with optimizer S: all-gather the updated parameters after the step" + note))
    return out


def replica_gathers(plan: Plan, star: tuple[str, ...], per_unit) -> list[sc.Collective]:
    """ZeRO-3 on the data axes beside an expert axis that splits the experts: there the
    non-expert parameters are data-parallel replicas placed as on the data axes (S*,
    ``views.class_view``), so they are all-gathered over the expert axis too, after the data
    axes' gather (and again before backward when freed after forward)."""
    th = plan.placement(State.PARAMS)
    if applies(plan) or views.data_mode(plan, State.PARAMS) is not Mode.S_STAR:
        return []
    out = []
    for e in plan.groups_with_role(Role.EXPERT):  # a product binding's axes: one group
        if any(a in star or th.mode(a) not in (Mode.S, Mode.O) for a in e):
            continue
        rest = tuple(a for a in th.axes_with(Mode.S, Mode.S_STAR, Mode.O) if a not in star and a not in e)
        pay = sc.Payload(sc.PayloadTensor.DENSE_PARAMS, rest, f"non-expert parameters, one {th.unit} at a time")
        phases = (sc.Phase.FORWARD, sc.Phase.BACKWARD) if th.reshard_after_forward else (sc.Phase.FORWARD,)
        out += [sc.Collective(sc.Kind.ALL_GATHER, State.PARAMS, e, sc.link_of(plan, e), ph, per_unit, pay,
                           "non-expert params S* on an expert axis (data-parallel replicas there): all-gather "
                           + ("before forward" if ph is sc.Phase.FORWARD else "again before backward"))
                for ph in phases]
    return out
