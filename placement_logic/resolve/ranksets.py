"""``reduce_sets over (AXIS) ranks ([R, ...], [R, ...])`` resolved: each rank a count folded to a number, the
sets a partition of the axis's ranks where the file gives its size, else of as many ranks as they hold (PL267
overlap, PL268 a rank missing or past the axis: ``ir.ranksets.problem``). Over several axes (``over (A, B)``)
the sets partition the flattened ranks of their product, row-major, each size a number (PL269 otherwise, and
for an axis named twice)."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

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
    axes = tuple(o.axes or ())
    size = _size(vals, o, axes, head)
    if size is False:
        return None
    sets = tuple(tuple(vals.count(r, env, "a rank") for r in s) for s in o.sets)
    if any(r is None for s in sets for r in s):
        return None
    values = tuple(tuple(number(r, vals) for r in s) for s in sets)
    label = axes[0] if len(axes) == 1 else f"({', '.join(axes)}) flattened"
    why = ranksets.problem(head, sets, values, label, size)
    if why is not None:
        vals.cx.error(why[0], why[1], o.span)
        return None
    return replace(out, sets=tuple(tuple(ir.const(v) for v in s) for s in values))  # whole numbers (``problem``)


def _size(vals: Values, o: surface.OverrideStmt, axes: tuple[str, ...], head: str):
    """The number of ranks the sets partition: the axis's size (None where free), over several axes the product
    of their sizes (each a number on the mesh: the flattened rank depends on them); False after a PL269."""
    if not axes or len(set(axes)) != len(axes):
        vals.cx.error(Code.RANK_SETS_AXIS, f"{head}: a list of rank sets cuts the ranks of the axes it names, each "
                      "named once; name one axis, or several whose flattened ranks the sets list", o.span)
        return False
    sizes = [number(ir.Sym(a), vals) for a in axes]
    if len(axes) == 1:
        return sizes[0]
    free = next((a for a, n in zip(axes, sizes) if n is None or n.denominator != 1), None)
    if free is not None:
        vals.cx.error(Code.RANK_SETS_AXIS, f"{head}: rank sets over several axes number the ranks of their product "
                      f"row-major, so each axis's size is a number on the mesh; {free} has none", o.span)
        return False
    return Fraction(ranksets.prod(sizes))
