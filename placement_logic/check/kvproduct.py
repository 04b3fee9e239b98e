"""K >= 2 kv heads copied over a product of tensor axes (docs/semantics.md, "Whole weights that
see head-split activations"). The tensor ranks that split the K/V projections are numbered by
the axes' joint index j (mixed radix, the first axis most significant); rank j holds kv head
j // (n/K), so a copy group is a run of n/K consecutive joint indices. Where the run is a product
of parts of the axes (``ir.heads.copy_layout``: the last axes wholly, one axis cut into blocks,
the first axes whole heads) each axis is a dimension pair of the step model as over one axis: a
head part of h blocks (SHARDED: different heads) and a copy part of size/h ranks (SPLIT: each
copy's gradient from its rank's query heads, summed over the copy group), and an axis of whole
heads is SHARDED with its size pinned to the declared one (``GradDim.pin``: at another size the
runs would cross it). A reduction over each copy group (``ir.heads.grad_sums``) is a reduction
over every axis's copy part; one over a whole axis, over both of its parts. Runs that cross the
axes' blocks (no product of parts) are read on the joint index itself: ``check.kvjoint``.

Input: the step model's groups and sizes. Output (the axis's ``GradDim``s are ``dims.copied_dims``): for the replay the sizes at which the layout holds (``layout_ok``; the encoding pins an axis of whole
heads in ``encode.Env.size``).
No solver call here.
"""

from __future__ import annotations

from .dims import COPY_PART, GradDim


def pins(g) -> dict[str, int]:
    """axis -> its pinned size, for g's axes of whole heads."""
    return {d.axis: d.pin for d in g.dims if d.pin}


def layout_ok(groups, sizes: dict[str, int]) -> bool:
    """Whether the copy layouts of these groups hold at these sizes: every copy axis a multiple of
    its head blocks, every axis of whole heads at its declared size."""
    for g in groups:
        for d in g.dims:
            if d.joint:  # copy groups crossing the axes: the declared sizes only (check.kvjoint)
                if any(sizes.get(a, s) != s for a, s in d.joint):
                    return False
                continue
            if d.part == COPY_PART and d.axis in sizes and sizes[d.axis] % d.heads:
                return False
            if d.pin and d.axis in sizes and sizes[d.axis] != d.pin:
                return False
    return True


def note(g) -> str | None:
    """For the obligations' notes: the sizes at which g's copy layout over several axes is read."""
    fixed = pins(g)
    parts = {d.axis: d.heads for d in g.dims if d.part == COPY_PART}
    if len(fixed) + len(parts) < 2:
        return None
    said = [f"{a} = {n}" for a, n in fixed.items()]
    said += [f"{a} a multiple of {h}" if h > 1 else f"{a} any size" for a, h in parts.items()]
    return (f"the kv heads' copy groups over {'×'.join(list(fixed) + list(parts))} (runs of the joint index) are "
            f"read at {', '.join(said)}: the sizes at which each copy group is a product of parts of the axes")


def several(g) -> bool:
    """Whether g's kv heads are copied over several axes (a layout of this module)."""
    return len(pins(g)) + sum(1 for d in g.dims if d.part == COPY_PART) >= 2


def share(d: GradDim) -> str:
    """The ranks of a copy part's axis in one copy group: ``tp/2``, or ``tp`` where every rank is a copy."""
    if d.joint:
        return f"{'·'.join(a for a, _ in d.joint)}/{d.heads}"
    return f"{d.axis}/{d.heads}" if d.heads > 1 else d.axis


def joint_text(g, a: str, c: int) -> str:
    """For a replay where g's copies span several axes: block h of axis ``a`` (c ranks) and the copy group
    it is part of, a run of the joint index; empty over one axis."""
    if not several(g):
        return ""
    order = "×".join(dict.fromkeys(d.axis for d in g.dims if d.pin or d.part))
    return (f"block h of {a} (the {a} ranks h·{c} .. h·{c} + {c - 1}) holds copies of one head: its part of the "
            f"head's copy group, a run of the joint index of {order}")
