"""The simulator's grad norm reduced within the process groups of rank sets over several axes
(``override clip_norm: reduce_sets over (A, B) ranks ([..], ..)``): the devices enumerated, the group rank of each
over the named axes read as ``itertools.product`` walks their coordinates (the last axis fastest), and each
device's squared norm replaced by the sum over the devices of its set (its other coordinates kept). Independent of
the checker: no role of an axis is read here, the per-device values simulator_norm draws are summed as they are."""

from __future__ import annotations

from itertools import product

from placement_logic import ir


def _value(e, sizes: dict[str, int]) -> int:
    if isinstance(e, ir.Const):
        return int(e.value)
    raise ValueError(f"a rank the simulator cannot read: {e!r}")


def statements(plan: ir.Plan) -> list[ir.Override]:
    """The statements in force: one restated over the same axes is replaced by the later one."""
    found = [o for o in plan.overrides if o.target == "clip_norm" and o.verb == "reduce_sets"
             and len(o.axes or ()) > 1]
    return [o for i, o in enumerate(found) if not any(set(x.axes) & set(o.axes) for x in found[i + 1:])]


def reduce(plan: ir.Plan, part: dict, g_axes: list[str], pos: dict[str, int], sizes: dict[str, int]) -> tuple:
    """``part`` summed over each device's set for every statement whose sets hold the named axes' ranks at these
    sizes, and the axes left for the per-axis reduction (the named ones taken out)."""
    for o in statements(plan):
        names = list(o.axes)
        walk = list(product(*[range(sizes[a]) for a in names]))
        sets = [{_value(r, sizes) for r in s} for s in o.sets]
        if set().union(*sets) != set(range(len(walk))) or sum(map(len, sets)) != len(walk):
            continue
        set_of = {walk[r]: j for j, s in enumerate(sets) for r in s}
        named = {pos[a] for a in names}

        keys = {d: (tuple(x for i, x in enumerate(d) if i not in named), set_of[tuple(d[pos[a]] for a in names)])
                for d in part}
        sums: dict = {}
        for d, v in part.items():
            sums[keys[d]] = sums.get(keys[d], 0) + v
        part = {d: sums[keys[d]] for d in part}
        g_axes = [a for a in g_axes if a not in names]
    return part, g_axes
