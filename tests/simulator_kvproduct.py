"""K >= 2 kv heads copied over a product of tensor axes, written from docs/semantics.md ("Whole
weights that see head-split activations") without the checker's code. The tensor ranks that
split the K/V projections are numbered by their joint index j over those axes (mixed radix, the
first axis most significant): rank j holds kv head j // (n/K), n the product of the axes' sizes,
so the n/K consecutive joint indices of a copy group hold one head. Each copy's gradient comes
from its rank's own query heads; the derived system all-reduces it over each copy group (a
collective over the axes of size n/K), and the derived grad norm counts each head once, on the
first rank of its copy group. No per-axis head or copy part is assumed here: the copy group is a
set of devices read from the joint index, whether or not it is a product of parts of the axes."""

from __future__ import annotations

from simulator import SPLIT_PARAMS, TENSOR

from placement_logic import ir


def layout(plan: ir.Plan, group: str, sizes: dict[str, int]) -> tuple[tuple[str, ...], int] | None:
    """(axes, ranks per copy group) where the kv group's heads are copied over two or more tensor axes
    at these sizes; None otherwise (one axis: simulator.head_copies)."""
    t = plan.model.transformer
    if group != "kv" or t is None or t.mla or not isinstance(t.kv_heads, ir.Const):
        return None
    k = int(t.kv_heads.value)
    axes = tuple(a for a in plan.mesh.names if plan.role(a) in TENSOR
                 and plan.placement(ir.State.PARAMS).mode(a) in SPLIT_PARAMS)
    n = 1
    for a in axes:
        n *= sizes[a]
    if len(axes) < 2 or k < 2 or n <= k or n % k:
        return None
    return axes, n // k


def axes(lay) -> tuple[str, ...]:
    return lay[0] if lay is not None else ()


def off_layout(copies: dict[str, int], lay) -> dict[str, int]:
    """The per-axis copies of ``simulator.head_copies`` on the axes the layout does not join."""
    return {a: c for a, c in copies.items() if a not in axes(lay)}


def off_axes(names: list[str], lay) -> list[str]:
    return [a for a in names if a not in axes(lay)]


def head_key(dev, pos, lay, sizes) -> tuple:
    """The head the joint index names, as a key (empty off a layout)."""
    return (head(dev, pos, lay, sizes),) if lay is not None else ()


def reduce_copies(bufs: list, a: str, k, pos, lay, sizes, one_axis) -> list:
    """The plan's reductions over each copy group of axis ``a`` (``one_axis``: over runs of its own
    ranks), or, on a layout's axes, over each copy group of the joint index, applied once per
    collective (counted on every axis it spans: read on the first)."""
    if a not in axes(lay):
        for _ in range(k[(a, "copies")]):
            bufs = [one_axis(b) for b in bufs]
        return bufs
    for _ in range(k[(a, "copies")] if a == lay[0][0] else 0):
        bufs = [allreduce_groups(b, pos, lay, sizes) for b in bufs]
    return bufs


def joint(dev, pos: dict[str, int], axes: tuple[str, ...], sizes: dict[str, int]) -> int:
    j = 0
    for a in axes:
        j = j * sizes[a] + dev[pos[a]]
    return j


def head(dev, pos, lay, sizes) -> int:
    axes, c = lay
    return joint(dev, pos, axes, sizes) // c


def first_copy(dev, pos, lay, sizes) -> bool:
    axes, c = lay
    return joint(dev, pos, axes, sizes) % c == 0


def allreduce_groups(buf: dict, pos, lay, sizes) -> dict:
    """An all-reduce over each copy group: the devices that agree off the axes and hold one head."""
    axes, _ = lay
    idx = [pos[a] for a in axes]

    def key(d):
        return tuple(v for i, v in enumerate(d) if i not in idx) + (head(d, pos, lay, sizes),)

    sums: dict = {}
    for d, v in buf.items():
        sums[key(d)] = sums.get(key(d), 0) + v
    return {d: sums[key(d)] for d in buf}


def counted(plan: ir.Plan, dev, pos, g_axes, lay, sizes) -> bool:
    """Whether this rank's copy of its kv head enters the norm's sum: the derived norm (and a stated
    reduction with a duplicate filter) counts it on the first rank of its copy group, a plain stated
    sum or `count_copies` on every rank. The filter is read over all of the copy axes the norm sums
    over, or over none of them."""
    from simulator import _last_for, _stated_norm

    axes, c = lay

    def carries(a: str) -> bool:  # ranks 0 and 1 of the axis (the others at 0) hold one head
        stride = 1
        for b in axes[axes.index(a) + 1:]:
            stride *= sizes[b]
        return sizes[a] >= 2 and stride < c

    summed = [a for a in axes if a in g_axes and carries(a)]
    if not summed:
        return True
    stated = bool(_stated_norm(plan, "kv") or _stated_norm(plan, "all") or _stated_norm(plan, None))
    dedupe = _last_for(plan, "clip_norm", "dedupe", "kv")
    every = _last_for(plan, "clip_norm", "count_copies", "kv")
    if len(summed) != sum(1 for a in axes if carries(a)):
        raise NotImplementedError("a norm over some of the kv copy axes only")
    if not crossing(lay, sizes):
        all_counted = {a: (every is not None and a in (every.axes or ())) or (
            stated and (dedupe is None or a not in (dedupe.axes or ()))) for a in summed}
        if all(all_counted.values()):
            return True
        if any(all_counted.values()):
            raise NotImplementedError("a duplicate filter over some of the kv copy axes only")
        return first_copy(dev, pos, lay, sizes)
    # copy groups crossing the axes' blocks: no axis holds a copy group's ranks alone, so a filter or a count
    # naming any axis the groups span reads the groups themselves (docs/semantics.md)
    names = lambda o: o is not None and any(a in (o.axes or ()) for a in axes)  # noqa: E731
    if names(every) or (stated and not names(dedupe)):
        return True
    return first_copy(dev, pos, lay, sizes)


def crossing(lay, sizes) -> bool:
    """Whether some copy group is no product of sets of ranks of the axes (a run crossing their blocks),
    found by comparing each group with the product of its ranks' coordinates."""
    axes, c = lay
    groups: dict[int, set] = {}
    coords = [()]
    for a in axes:
        coords = [x + (r,) for x in coords for r in range(sizes[a])]
    for x in coords:
        j = 0
        for a, r in zip(axes, x):
            j = j * sizes[a] + r
        groups.setdefault(j // c, set()).add(x)
    for g in groups.values():
        box = [{x[i] for x in g} for i in range(len(axes))]
        size = 1
        for b in box:
            size *= len(b)
        if size != len(g):
            return True
    return False
