"""The gradient reductions of groups updated after every micro-step.

Under ``override optimizer[G]: step_every_microbatch`` every replica takes G's update m times per
step, each from the micro-step's averaged gradient (docs/semantics.md, "Optimizer updates within a
step"): a reduction the derived step makes once per step, from the accumulated buffer, runs after
every micro-step wherever its buffer holds G (DDP without ``no_sync``, ``optimizer.step()`` after
every backward). A buffer is reduced whole: the groups placed alike share it (``ir.views.buffers``),
so those of them stepped once are reduced m times beside G; a group with placements of its own moves
in a buffer of its own. Likewise a sharded optimizer's write-back (the all-gather of the updated
parameters after the step) runs after each of G's updates, of the whole buffer that holds G.
Reductions already made per micro-step keep their count.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from . import groups as pg
from . import views
from .buffers import Collective, Kind, Phase, grads_group
from .nodes import Const, State
from .optimizers import stepped_every_microbatch
from .overrides import OverrideTarget, OverrideVerb

_WHEN = {Phase.GRAD_SYNC: " (before every update: optimizer step_every_microbatch)",
         Phase.REFRESH: " (after every update: optimizer step_every_microbatch)"}


def _once_per_step(c: Collective) -> bool:
    """A gradient reduction or a write-back of updated parameters made once per step."""
    reduction = c.state is State.GRADS and c.phase is Phase.GRAD_SYNC and c.kind in (Kind.ALL_REDUCE,
                                                                                      Kind.REDUCE_SCATTER)
    write_back = c.state is State.PARAMS and c.phase is Phase.REFRESH and c.kind is Kind.ALL_GATHER
    return (reduction or write_back) and isinstance(c.count, Const) and c.count.value == 1


def per_update(plan: ir.Plan, colls: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """``colls`` with each once-per-step gradient reduction (write-back) of a buffer that holds a group stepped
    after every micro-step counted m times (once before (after) each of that group's updates)."""
    if not any(o.verb == OverrideVerb.STEP_EVERY_MICROBATCH for o in plan.overrides_for(OverrideTarget.OPTIMIZER)):
        return colls
    names = [g.name for g in pg.param_groups(plan.model)]
    out: list[Collective] = []
    for c in colls:
        if _once_per_step(c):
            own = grads_group(c.payload.tensor)
            carried = [own] if own is not None else [n for n in names if views.carries(c.payload, n)]
            if any(stepped_every_microbatch(plan, n) for n in carried):
                c = replace(c, count=plan.model.microbatches, rule=c.rule + _WHEN[c.phase])
        out.append(c)
    return tuple(out)
