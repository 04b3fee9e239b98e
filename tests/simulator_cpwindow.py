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


# Chunked (local) attention (``attention { chunk = C }``): one device attends key k from query p when both lie in the
# same chunk of C positions and k ≤ p. Each behaviour builds the kernel's mask for one ring step.


def _chunk_mask(behaviour: str | None, size: int, p: int, k: int, qi: int, ki: int, own: bool) -> bool:
    causal = k <= p
    if behaviour == "chunk_dropped":
        return causal
    if behaviour == "chunk_local":  # the chunks cut on the buffers' own indices
        return causal and qi // size == ki // size
    if behaviour == "chunk_on_diagonal":  # the chunked kernel on the local block, the received blocks causal
        return causal and (not own or p // size == k // size)
    return causal and p // size == k // size


def chunk_outputs(behaviour: str | None, layout: str, c: int, n: int, size: int) -> dict[int, int]:
    ranks = holds(layout, c, n)
    out: dict[int, int] = {}
    for r in range(c):
        for qi, p in enumerate(ranks[r]):
            out[p] = sum(2 ** k for s in range(c) for ki, k in enumerate(ranks[(r - s) % c])
                         if _chunk_mask(behaviour, size, p, k, qi, ki, (r - s) % c == r))
    return out


def chunk_differing(behaviour: str | None, layout: str, c: int, n: int, size: int) -> list[int]:
    got = chunk_outputs(behaviour, layout, c, n, size)
    want = {p: sum(2 ** k for k in range(p + 1) if k // size == p // size) for p in range(n)}
    return [p for p in range(n) if got[p] != want[p]]


def chunk_pair_differs(behaviour: str | None, layout: str, c: int, n: int, size: int, p: int, k: int) -> bool:
    ranks = holds(layout, c, n)
    where = {x: (r, i) for r, xs in enumerate(ranks) for i, x in enumerate(xs)}
    (rp, qi), (rk, ki) = where[p], where[k]
    return _chunk_mask(behaviour, size, p, k, qi, ki, rp == rk) != (k <= p and k // size == p // size)


# Packed documents: a pack is a list of (padded units u, real units a); document d takes 2c·u positions, its first
# 2c·a real. One device lets query p attend key k in its own document, k real, 0 ≤ p − k < w. The ranks hold the
# positions the layout gives them, in buffer order (written out here from the layouts' descriptions).


def pack_holds(layout: str, c: int, pack, w: int) -> list[list[int]]:
    n = sum(2 * c * u for u, _ in pack)
    if layout in ("contiguous", "zigzag"):
        return holds(layout, c, n)
    if layout == "ptrr":  # every row's count of keys in the windowed document mask, dealt longest first in a snake
        docs = [d for d, (u, _) in enumerate(pack) for _ in range(2 * c * u)]
        count = [sum(1 for k in range(p + 1) if docs[k] == docs[p] and p - k < w) for p in range(n)]
        order = sorted(range(n), key=lambda p: (-count[p], p))
        ranks: list[list[int]] = [[] for _ in range(c)]
        for i, p in enumerate(order):
            row, col = divmod(i, c)
            ranks[col if row % 2 == 0 else c - 1 - col].append(p)
        return [sorted(x) for x in ranks]
    if layout == "zigzag_per_document_unpadded":  # segments of the real lengths, then the padding, read as positions
        sizes = [a for _, a in pack] + [sum(u - a for u, a in pack)]
    else:
        sizes = [u for u, _ in pack]
    ranks = [[] for _ in range(c)]
    listed = []  # document-major: every rank's head and tail chunk of each document in turn
    start = 0
    for v in sizes:
        chunks = [list(range(start + i * v, start + (i + 1) * v)) for i in range(2 * c)]
        for r in range(c):
            ranks[r] += chunks[r] + chunks[2 * c - 1 - r]
            listed += chunks[r] + chunks[2 * c - 1 - r]
        start += 2 * c * v
    if layout == "zigzag_document_major":
        return [listed[r * n // c:(r + 1) * n // c] for r in range(c)]
    return ranks


def _doc_facts(c: int, pack) -> tuple[list[int], list[bool]]:
    docs, real = [], []
    for d, (u, a) in enumerate(pack):
        docs += [d] * (2 * c * u)
        real += [i < 2 * c * a for i in range(2 * c * u)]
    return docs, real


def _pack_mask(behaviour, w, p, k, qi, ki, own, docs, real) -> bool:
    if behaviour == "window_across_documents":  # the document mask dropped where the window is applied
        return 0 <= p - k < w
    return docs[p] == docs[k] and real[k] and _mask(behaviour, w, p, k, qi, ki, own)


def pack_differing(behaviour, layout: str, c: int, pack, w: int) -> list[int]:
    """The real queries whose output differs from one device's, the ranks running the ring."""
    ranks = pack_holds(layout, c, pack, w)
    docs, real = _doc_facts(c, pack)
    wrong = []
    for r in range(c):
        for qi, p in enumerate(ranks[r]):
            if not real[p]:
                continue
            got = sum(2 ** k for s in range(c) for ki, k in enumerate(ranks[(r - s) % c])
                      if _pack_mask(behaviour, w, p, k, qi, ki, (r - s) % c == r, docs, real))
            want = sum(2 ** k for k in range(p + 1) if docs[k] == docs[p] and real[k] and p - k < w)
            if got != want:
                wrong.append(p)
    return sorted(wrong)


def pack_pair_differs(behaviour, layout: str, c: int, pack, w: int, p: int, k: int) -> bool:
    ranks = pack_holds(layout, c, pack, w)
    docs, real = _doc_facts(c, pack)
    at = {x: (r, i) for r, xs in enumerate(ranks) for i, x in enumerate(xs)}
    (rp, qi), (rk, ki) = at[p], at[k]
    want = docs[p] == docs[k] and real[k] and 0 <= p - k < w
    return real[p] and _pack_mask(behaviour, w, p, k, qi, ki, rp == rk, docs, real) != want


def all_packs(c: int, units: int):
    """Every pack of ``units`` units: documents of u units in order, each with 1 ≤ a ≤ u real units."""
    if units == 0:
        yield ()
        return
    for u in range(1, units + 1):
        for a in range(1, u + 1):
            for rest in all_packs(c, units - u):
                yield ((u, a),) + rest
