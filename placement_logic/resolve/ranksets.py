"""``reduce_sets over (AXIS) ranks ([R, ...], [R, ...])`` resolved: each rank a count folded to a number, the
sets one axis's (PL269) and a partition of its ranks where the file gives its size, else of as many ranks as
they hold (PL267 overlap, PL268 a rank missing or past the axis: ``ir.ranksets.problem``)."""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..diagnostics import Code
from ..frontend import surface
from ..frontend.canonical import expr as surface_text
from ..ir import ranksets
from .shapes import number
from .values import Values


def check_clause(vals: Values, o: surface.OverrideStmt, takes_sets: bool) -> bool:
    """PL269 where rank sets are given to a verb that takes none; PL122 where reduce_sets has none."""
    if o.sets is not None and not takes_sets:
        vals.cx.error(Code.RANK_SETS_AXIS, f"'{o.target}: {o.verb}' takes no rank sets 'ranks ([R, ...], ...)' (the "
                      "process groups of a list of rank sets are reduce_sets's)", o.span)
        return False
    if takes_sets and o.sets is None:
        vals.cx.error(Code.BAD_OVERRIDE, f"'{o.target}: {o.verb}' needs 'ranks ([R, ...], [R, ...])': the rank sets of "
                      "the process groups the axis is cut into, one per new_group", o.span)
        return False
    return True


def rank_sets(vals: Values, o: surface.OverrideStmt, out: ir.Override, env: dict) -> ir.Override | None:
    """The override with its sets, each rank a whole number, or None after a located error."""
    head = (f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb} over ({', '.join(o.axes or ())}) "
            "ranks (" + ", ".join("[" + ", ".join(map(surface_text, s)) + "]" for s in o.sets) + ")")
    if len(o.axes or ()) != 1:
        vals.cx.error(Code.RANK_SETS_AXIS, f"{head}: a list of rank sets cuts one axis; name one", o.span)
        return None
    sets = tuple(tuple(vals.count(r, env, "a rank") for r in s) for s in o.sets)
    if any(r is None for s in sets for r in s):
        return None
    values = tuple(tuple(number(r, vals) for r in s) for s in sets)
    why = ranksets.problem(head, sets, values, o.axes[0], number(ir.Sym(o.axes[0]), vals))
    if why is not None:
        vals.cx.error(why[0], why[1], o.span)
        return None
    return replace(out, sets=tuple(tuple(ir.const(v) for v in s) for s in values))  # whole numbers (``problem``)
