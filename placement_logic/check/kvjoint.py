"""K >= 2 kv heads copied over several tensor axes in copy groups that cross the axes' blocks
(docs/semantics.md, "Whole weights that see head-split activations"). The tensor ranks that split
the K/V projections are numbered by the axes' joint index j (mixed radix, the first axis most
significant); rank j holds kv head j // c (c = n/K), so a copy group is the run of c consecutive
joint indices. Where no product of parts of the axes gives these runs (3 kv heads on 2 x 3 ranks:
{(0,0),(0,1)}, {(0,2),(1,0)}, {(1,1),(1,2)}; ``ir.heads.joint_layout``), the axes are read together,
at their declared sizes (the runs are computed from them; at other sizes they are other sets):

- the first axis carries a head part (SHARDED, K values: which head the joint index names) and a
  copy part (SPLIT, c values: which copy), each copy's gradient summed over exactly its copy group;
- every later axis is folded into them (a SHARDED dimension of size 1: its ranks are counted in
  the head and copy parts already).

A reduction of the kv gradient over each copy group (the derived one) reduces the copy part. A
reduction over a whole axis whose fibres (the ranks that differ on that axis only) hold two heads
adds different heads' gradients: it reduces the head part (and sums every copy on the way). A
reduction over an axis whose fibres lie inside the copy groups (a sub-block of each group, possible
over three or more axes) is not modelled: the group's obligations stay unknown, naming it.

The grad norm reads the same parts: the head part is summed over distinct values, the copy part
filtered (each head counted on the first rank of its copy group) or counted (kvnorm). A norm reduced
over some of the joint axes only is not modelled (unknown, named).
No solver here; the encoding pins the joint axes at their declared sizes (``encode.Env.size``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .dims import COPY_PART, HEAD_PART, GradDim
from .jointindex import counts, devices, joint_index


def axes_of(d: GradDim) -> tuple[str, ...]:
    return tuple(a for a, _ in d.joint)


def text(d: GradDim) -> str:
    """The joint axes for messages: ``tp×tq``."""
    return "×".join(axes_of(d))


def copies(d: GradDim) -> int:
    """c = n/K: the ranks of one copy group."""
    n = 1
    for _, s in d.joint:
        n *= s
    return n // d.heads


def recount(dims_: list[GradDim], reductions: Counter) -> list[GradDim]:
    """The joint dimensions with the reductions of a `grads: reduce over (AXES)` override (whole axes)."""
    joint = next((d.joint for d in dims_ if d.joint), None)
    if joint is None:
        return dims_
    head = next(d for d in dims_ if d.joint and d.part == HEAD_PART)
    kh, kc, inside = counts((head.heads, copies(head), joint), reductions)
    return [d if not d.joint else replace(d, k=kh if d.part == HEAD_PART else kc if d.part == COPY_PART
                                          else inside.get(d.axis, 0)) for d in dims_]


def folded(g) -> set[str]:
    """The joint axes folded into the first one's parts (size 1 in the step model)."""
    return {d.axis for d in g.dims if d.joint and not d.part}


def undecided(dims_) -> str:
    """The fact the step model lacks: a reduction over blocks of ranks inside each copy group (where no
    reduction adds different heads, which is wrong whatever else is summed)."""
    if any(d.joint and d.part == HEAD_PART and d.k for d in dims_):  # different heads added: refuted anyway
        return ""
    for d in dims_:
        if d.joint and not d.part and d.k:
            return (f"the kv gradient is reduced over {d.axis}, whose ranks lie inside the kv heads' copy groups (runs "
                    f"of the joint index of {text(d)}): a sum over a block of each copy group is not in the step model; "
                    "the missing fact: how the rest of each copy group is summed")
    return ""


def norm_undecided(g) -> str:
    """A norm reduced over some of the joint axes only: not modelled."""
    head = next((d for d in g.dims if d.joint and d.part == HEAD_PART), None)
    if head is None or g.clip_axes is None:
        return ""
    names = [a for a, s in head.joint if s >= 2]
    summed = [a for a in names if a in g.clip_axes]
    if not summed or len(summed) == len(names):
        return ""
    return (f"the norm of {g.group} is reduced over {', '.join(summed)} but not over all of {text(head)}, where its kv "
            "heads' copy groups are runs of the joint index: which heads and copies such a fibre holds is not in the "
            "step model; the missing fact: the norm over part of the copy groups")


def head_dim(g) -> GradDim | None:
    return next((d for d in g.dims if d.joint and d.part == HEAD_PART), None)


def coord(g, dev, pos: dict[str, int]) -> tuple | None:
    """The shard of g device ``dev`` holds over its shard axes: the joint head on the first joint axis,
    0 on the folded ones (None where g has no joint layout)."""
    d = head_dim(g)
    if d is None:
        return None
    j = joint_index(d.joint, {a: dev[pos[a]] for a in axes_of(d)})
    fold = folded(g)
    return tuple(j // copies(d) if a == d.axis else 0 if a in fold else dev[pos[a]] for a in g.shard_axes)


def first_copy(d: GradDim, dev, pos: dict[str, int]) -> bool:
    """Whether ``dev`` is the first rank of its copy group (the duplicate filter counts it there)."""
    return joint_index(d.joint, {a: dev[pos[a]] for a in axes_of(d)}) % copies(d) == 0


def sizes_ok(g, sizes: dict[str, int]) -> bool:
    """Whether the sizes are the declared ones of every joint axis."""
    return all(sizes.get(a, s) == s for d in g.dims if d.joint for a, s in d.joint)


def note(d: GradDim) -> str:
    said = ", ".join(f"{a} = {s}" for a, s in d.joint)
    return (f"the kv heads' copy groups over {text(d)} (runs of {copies(d)} ranks of the joint index, crossing the "
            f"axes' blocks) are read at {said}: the sizes at which the runs are these sets of ranks")


def where(d: GradDim) -> str:
    """The ranks a reduction over this joint dimension spans, for diagnoses."""
    if d.part == COPY_PART:
        return f"each copy group of {text(d)} ({copies(d)} consecutive ranks of the joint index)"
    return f"{text(d)} (ranks holding different kv heads)" if d.part == HEAD_PART else d.axis


def share(d: GradDim) -> str:
    return f"{'·'.join(axes_of(d))}/{d.heads} = {copies(d)}"


def groups_text(d: GradDim) -> str:
    """The copy groups as sets of ranks, for a replay: head h and the ranks of its run of the joint index."""
    names = axes_of(d)
    ranks: dict[int, list[str]] = {}
    for x in devices(d.joint):
        h = joint_index(d.joint, x) // copies(d)
        ranks.setdefault(h, []).append("(" + ", ".join(f"{a}={x[a]}" for a in names) + ")")
    shown = [f"head {h}: {' '.join(r)}" for h, r in sorted(ranks.items())[:4]]
    return "; ".join(shown) + (f"; ... ({len(ranks)} heads)" if len(ranks) > 4 else "")


def shown_name(d: GradDim) -> str | None:
    """A joint dimension's name in a replayed device (None: a folded axis, not shown)."""
    if not d.part:
        return None
    return f"{text(d)} head" if d.part == HEAD_PART else d.name
