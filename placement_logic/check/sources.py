"""Where a placement-caused defect comes from: the group block or the binding, and which groups.

Input: a plan, a model state, a mesh axis and a test of modes (the modes that break the
obligation there). Output: a ``Source``: the span to point at (the ``group`` block of a
group whose own mode on that axis breaks it, else the binding of the axis, whose strategy
placed the state there) and the groups whose parameters are concerned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import ir
from ..diagnostics import NO_SPAN, Span


@dataclass(frozen=True)
class Source:
    span: Span
    groups: tuple[str, ...]  # the groups whose placement breaks the obligation ((): none found)
    own: bool  # True when a group's own mode (its block in the model) is the cause


def binding_span(plan: ir.Plan, axis: str) -> Span:
    for b in plan.bindings:
        if axis in b.axes:
            return b.span
    return plan.span


def placement_source(plan: ir.Plan, group_names: tuple[str, ...], states: tuple[ir.State, ...], axis: str,
                     bad: Callable[[dict[ir.State, ir.Mode]], bool]) -> Source:
    """Where the modes of ``states`` on ``axis`` that ``bad`` flags (given a group's modes
    there: its own where its block gives one, else the plan's) come from.

    ``group_names``: the step model's groups. When some group takes the flagged modes from
    the plan's placement, the source is the axis's binding (its strategy placed the states
    there); when only groups with their own modes there are flagged, the first one's block."""
    decls = {d.name: d for d in plan.model.groups}
    flagged, own = [], []
    for name in group_names:
        d = decls.get(name)
        own_modes = {st: m for st, m in ((st, dict(dict(d.modes).get(st, ())).get(axis)) for st in states)
                     if m is not None} if d is not None else {}
        modes = {st: own_modes.get(st, plan.placement(st).mode(axis)) for st in states}
        if bad(modes):
            flagged.append(name)
            if own_modes:
                own.append(name)
    if len(own) < len(flagged) or not flagged:
        return Source(binding_span(plan, axis), tuple(flagged), False)
    span = decls[own[0]].span
    return Source(span if span != NO_SPAN else plan.span, tuple(flagged), True)


def groups_text(groups: tuple[str, ...], every: int) -> str:
    """'group vision', 'groups dense, norms', or '' when every group is concerned."""
    if not groups or len(groups) == every:
        return ""
    return ("group " if len(groups) == 1 else "groups ") + ", ".join(groups)
