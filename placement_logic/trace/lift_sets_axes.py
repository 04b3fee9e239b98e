"""Process groups whose global ranks are sets over the flattened ranks of several mesh axes (no torch).

``find``: every collective's group (the recorder's global ranks of its process group) that is no set of mesh axes
and no part of one axis, but whose ranks differ from the caller's on two axes or more only (the other coordinates
the caller's). Per line of ranks across those axes (the other coordinates) the groups, with the ranks seen in a
group of their own, must hold every rank of the axes' product once in two groups or more: the process groups of a
list of rank sets over several axes, each rank numbered by its coordinates on the axes flattened row-major in the
mesh's order (the first axis most significant, as torch's DeviceMesh flattens). ``_Layout.blocks`` maps each group
to (the axes' indices, the sets, "sets"), read by ``lift_blocks.block_lines`` as ``override grads[g] /
clip_norm: reduce_sets over (A, B) ranks ([..], ..)`` and by the layout as a call over those axes. Groups that
leave a rank out are left as they are: named, never lifted."""

from __future__ import annotations

from .lift_layout import _Layout


def _across(layout: _Layout, ranks, r: int) -> tuple[int, ...] | None:
    """The indices of the axes (two or more) along which ``ranks`` differ from ``r``, the others equal."""
    if r not in layout.coords or any(x not in layout.coords for x in ranks):
        return None
    me = layout.coords[r]
    axes = tuple(i for i in range(len(me)) if any(layout.coords[x][i] != me[i] for x in ranks))
    return axes if len(axes) >= 2 else None


def flat(layout: _Layout, axes: tuple[int, ...], rank: int) -> int:
    """The group rank of ``rank`` over ``axes`` flattened row-major (the first axis most significant)."""
    k = 0
    for i in axes:
        k = k * layout.sizes[i] + layout.coords[rank][i]
    return k


def _rest(layout: _Layout, axes: tuple[int, ...], rank: int) -> tuple:
    return tuple(x for j, x in enumerate(layout.coords[rank]) if j not in axes)


def find(trace: dict, layout: _Layout, alone: set[int], one_axis) -> None:
    """Record in ``layout.blocks`` every group of a partition of several axes' flattened ranks (see above);
    ``one_axis(ranks, r)`` says whether a group lies along one axis (``lift_blocks``'s own)."""
    lines: dict[tuple, set[frozenset]] = {}
    for part in trace["ranks"]:
        for c in part["collectives"]:
            ranks = c.get("ranks") or []
            if len(ranks) < 2 or c["kind"] in ("send", "recv", "recv_any_source") \
                    or layout.axes_of(ranks, part["rank"]) is not None or one_axis(ranks, part["rank"]):
                continue
            axes = _across(layout, ranks, part["rank"])
            if axes is not None:
                lines.setdefault((axes, _rest(layout, axes, part["rank"])), set()).add(frozenset(ranks))
    for (axes, rest), groups in lines.items():
        n = 1
        for i in axes:
            n *= layout.sizes[i]
        covered = {x for g in groups for x in g}
        mine = {r for r in alone if r in layout.coords and _rest(layout, axes, r) == rest and r not in covered}
        parts = sorted([sorted(flat(layout, axes, r) for r in g) for g in groups] +
                       [[flat(layout, axes, r)] for r in mine])
        if len(parts) < 2 or sorted(x for p in parts for x in p) != list(range(n)):
            continue
        sets = tuple(tuple(p) for p in parts)
        layout.blocks.update({g: (axes, sets, "sets") for g in groups})
        layout.blocks.update({frozenset([r]): (axes, sets, "sets") for r in mine})
