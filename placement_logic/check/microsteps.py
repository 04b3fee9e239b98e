"""The micro-step the gradient synchronisation is armed on, as the step model reads it.

Input: an ``ir.Plan`` and its groups (``GroupModel``). Output: whether ``override grads:
sync_before_last`` is present, the axes over which each group's replicated gradient is summed by
the once-per-step reduction it moves (``early_axes``), and PL506 where it affects nothing
(``check_override``). The obligations it breaks are wrapped in ``timing``.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import collectives as sc
from ..ir import groups as pg
from ..ir import views
from ..ir.overrides import OverrideTarget, OverrideVerb
from .dims import TOKEN

VERB = "sync_before_last"


def early_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in plan.overrides if o.target == OverrideTarget.GRADS and o.verb == VERB), None)


def early_axes(plan: ir.Plan, g) -> tuple[str, ...]:
    """The axes the once-per-step reduction sums the group's gradient over where the gradient is
    replicated (its effective grads mode R, ``ir.views``: not reduce-scattered per micro-step)."""
    grads = views.class_view(plan, pg.class_of(plan.model, g.group), sc.schedule(plan)).grads
    return tuple(d.axis for d in g.dims if d.kind == TOKEN and d.axis is not None and d.k >= 1
                 and not d.implicit and grads.mode(d.axis) is ir.Mode.R)


def check_override(plan: ir.Plan, groups) -> None:
    """PL506 where ``sync_before_last`` changes nothing."""
    o = early_override(plan)
    if o is None:
        return
    why = None
    every = next((x for x in plan.overrides if x.target == OverrideTarget.GRADS and x.verb == OverrideVerb.REDUCE_EVERY_MICROBATCH), None)
    m = plan.model.microbatches
    if o.group not in (None, "all"):
        why = (f"the gradient buffer is synchronised as one; the sync cannot be armed early for '{o.group}' alone "
               f"(write override grads: {VERB})")
    elif isinstance(m, ir.Const) and m.value == 1:
        why = "the model has one microbatch per step (microbatches = 1), so the first micro-step is the last"
    elif every is not None:
        why = (f"the buffer is reduced after every micro-step (override grads: reduce_every_microbatch, line "
               f"{every.span.line}), so no micro-step runs under no_sync")
    elif not any(early_axes(plan, g) for g in groups):
        why = "no gradient is all-reduced once per step over an axis (every reduced gradient is sharded there)"
    if why:
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"override grads: {VERB} changes nothing: {why}", o.span)])
