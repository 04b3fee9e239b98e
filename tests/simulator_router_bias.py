"""An independent concrete simulator of the aux-loss-free routing bias's update on every rank of a mesh.

Every device is enumerated by its coordinates. A device holds a block of tokens named by its coordinates on
the axes whose ranks hold different tokens (data, context, expert, and tensor under sequence parallelism;
a tensor axis without it replicates the block). Each token is routed top-1 to an expert drawn at random per
(block, token). A device counts its tokens per expert; the counts are then all-reduced over the stated axes by
summing, for every device, the counts of every device that differs from it only on those axes. Each device
moves the bias by sign(mean - count_e) per expert. The single device counts every distinct block once.

``agrees`` is True when every device's step equals the single device's. No checker code is used.
"""

from __future__ import annotations

import random
from itertools import product

TOKEN_ROLES = ("data", "context", "expert")


def _step(counts: list[int]) -> tuple[int, ...]:
    e = len(counts)
    total = sum(counts)
    # sign(total / e - c), compared in integers
    return tuple((total > c * e) - (total < c * e) for c in counts)


def agrees(sizes: dict[str, int], roles: dict[str, str], axes: tuple[str, ...], experts: int,
           tokens: int = 3, seed: int = 0, trials: int = 8) -> bool:
    names = list(sizes)
    sp = any(roles[a] == "sequence" for a in names)
    split = [a for a in names if roles[a] in TOKEN_ROLES or (sp and roles[a] in ("tensor", "sequence"))]
    devices = [dict(zip(names, c)) for c in product(*(range(sizes[a]) for a in names))]
    for t in range(trials):
        rnd = random.Random(hash((seed, t)))
        blocks: dict[tuple, list[int]] = {}
        for d in devices:
            key = tuple(d[a] for a in split)
            if key not in blocks:
                counts = [0] * experts
                for _ in range(tokens):
                    counts[rnd.randrange(experts)] += 1
                blocks[key] = counts
        local = [blocks[tuple(d[a] for a in split)] for d in devices]
        single = _step([sum(b[e] for b in blocks.values()) for e in range(experts)])
        for d in devices:
            peers = [j for j, p in enumerate(devices) if all(p[a] == d[a] for a in names if a not in axes)]
            reduced = [sum(local[j][e] for j in peers) for e in range(experts)]
            if _step(reduced) != single:
                return False
    return True
