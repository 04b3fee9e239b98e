"""Placements that mean nothing, refused before anything prices or checks them.

Two per-axis combinations have no system behind them, so neither the cost engine nor the
checker gives them a meaning of their own:

- PL136: gradients ``R`` on a tensor (or sequence) axis whose params are split there (``S``
  or ``O``). A tensor axis splits the weights; each rank computes the gradient of its own
  piece, so a replicated gradient of a split weight would be a gradient of weights the rank
  does not hold. (A group a tensor axis keeps whole, ``tensor = whole``, is not split.)
- PL137: params ``R`` or ``S*`` on a pipeline axis: every stage would hold (or gather) every
  stage's layers, while the schedule runs only its own.

``ill_typed(plan, span_of)`` gives the diagnostics, each at the line that placed the mode:
``span_of(state, axis)`` for the plan's own modes, the ``group`` line for a group's own.
"""

from __future__ import annotations

from ..diagnostics import NO_SPAN, Code, Diagnostic, Span
from . import groups as pg
from . import views
from .nodes import Mode, Plan, Role, State

TENSOR_ROLES = (Role.TENSOR, Role.SEQUENCE)
SPLIT = (Mode.S, Mode.O)


def _problems(plan: Plan, modes) -> list[tuple[str, str, State]]:
    """(code, axis, state) of each ill-typed combination in ``modes`` (state -> axis -> mode)."""
    out = []
    for a in plan.mesh.names:
        role = views.view(plan).role(a)
        if role in TENSOR_ROLES and modes[State.PARAMS][a] in SPLIT and modes[State.GRADS][a] is Mode.R:
            out.append((Code.SPLIT_WEIGHT_REPLICATED_GRADS, a, State.GRADS))
        if role is Role.PIPELINE and modes[State.PARAMS][a] in (Mode.R, Mode.S_STAR):
            out.append((Code.PIPELINE_REPLICATED_PARAMS, a, State.PARAMS))
    return out


def _message(code: str, axis: str, mode: Mode, role: Role, where: str) -> tuple[str, tuple[str, ...]]:
    if code == Code.SPLIT_WEIGHT_REPLICATED_GRADS:
        return (f"gradients R on {role.value} axis '{axis}'{where}, whose params are split there ({mode.value}): a "
                f"replicated gradient of a split weight is meaningless",
                (f"each {axis} rank computes the gradient of its own piece: place the gradients S on {axis} "
                 "(or the params R, every rank computing the whole weights)",))
    return (f"params {mode.value} on pipeline axis '{axis}'{where}: every stage would hold every stage's layers, "
            "but each runs only its own",
            (f"place params S (or O) on {axis}: each stage holds its own layers",))


def ill_typed(plan: Plan, span_of=None) -> list[Diagnostic]:
    """The plan's ill-typed placements: its own, then each parameter group's own modes."""
    def at(state: State, axis: str) -> Span:
        sp = span_of(state, axis) if span_of is not None else NO_SPAN
        if sp == NO_SPAN:
            sp = plan.placement(state).span
        return sp if sp != NO_SPAN else plan.span

    base = {s: dict(plan.placement(s).modes) for s in (State.PARAMS, State.GRADS)}
    out = []
    for code, a, st in _problems(plan, base):
        msg, notes = _message(code, a, base[State.PARAMS][a], views.view(plan).role(a), "")
        out.append(Diagnostic(code, msg, at(st, a), notes=notes))
    if out:
        return out
    for g in pg.param_groups(plan.model):
        own = {s: g.own_modes(s) for s in (State.PARAMS, State.GRADS)}
        if not any(own.values()):
            continue
        modes = {s: {**base[s], **own[s]} for s in base}
        for code, a, _st in _problems(plan, modes):
            if a not in own[State.PARAMS] and a not in own[State.GRADS]:
                continue
            if code == Code.SPLIT_WEIGHT_REPLICATED_GRADS and g.tensor == pg.WHOLE:
                continue  # the tensor axis keeps this group whole: nothing of it is split
            msg, notes = _message(code, a, modes[State.PARAMS][a], views.view(plan).role(a), f" for group '{g.name}'")
            out.append(Diagnostic(code, msg, g.span if g.span != NO_SPAN else plan.span, notes=notes))
    return out
