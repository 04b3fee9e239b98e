"""The grad norm of K >= 2 kv heads copied over a tensor axis, written from docs/semantics.md
("Global reductions") without the checker's code. On a tensor axis of n ranks that splits the
K/V projections of K < n kv heads, rank r holds head r // (n/K): n/K consecutive ranks hold
copies of one head, and after their copy group's all-reduce the copies are equal. The norm
sums each head's squared norm once: the derived reduction counts a copy on the first rank of
its copy group only; a stated `clip_norm: reduce` is a plain sum (every copy counted) unless a
`clip_norm: dedupe over (AXIS)` names the axis; `clip_norm[kv]: count_copies over (AXIS)` counts
every copy whatever the reduction."""

from __future__ import annotations

from simulator import TENSOR, _last_for, _stated_norm, head_copies

from placement_logic import ir


def copy_axes(plan: ir.Plan, sizes: dict[str, int]) -> dict[str, int]:
    """axis -> ranks per copy group (n/K), for each tensor axis over which K >= 2 kv heads are copied at these sizes."""
    t = plan.model.transformer
    if t is None or t.mla or not isinstance(t.kv_heads, ir.Const) or t.kv_heads.value < 2:
        return {}
    out = {}
    for a in plan.mesh.names:
        if plan.role(a) in TENSOR:
            c = head_copies(plan, "kv", a, sizes[a])
            if c is not None and c >= 2:
                out[a] = c
    return out


def extent(group: str, axis: str, sizes: dict[str, int], copies: dict[str, int]) -> int:
    """How many distinct values of the group lie along the axis: K heads on a copy axis."""
    return sizes[axis] // copies[axis] if group == "kv" and axis in copies else sizes[axis]


def key(group: str, axis: str, rank: int, copies: dict[str, int]) -> int:
    return rank // copies[axis] if group == "kv" and axis in copies else rank


def counted(plan: ir.Plan, group: str, dev: dict[str, int], g_axes, copies: dict[str, int]) -> bool:
    """Whether this rank's copy of its kv head enters the norm's sum."""
    if group != "kv":
        return True
    stated = bool(_stated_norm(plan, group) or _stated_norm(plan, "all") or _stated_norm(plan, None))
    dedupe = _last_for(plan, "clip_norm", "dedupe", group)
    every = _last_for(plan, "clip_norm", "count_copies", group)
    for a, c in copies.items():
        if a not in g_axes:
            continue
        all_counted = (every is not None and a in (every.axes or ())) or (
            stated and (dedupe is None or a not in (dedupe.axes or ())))
        if not all_counted and dev[a] % c:
            return False
    return True
