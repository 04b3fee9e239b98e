"""An independent concrete simulator of the MoE router's top-k choice on every rank of a mesh.

Each rank holds a block of tokens: the block is named by the rank's coordinates on the axes that split
the batch or the layers (every axis but the tensor ones, and the tensor ones too under sequence
parallelism, whose ranks hold sequence shards). The hidden vector of a token is cut into summands, one
per tensor rank (hidden index i belongs to tensor rank i mod T); the row-parallel linear's output is their
sum. Every rank routes each token it holds: scores = router weights · its input + noise, top-k by score
(ties to the lower expert). The noise for a token is drawn from a generator seeded with the rank's
coordinates on the axes its seed varies over (none: a generator shared by every rank). The router's input
is the reduced hidden vector, or, under ``input_partial``, the summand of the rank's coordinates on the
named tensor axes (the others' sums already taken).

``consistent`` is True when every token is routed identically (same experts, same scores) by every rank
that holds it, and as the reduced input with that noise routes it; False otherwise. No checker code is used.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

TENSOR_ROLES = ("tensor", "sequence")


def _route(scores: list[Fraction], k: int) -> tuple:
    order = sorted(range(len(scores)), key=lambda e: (-scores[e], e))[:k]
    return tuple((e, scores[e]) for e in sorted(order))


def consistent(sizes: dict[str, int], roles: dict[str, str], sp: bool, verb: str | None, axes: tuple[str, ...],
               experts: int, top_k: int, tokens: int = 4, seed: int = 0) -> bool:
    names = list(sizes)
    tensor = [a for a in names if roles.get(a) in TENSOR_ROLES]
    sp = sp or any(roles.get(a) == "sequence" for a in names)
    block_axes = [a for a in names if a not in tensor or sp]
    t_count = 1
    for a in tensor:
        t_count *= sizes[a]
    hidden = 2 * t_count
    rnd = random.Random(seed)
    weights = [[Fraction(rnd.randint(-4, 4)) for _ in range(hidden)] for _ in range(experts)]
    cache: dict = {}

    def token(block, j):
        key = (block, j)
        if key not in cache:
            r = random.Random(hash((seed, 1, key)))
            cache[key] = [Fraction(r.randint(-6, 6)) for _ in range(hidden)]
        return cache[key]

    def owner(i: int) -> dict[str, int]:
        """The tensor coordinates hidden index i belongs to."""
        flat, out = i % t_count, {}
        for a in reversed(tensor):
            out[a] = flat % sizes[a]
            flat //= sizes[a]
        return out

    def noise(rank: dict[str, int], key) -> list[Fraction]:
        seeded = tuple(rank[a] for a in axes if a in rank) if verb == "vary" else ()
        r = random.Random(hash((seed, 2, seeded, key)))
        return [Fraction(r.randint(0, 40), 4) for _ in range(experts)]

    partial = [a for a in axes if a in tensor] if verb == "input_partial" else []
    routed: dict = {}
    for coords in product(*(range(sizes[a]) for a in names)):
        rank = dict(zip(names, coords))
        block = tuple(rank[a] for a in block_axes)
        for j in range(tokens):
            h = token(block, j)
            x = [v if all(owner(i)[a] == rank[a] for a in partial) else Fraction(0) for i, v in enumerate(h)]
            eps = noise(rank, (block, j))
            got = _route([sum((w * v for w, v in zip(weights[e], x)), Fraction(0)) + eps[e] for e in range(experts)],
                         top_k)
            want = _route([sum((w * v for w, v in zip(weights[e], h)), Fraction(0)) + eps[e] for e in range(experts)],
                          top_k)
            if got != want or routed.setdefault((block, j), got) != got:
                return False
    return True
