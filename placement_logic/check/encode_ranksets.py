"""The obligation of rank sets over several axes: ``override grads[g]: reduce_sets over (A, B) ranks ([..], ..)``.

Input: the statement, the sizes of its axes on the mesh (``check.subgroups.set_sizes``) and which of them g's
gradient is reduced over in the step. Output: the arm of ``GI grads[g] blocks`` (``arm``: its z3 condition, the
sizes it holds the axes at) and the concrete replay of a witness (``replay``).

The sets list group ranks of the product of the axes flattened row-major (the first axis most significant, as
torch's DeviceMesh flattens: ``ir.ranksets.coords``). Each set is one ``new_group``: a gradient element is summed
over exactly the devices of its set (the other axes' coordinates kept). The derived step sums it over the axes
the reduction runs over, its coordinates on the others kept: the reduction groups ``ir.ranksets.derived_groups``.
The statement holds iff every set is exactly one of them; the negation is two group ranks A, B of the axes that
either share a set but differ on an axis the reduction does not run over (the set mixes gradients of different
pieces) or lie in different sets but agree on every such axis (the set misses a rank of A's reduction group).
The statement describes the axes at their sizes on the mesh only, so every witness holds them there.
"""

from __future__ import annotations

import zlib

import z3

from ..ir import ranksets
from .report import Counterexample, coords_text
from .subgroups import groups_text, head


def _flat_coord(r, sizes: tuple[int, ...], k: int):
    """Coordinate ``k`` of group rank ``r`` (a z3 integer), row-major."""
    stride = ranksets.prod(sizes[k + 1:])
    return (r / stride) % sizes[k]


def _set_index(sets, r):
    return z3.Sum([z3.If(z3.Or([r == x for x in s]), j, 0) for j, s in enumerate(sets)])


def ranks_of(env, o):
    tag = f"setsaxes_{zlib.crc32(head(o).encode()):08x}"
    return env.sess.int(f"{tag}_a"), env.sess.int(f"{tag}_b")


def fixed(env, o, sizes: tuple[int, ...]) -> list:
    """Every witness at the axes' sizes on the mesh (the flattened ranks mean nothing at others)."""
    return [env.fix(a, n) for a, n in zip(o.axes, sizes)]


def arm(env, o, sets, sizes: tuple[int, ...], reduced: tuple[bool, ...]):
    """Two group ranks A, B: in one set but apart on an axis not reduced over, or in two sets with equal
    coordinates on every such axis (the negation of "every set is exactly a reduction group")."""
    ra, rb = ranks_of(env, o)
    n = ranksets.prod(sizes)
    same_piece = z3.And([_flat_coord(ra, sizes, k) == _flat_coord(rb, sizes, k)
                         for k, red in enumerate(reduced) if not red] or [z3.BoolVal(True, env.sess.ctx)])
    same_set = _set_index(sets, ra) == _set_index(sets, rb)
    return z3.And(fixed(env, o, sizes) + [ra >= 0, ra < n, rb >= 0, rb < n,
                                           z3.Or(z3.And(same_set, z3.Not(same_piece)),
                                                 z3.And(z3.Not(same_set), same_piece))])


def _device(names, axes, sizes, r) -> tuple[int, ...]:
    c = dict(zip(axes, ranksets.coords(r, sizes)))
    return tuple(c.get(a, 0) for a in names)


def replay(ctx, w, group: str, o, sets, sizes: tuple[int, ...], reduced: tuple[bool, ...]):
    """Every device's contribution 0 but device A's, 1; device B's reduced gradient, the sum over its set, against
    the sum over its reduction group in the derived step (the same element of every device of that group): a
    counterexample where they differ, None where the witness is not one (sizes other than the mesh's)."""
    if any(w["sizes"].get(a) != n for a, n in zip(o.axes, sizes)) or "ranks" not in w:
        return None
    ia, ib = w["ranks"]
    n = ranksets.prod(sizes)
    if not (0 <= ia < n and 0 <= ib < n):
        return None
    piece = [k for k, red in enumerate(reduced) if not red]
    key = lambda r: tuple(ranksets.coords(r, sizes)[k] for k in piece)  # noqa: E731
    mine = next(s for s in sets if ib in s)
    got = sum(1 for r in mine if r == ia)
    want = 1 if key(ia) == key(ib) else 0
    if got == want:
        return None
    names = ctx.step.axes
    ra, rb = (coords_text(names, _device(names, o.axes, sizes, r)) for r in (ia, ib))
    over = ", ".join(a for a, red in zip(o.axes, reduced) if red)
    group_of_b = sorted(r for r in range(n) if key(r) == key(ib))
    eq = (f"the reduced {group} gradient on {rb} is {got} (the sum over its set [{', '.join(map(str, mine))}] of "
          f"({', '.join(o.axes)}) flattened); the derived step sums it over ({over}), group ranks "
          f"{', '.join(map(str, group_of_b))}, where it is {want}")
    bad = ranksets.wrong_set(sets, sizes, reduced)
    wrong = sets[bad] if bad is not None else mine
    named = f"[{', '.join(map(str, wrong))}]"
    mixes = len({key(r) for r in wrong}) > 1
    misses = any(key(r) == key(wrong[0]) and r not in wrong for r in range(n))
    why = " and ".join(x for x, on in (("adds gradients of ranks that hold different pieces", mixes),
                                       ("misses ranks whose contribution the element sums", misses)) if on)
    diag = (f"the {group} gradient is reduced within {groups_text(o)} over ({', '.join(o.axes)}) flattened "
            f"row-major (override {o.verb} at line {o.span.line}), but its reduction runs over ({over}) only: the "
            f"set {named} is not one of its reduction groups ("
            + "; ".join("[" + ", ".join(map(str, sorted(s))) + "]"
                        for s in ranksets.derived_groups(sizes, reduced)) + "), so "
            + f"it {why}",)
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("rank A", ra), ("rank B", rb)),
                          (("per-rank contribution", f"1 on {ra}, 0 on every other rank"),
                           ("rank sets", ranksets.text(sets))), eq, diag, ctx.command(w["sizes"]))
