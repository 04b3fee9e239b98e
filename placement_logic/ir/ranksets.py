"""Process groups given by a list of rank sets: ``reduce_sets over (AXIS) ranks ([0, 2, 3], [1, 4])``.

Input: the sets of ranks (numbers where known) and the axis's size. Output: why they do not partition
the axis (``problem``: the code and message of a PL267 or PL268, or None), the group of a rank
(``group_of``) and the sets written out (``text``). Each set is one ``new_group([...])`` of the real
system, its ranks in any order (``new_group([0, 2, 3])``, ``new_group([1, 4])``): rank i of the axis is
in the group of the set that holds it. The sets of one reduction partition the axis's ranks 0..n-1:
no rank in two sets (PL267), none left out and none past the axis (PL268). Where the axis's size is free
the sets fix it to the number of ranks they hold.
"""

from __future__ import annotations

from fractions import Fraction

from ..diagnostics import Code
from .nodes import Value
from .walker import show


def text(sets: tuple[tuple[int, ...], ...]) -> str:
    return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sets)


def group_of(sets: tuple[tuple[int, ...], ...], i: int) -> int | None:
    """The index of the set holding rank i (None where no set does)."""
    return next((j for j, s in enumerate(sets) if i in s), None)


def held(sets: tuple[tuple[int, ...], ...]) -> int:
    """How many ranks the sets hold: the axis's size where they partition it."""
    return sum(len(s) for s in sets)


def problem(head: str, exprs: tuple[tuple[Value, ...], ...], values: tuple[tuple[Fraction | None, ...], ...],
            axis: str, n: Fraction | None) -> tuple[str, str] | None:
    """Why the sets do not partition an axis of ``n`` ranks (``n`` None where the size is free: the sets fix it to
    the number of ranks they hold), as (code, message); None where they do."""
    seen: dict[Fraction, int] = {}
    for j, (es, vs) in enumerate(zip(exprs, values)):
        for e, v in zip(es, vs):
            if v is None or v.denominator != 1 or v < 0:
                shown = show(e) if v is None or show(e) == str(v) else f"{show(e)} = {v}"
                return Code.RANK_SETS_COVER, (f"{head}: {shown} is not a rank of {axis} (a rank is a whole number "
                                              "from 0, each written as a number)")
            if v in seen:
                where = f"twice in set {j + 1}" if seen[v] == j else f"in sets {seen[v] + 1} and {j + 1}"
                return Code.RANK_SETS_OVERLAP, (f"{head}: rank {v} of {axis} is {where}; the process groups of one "
                                                "reduction are disjoint, each rank in one group")
            seen[v] = j
    size = Fraction(len(seen)) if n is None else n
    free = "" if n is not None else f" (its size is free: the sets, holding {len(seen)} ranks, fix it to {len(seen)})"
    past = sorted(v for v in seen if v >= size)
    if past:
        return Code.RANK_SETS_COVER, (f"{head}: rank {past[0]} is not a rank of {axis}, whose ranks are 0 .. "
                                      f"{size - 1}{free}")
    missing = [i for i in range(int(size)) if Fraction(i) not in seen]
    if missing:
        return Code.RANK_SETS_COVER, (f"{head}: rank {missing[0]} of {axis} ({size} ranks) is in no set; the sets of "
                                      f"one reduction partition the axis (a rank that reduces alone is a set of its "
                                      f"own, [{missing[0]}])")
    return None


def coords(flat: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The coordinates of group rank ``flat`` over axes of ``sizes``, row-major (the first axis most significant,
    as torch's DeviceMesh flattens: ``mesh.flatten()`` of a (dp, tp) mesh numbers (d, t) as d * n_tp + t)."""
    out = []
    for n in reversed(sizes):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def derived_groups(sizes: tuple[int, ...], reduced: tuple[bool, ...]) -> tuple[frozenset[int], ...]:
    """The reduction groups of the derived step over axes of ``sizes`` flattened row-major: the group ranks sharing
    their coordinates on every axis the reduction does not run over (one group where it runs over every axis)."""
    out: dict[tuple[int, ...], set[int]] = {}
    for r in range(prod(sizes)):
        c = coords(r, sizes)
        out.setdefault(tuple(x for x, red in zip(c, reduced) if not red), set()).add(r)
    return tuple(frozenset(s) for s in out.values())


def wrong_set(sets: tuple[tuple[int, ...], ...], sizes: tuple[int, ...],
              reduced: tuple[bool, ...]) -> int | None:
    """The index of the first set that is not exactly a reduction group of the derived step, None where each is."""
    groups = set(derived_groups(sizes, reduced))
    return next((j for j, s in enumerate(sets) if frozenset(s) not in groups), None)


def prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out
