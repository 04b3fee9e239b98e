"""A loss term's per-sequence and per-token normalisations run on concrete sequences (docs/semantics.md,
"Loss terms", per-sequence normalisations). Independent of the checker's code: every device of a small
mesh (data axis ``dp``, an optional tensor axis ``tp`` whose ranks hold the same sequences) runs its
microbatches' sequences, each token with a gradient contribution of its own, forms the term's loss as the
path states it (its normaliser, its token or sequence count, its divisor), and the gradients are summed
over the data ranks and the microbatches (data parallelism's reduction as the placements derive it). The
single-device objective weighs every token by the objective's own rule over the whole batch."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

SEQUENCE = ("per_sequence_mean", "per_sequence_sum")


def objective_value(objective: str, cells: dict, grads: dict) -> Fraction:
    """Σ weight · gradient over every token of the step, the weights the objective's."""
    seqs = [(c, i) for c in cells for i in range(len(cells[c]))]
    tokens = sum(sum(cells[c]) for c in cells)
    out = Fraction(0)
    for c, i in seqs:
        n = cells[c][i]
        for t in range(n):
            g = grads[(c, i, t)]
            if objective == "global_mean":
                out += g / tokens
            elif objective == "sum":
                out += g
            elif objective == "per_sequence_mean":
                out += g / n / len(seqs)
            else:  # per_sequence_sum
                out += g / len(seqs)
    return out


def _units(objective: str, path: str, lengths: list[int]) -> int:
    """The count a path's normaliser counts in one cell: sequences or tokens."""
    seq = path in SEQUENCE or (objective in SEQUENCE and path != "global_mean")
    return len(lengths) if seq else sum(lengths)


def path_value(objective: str, path: str, sizes: dict, cells: dict, grads: dict, count_axes: tuple | None,
               divisor: Fraction | None) -> Fraction:
    """The gradient one device ends with: each (dp rank, microbatch) cell's loss under the path, summed over dp
    and the microbatches, divided by the path's divisor (``divide by X`` replaces it)."""
    dp, tp, m = sizes["dp"], sizes.get("tp", 1), sizes["microbatches"]
    inner_mean = path == "per_sequence_mean" or (path not in SEQUENCE + ("global_mean",)
                                                 and objective == "per_sequence_mean")
    axes = ("dp",) if count_axes is None else count_axes

    def count(r: int) -> Fraction:  # the count the path divides by on data rank r, summed over its axes
        ranks = range(dp) if "dp" in axes else (r,)
        c = sum(_units(objective, path, cells[(q, u)]) for q in ranks for u in range(m))
        return Fraction(c * (tp if "tp" in axes else 1))

    total = Fraction(0)
    for r, u in product(range(dp), range(m)):
        lengths = cells[(r, u)]
        if path in ("per_microbatch_mean",):
            norm = Fraction(_units(objective, path, lengths))
        elif path == "per_device_mean":
            norm = Fraction(sum(_units(objective, path, cells[(r, v)]) for v in range(m)))
        elif path == "sum":
            norm = Fraction(1)
        else:  # global_mean, per_sequence_mean, per_sequence_sum: a count over the step
            norm = count(r)
        for i, n in enumerate(lengths):
            for t in range(n):
                g = grads[((r, u), i, t)]
                total += (g / n if inner_mean else g) / norm
    if divisor is None:
        divisor = Fraction(dp * m) if path == "per_microbatch_mean" else Fraction(dp) if path == "per_device_mean" \
            else Fraction(1)
    return total / divisor


def random_step(sizes: dict, rng: random.Random, equal: bool) -> tuple[dict, dict]:
    """Sequences of lengths 1..4 on every (dp rank, microbatch) cell, 1..3 per cell (the same number everywhere
    where ``equal``), and a gradient contribution per token."""
    dp, m = sizes["dp"], sizes["microbatches"]
    k = rng.randint(1, 3)
    cells = {(r, u): [rng.randint(1, 4) for _ in range(k if equal else rng.randint(1, 3))]
             for r, u in product(range(dp), range(m))}
    grads = {(c, i, t): Fraction(rng.randint(-5, 5), rng.randint(1, 3))
             for c, lens in cells.items() for i, n in enumerate(lens) for t in range(n)}
    return cells, grads


