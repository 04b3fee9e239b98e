"""The joint index of several tensor axes and the kv heads' copy groups read from it (check.kvjoint):
rank j of the joint index (mixed radix, the first axis most significant) holds head j // c, c = n/K.
Pure arithmetic on declared sizes; no solver, no step model."""

from __future__ import annotations

from itertools import product


def joint_index(joint, coord: dict[str, int]) -> int:
    j = 0
    for a, s in joint:
        j = j * s + coord[a]
    return j


def devices(joint):
    names = [a for a, _ in joint]
    for c in product(*(range(s) for _, s in joint)):
        yield dict(zip(names, c))


def mixes(joint, k: int, axis: str) -> bool:
    """Whether some fibre of ``axis`` (ranks differing on it only) holds two kv heads."""
    c = (joint_index(joint, {a: s - 1 for a, s in joint}) + 1) // k
    size = dict(joint)[axis]
    for dev in devices(joint):
        if dev[axis]:
            continue
        heads = {joint_index(joint, {**dev, axis: r}) // c for r in range(size)}
        if len(heads) > 1:
            return True
    return False


def counts(lay, k) -> tuple[int, int, dict[str, int]]:
    """(head part's reductions, copy part's, axis -> sub-block reductions) from per-axis counts."""
    heads, _, joint = lay
    mixing = [a for a, s in joint if s >= 2 and mixes(joint, heads, a)]
    kh = max((k[a] for a in mixing), default=0)
    inside = {a: k[a] for a, s in joint if s >= 2 and a not in mixing}
    return kh, k[(joint[0][0], "copies")] + kh, inside
