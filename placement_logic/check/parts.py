"""The step model's view of the parameter groups' buffers (``ir.views.buffers``): for each
buffer of groups placed alike, the re-gathers its placement needs and the gathers of its S*
axes as the schedule makes them; and the obligations a group's own modes cause, reported at
the group's line."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .. import ir
from ..diagnostics import NO_SPAN, Span
from ..ir import collectives as sc
from ..ir import groups as pg
from ..ir import views


@dataclass(frozen=True)
class Part:
    """One buffer of parameter groups placed alike (``ir.views.buffers``) and what the schedule
    does to it: the re-gathers its placement needs, the gathers of its S* axes."""

    names: tuple[tuple[str, Span], ...]  # its groups with own modes and their lines (() for the rest)
    needed: tuple[str, ...]  # axes with params R and the optimizer sharded
    gather_counts: tuple[tuple[str, int], ...]  # (axis, gathers before each use) of every S* axis
    unsharded_gathers: tuple[str, ...]  # axes its params are gathered over but not sharded on


def par_needed(plan: ir.Plan) -> tuple[str, ...]:
    """Axes with params R and the optimizer sharded: the updated params are re-gathered there."""
    par, opt = plan.placement(ir.State.PARAMS), plan.placement(ir.State.OPTIMIZER)
    return tuple(a for a in plan.mesh.names if par.mode(a) is ir.Mode.R and opt.mode(a).shards)


def _replica_star(plan: ir.Plan, part: views.Part, colls) -> dict[str, int]:
    """The expert axes on which a member of the buffer the axis does not divide is a data-parallel
    replica with params S* (``ir.views.class_view``: placed as on the plan's data axes), and the
    forward gathers over each that carry that member's buffer."""
    out: dict[str, int] = {}
    par = part.plan.placement(ir.State.PARAMS)
    members = [g for g in pg.param_groups(plan.model)
               if (g.name in part.groups if part.groups is not None else g.name not in part.without)]
    for cls in members:
        cv = views.class_view(plan, cls, colls)
        key = views.member_key(plan.model, cls)
        for a in plan.mesh.names:
            if cv.params.mode(a) is ir.Mode.S_STAR and par.mode(a) is not ir.Mode.S_STAR:
                n = sum(c.axes.count(a) for c in colls if c.kind is sc.Kind.ALL_GATHER
                        and c.state is ir.State.PARAMS and c.phase is sc.Phase.FORWARD
                        and views.carries(c.payload, key))
                if out.get(a, 1) == 1:  # a member gathered other than once wins
                    out[a] = n
    return out


def parts(plan: ir.Plan, colls) -> list[Part]:
    spans = {g.name: g.span for g in pg.param_groups(plan.model)}
    out = []
    for part in views.buffers(plan):
        par = part.plan.placement(ir.State.PARAMS)
        gathers = [c for c in colls if c.kind is sc.Kind.ALL_GATHER and c.state is ir.State.PARAMS
                   and c.phase is sc.Phase.FORWARD and c.payload.groups == part.groups]
        gathered = Counter(a for c in gathers for a in c.axes)
        replica = _replica_star(plan, part, colls)
        out.append(Part(
            tuple((n, spans.get(n, NO_SPAN)) for n in part.groups or ()),
            par_needed(part.plan),
            tuple((a, gathered[a]) for a in plan.mesh.names if par.mode(a) is ir.Mode.S_STAR)
            + tuple((a, replica[a]) for a in plan.mesh.names if a in replica),
            tuple(a for c in gathers for a in c.axes if par.mode(a) not in (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O))))
    return out


def gather_counts(axes, parts: list[Part]) -> tuple[tuple[str, int], ...]:
    """(axis, gathers before each use) over the buffers: a buffer gathered other than once wins."""
    out: dict[str, int] = {}
    for p in parts:
        for a, n in p.gather_counts:
            if out.get(a, 1) == 1:
                out[a] = n
    return tuple((a, out[a]) for a in axes if a in out)


def own_sources(cls: pg.ParamGroup, found) -> list[tuple[str, str, str, Span]]:
    """The obligations (aspect, axis) a group's own modes cause, at the group's line."""
    if cls.span == NO_SPAN or not cls.modes:
        return []
    own = {a for st in views.MODEL_STATES for a in cls.own_modes(st)}
    return [(aspect, a, cls.name, cls.span) for aspect, axes in found for a in axes if a in own]