def violation(objective: str, path: str, sizes: dict, count_axes: tuple | None, divisor: Fraction | None,
              equal: bool, rng: random.Random, tries: int = 30) -> tuple | None:
    """A step (cells, the two values) where the path's gradient is not the objective's, if one of ``tries``
    random steps shows it."""
    for _ in range(tries):
        cells, grads = random_step(sizes, rng, equal)
        want = objective_value(objective, cells, grads)
        got = path_value(objective, path, sizes, cells, grads, count_axes, divisor)
        if want != got:
            return cells, want, got
    return None


# context parallelism: every sequence cut into slices over the ``cp`` ranks, each rank running its slices

def cut(n: int, cp: int, rng: random.Random) -> list[list[int]]:
    """The token positions of a sequence of ``n`` real tokens on each of ``cp`` ranks: contiguous slices at random cut
    points (padding to a multiple of cp, or a zigzag layout's chunks, leave slices of unequal real length; a rank may
    hold none), or, one time in three, the zigzag layout: 2·cp chunks of the padded sequence, rank r holding chunks r
    and 2·cp - 1 - r, the padding positions (>= n) dropped."""
    if rng.random() < 1 / 3:
        chunk = -(-n // (2 * cp))
        return [[t for c in (r, 2 * cp - 1 - r) for t in range(c * chunk, (c + 1) * chunk) if t < n] for r in range(cp)]
    points = sorted(rng.randint(0, n) for _ in range(cp - 1))
    bounds = [0] + points + [n]
    return [list(range(bounds[r], bounds[r + 1])) for r in range(cp)]


def path_value_cp(objective: str, path: str, sizes: dict, cells: dict, grads: dict, cuts: dict, length: str,
                  count_axes: tuple | None) -> Fraction:
    """The gradient one device ends with under context parallelism: on data rank r, context rank c, microbatch u,
    each sequence's slice ``cuts[cell][i][c]`` is reduced by the path, its token sum divided by the whole sequence's
    length (``length == "gathered"``) or by the slice's own (``"local"``; an empty slice adds nothing) where the path
    takes a token mean, over the step's sequence count (summed over dp and the microbatches, and times cp where
    ``count_axes`` names cp: each slice counted as a sequence); the ranks' gradients are summed over dp and cp (a
    sequence's slices are parts of one value) and the microbatches. Paths: the sequence count over the step
    (per_sequence_*), or each microbatch's own (per_microbatch_mean, averaged over dp and the microbatches)."""
    dp, cp, m = sizes["dp"], sizes["cp"], sizes["microbatches"]
    mean = path == "per_sequence_mean" or (path == "per_microbatch_mean" and objective == "per_sequence_mean")
    axes = ("dp",) if count_axes is None else count_axes
    total = Fraction(0)
    for r, u, c in product(range(dp), range(m), range(cp)):
        if path == "per_microbatch_mean":
            norm = Fraction(len(cells[(r, u)]) * dp * m)
        else:
            ranks = range(dp) if "dp" in axes else (r,)
            norm = Fraction(sum(len(cells[(q, v)]) for q in ranks for v in range(m)) * (cp if "cp" in axes else 1))
        for i, n in enumerate(cells[(r, u)]):
            part = cuts[(r, u)][i][c]
            if not part:
                continue
            den = (n if length == "gathered" else len(part)) if mean else 1
            total += sum(grads[((r, u), i, t)] for t in part) / den / norm
    return total


def violation_cp(objective: str, path: str, sizes: dict, length: str, count_axes: tuple | None, equal: bool,
                 rng: random.Random, tries: int = 30) -> tuple | None:
    """A step (cells, cuts, the two values) where the context-parallel path's gradient is not the objective's."""
    for _ in range(tries):
        cells, grads = random_step(sizes, rng, equal)
        cuts = {k: [cut(n, sizes["cp"], rng) for n in lens] for k, lens in cells.items()}
        want = objective_value(objective, cells, grads)
        got = path_value_cp(objective, path, sizes, cells, grads, cuts, length, count_axes)
        if want != got:
            return cells, cuts, want, got
    return None
