"""The MoE dispatch's capacity step computed on concrete router calls, written from docs/semantics.md
("Loss terms", the capacity step) without the checker's code.

A router call is a list of positions in order, each (padded?, probabilities over the E experts, the
experts it chose). The capacity step lets every expert keep C = ceil(capacity_factor · k · N / E) of the
positions that chose it: those with the highest probability of that expert, ties to the earlier position.
The objective masks the padded positions out first (N counts the real tokens); a path that counts padding
(``capacity: counts_padding``) lets them in (N counts every position). ``order="position"`` keeps the first
positions instead (the order the checker used before router scores), to show which witnesses depend on it.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product


def ceiling(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def dispatch(call: list, experts: int, top_k: int, factor: Fraction, with_padding: bool,
             order: str = "score") -> set[tuple[int, int]]:
    """The (position, expert) pairs of real tokens the experts process."""
    entering = [n for n, (pad, _, _) in enumerate(call) if with_padding or not pad]
    cap = ceiling(Fraction(factor) * top_k * len(entering) / experts)
    out = set()
    for i in range(experts):
        wanting = [n for n in entering if i in call[n][2]]
        if order == "score":
            wanting.sort(key=lambda n: (-call[n][1][i], n))
        for n in wanting[:cap]:
            if not call[n][0]:
                out.add((n, i))
    return out


def routing(rng: random.Random, experts: int, top_k: int) -> tuple[tuple[Fraction, ...], tuple[int, ...]]:
    """Exact positive probabilities and their top-k (ties to the lower index)."""
    w = [rng.randint(1, 6) for _ in range(experts)]
    p = tuple(Fraction(x, sum(w)) for x in w)
    return p, tuple(sorted(sorted(range(experts), key=lambda i: (-p[i], i))[:top_k]))


def calls(experts: int, top_k: int, seed: int = 0, tries: int = 300, longest: int = 6):
    """Random router calls: up to ``longest`` positions, real tokens first, then padding (right padding)."""
    rng = random.Random(seed)
    for _ in range(tries):
        real, pads = rng.randint(1, longest // 2), rng.randint(0, longest // 2)
        yield [(n >= real,) + routing(rng, experts, top_k) for n in range(real + pads)]


def differs(experts: int, top_k: int, factor: Fraction, seed: int = 0) -> list | None:
    """A router call on which counting the padding changes the real tokens kept, or None."""
    for call in calls(experts, top_k, seed):
        if dispatch(call, experts, top_k, factor, True) != dispatch(call, experts, top_k, factor, False):
            return call
    # longer calls of two shapes: padding outscoring the real tokens on expert 0, and every position alike
    flat = tuple(Fraction(1, experts) for _ in range(experts))
    high = tuple(Fraction(2 if i == 0 else 1, experts + 1) for i in range(experts)) if experts > 1 else flat
    for real, pads, p_pad in product(range(1, 13), range(1, 17), (high, flat)):
        call = [(n >= real, p_pad if n >= real else flat, tuple(range(top_k))) for n in range(real + pads)]
        if dispatch(call, experts, top_k, factor, True) != dispatch(call, experts, top_k, factor, False):
            return call
    return None
