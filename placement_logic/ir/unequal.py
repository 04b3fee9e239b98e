"""Consecutive groups of unequal sizes: ``reduce_groups over (AXIS) by (S1, S2, ...)``.

Input: the sizes S1, S2, ... (numbers where known) and the axis's size. Output: whether they cut
the axis (``problem``: the message of a PL250, or None) and the first rank of each group
(``starts``). Rank i of the axis is in group j where S1 + ... + Sj <= i <
S1 + ... + S(j+1): the groups are runs of consecutive ranks, in order, a per-node group on nodes of
unequal GPU counts or a hand-written ``new_group([0, 1, 2])``, ``new_group([3, 4])``.
"""

from __future__ import annotations

from fractions import Fraction

from .nodes import Value
from .walker import show


def starts(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The first rank of each group."""
    out, at = [], 0
    for s in sizes:
        out.append(at)
        at += s
    return tuple(out)


def problem(head: str, exprs: tuple[Value, ...], values: tuple[Fraction | None, ...], axis: str,
            n: Fraction | None) -> str | None:
    """Why the sizes cannot cut an axis of ``n`` ranks (None where they can, or where n is not known)."""
    for e, v in zip(exprs, values):
        if v is None or v.denominator != 1 or v < 1:
            shown = show(e) if v is None or show(e) == str(v) else f"{show(e)} = {v}"
            return (f"{head}: a group holds a positive whole number of ranks, not {shown} (each size of a list of "
                    "consecutive groups is a number)")
    total = sum(values, Fraction(0))
    if n is not None and total != n:
        parts = " + ".join(str(v) for v in values)
        return (f"{head}: the groups hold {total} ranks ({parts}), but {axis} has {n}; the sizes of consecutive "
                "groups add up to the axis's size")
    return None
