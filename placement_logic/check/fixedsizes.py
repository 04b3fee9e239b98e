"""The sizes a partition of an axis's ranks holds the axis at, against the model's shape facts.

A list of consecutive group sizes (``reduce_groups ... by (S1, S2, ...)``) or of rank sets (``reduce_sets ranks
([..], ..)``) describes its axis at the number of ranks it holds only, and rank sets over several axes number the
ranks of the product at the mesh's sizes: every witness of the obligations they enter holds those axes there
(``check.encode_subgroups.fixed_size``). Where the model's shapes never take those sizes (``check.encode_shapefacts``:
tp = 3 over 32 heads, a · b stages over 4 layers) no witness exists, and a verdict "proved" would be vacuous: the
statement is refused (PL250, PL268), as it is where the axis is pinned at another size.

Input: the plan, its partition statements, the pinned sizes and the ``let`` bindings. Output: nothing, or a
``DiagnosticError`` at the statement."""

from __future__ import annotations

from itertools import product

from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import ranksets
from . import encode_shapefacts as shapefacts
from . import subgroups as sg


def held_sizes(o, plan) -> dict[str, int]:
    """The sizes the statement holds its axes at (none for blocks, strides and the first ranks)."""
    if sg.multi_sets(o):
        return dict(zip(o.axes, sg.set_sizes(o, plan)))
    if o.verb == sg.GROUPS:
        return {o.axes[0]: sum(sg.sizes_of(o))}
    if o.verb == sg.SETS:
        return {o.axes[0]: ranksets.held(sg.sets_of(o))}
    return {}


def _candidates(found) -> list[int]:
    """Sizes to try for a free axis: every divisor of a fact's number (the only sizes a product dividing it takes),
    and those numbers' multiples up to twice the largest (a kv-head count's copies)."""
    out = {1}
    for f in found:
        out |= {d for d in range(1, min(f.value, 64) + 1) if f.value % d == 0}
        if f.copies_ok:
            out |= {f.value * k for k in (1, 2)}
    return sorted(out)[:16]


def takeable(found, fixed: dict[str, int], free: list[str]) -> bool:
    """Whether some sizes of the free axes meet every fact with ``fixed`` held."""
    cands = _candidates(found)
    return any(shapefacts.holds(found, {**fixed, **dict(zip(free, c))}) for c in product(cands, repeat=len(free)))


def check(plan, stated, pinned: dict[str, int], bindings: dict) -> None:
    """PL250 (groups) or PL268 (sets) where the sizes the statements hold their axes at, with the pinned sizes, are
    sizes the model's shapes never take."""
    found = shapefacts.facts(plan, bindings)
    if not found:
        return
    fixed = dict(pinned)
    for o in stated:
        held = held_sizes(o, plan)
        if not held:
            continue
        fixed.update(held)
        free = [a for a in plan.mesh.names if a not in fixed]
        if takeable(found, fixed, free):
            continue
        broken = "; ".join(f.text() for f in found if all(a in fixed for a in f.axes)) or "; ".join(
            f.text() for f in found)
        code = Code.GROUP_SIZES if o.verb == sg.GROUPS else Code.RANK_SETS_COVER
        what = ", ".join(f"{a} = {n}" for a, n in held.items())
        raise DiagnosticError([Diagnostic(
            code, f"{sg.head(o)}: the statement holds {what}, which the model's shapes never take ({broken}); "
            "no configuration of the plan runs it, so nothing about it can be proved", o.span)])
