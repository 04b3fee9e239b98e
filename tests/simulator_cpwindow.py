"""Sliding-window attention on a context group, position by position (the oracle of check.cpwindow; nothing
imported from ``placement_logic.check``).

A sequence of n positions on c ranks: ``contiguous`` gives rank r the positions r·n/c ... (r + 1)·n/c − 1,
``zigzag`` cuts it into 2c chunks and gives rank r chunks r and 2c − 1 − r. Each rank runs the ring: at step s it
holds the key/value block of rank (r − s) mod c and calls the attention kernel on its queries and that block with
a mask the behaviour builds. One device attends key k from query p when 0 ≤ p − k < w. The attention output of
p is Σ 2^k over the keys let in (every set of keys has its own sum).
"""

from __future__ import annotations


def holds(layout: str, c: int, n: int) -> list[list[int]]:
    """Every rank's positions, in its buffer's order."""
    if layout == "contiguous":
        return [list(range(r * n // c, (r + 1) * n // c)) for r in range(c)]
    h = n // (2 * c)
    return [list(range(r * h, (r + 1) * h)) + list(range((2 * c - 1 - r) * h, (2 * c - r) * h)) for r in range(c)]


def _mask(behaviour: str | None, w: int, p: int, k: int, qi: int, ki: int, own: bool) -> bool:
    """The kernel's mask for query p (index qi in its rank's buffer) and key k (index ki in the key block's)."""
    causal = k <= p  # the ring's causal logic: earlier blocks whole, the diagonal causal, later blocks skipped
    if behaviour == "window_dropped":
        return causal
    if behaviour == "window_local":  # the kernel's window on the block's own indices, no offset
        return causal and qi - ki < w
    if behaviour == "window_on_diagonal":
        return causal and (not own or p - k < w)
    return causal and p - k < w


def outputs(behaviour: str | None, layout: str, c: int, n: int, w: int) -> dict[int, int]:
    """Every position's attention output as the ranks compute it."""
    ranks = holds(layout, c, n)
    out: dict[int, int] = {}
    for r in range(c):
        for qi, p in enumerate(ranks[r]):
            total = 0
            for s in range(c):
                src = (r - s) % c
                for ki, k in enumerate(ranks[src]):
                    if _mask(behaviour, w, p, k, qi, ki, src == r):
                        total += 2 ** k
            out[p] = total
    return out


def single_device(n: int, w: int) -> dict[int, int]:
    return {p: sum(2 ** k for k in range(n) if 0 <= p - k < w) for p in range(n)}


def differing(behaviour: str | None, layout: str, c: int, n: int, w: int) -> list[int]:
    """The queries whose output differs from one device's."""
    got, want = outputs(behaviour, layout, c, n, w), single_device(n, w)
    return [p for p in range(n) if got[p] != want[p]]


def pair_differs(behaviour: str | None, layout: str, c: int, n: int, w: int, p: int, k: int) -> bool:
    """Whether the ranks let key k into query p's sum otherwise than one device does."""
    ranks = holds(layout, c, n)
    where = {x: (r, i) for r, xs in enumerate(ranks) for i, x in enumerate(xs)}
    (rp, qi), (rk, ki) = where[p], where[k]
    return _mask(behaviour, w, p, k, qi, ki, rp == rk) != (0 <= p - k < w)
