"""The concrete simulator of bucketed gradient reductions with a per-rank buffer layout, written
from docs/semantics.md ("Gradient bucket layout") without the checker's code.

``bucket_violations(plan, sizes)`` builds, for every group an ``override grads[G]: bucket_order
over (AXES)`` names, the flat gradient buffers of the ranks of each named axis (rank 0 of the axis
in registration order, the others in the reverse order), runs the collectives the plan runs on
them element by element at equal offsets, reads every parameter element back through each rank's
own layout and compares it with the true sum of that element. It returns ``{("buckets",)}`` when
some element read back is wrong, else the empty set.

The collectives: every data-like or expert axis the group's gradient is all-reduced or
reduce-scattered over (``simulator.reductions``), and the sequence-parallel all-reduce of the
norms; for the tied embedding over a pipeline axis, the data axes' reduce-scatter (grads S) runs
first on each stage's buffer, in which the embedding is the first tensor on the first stage and
the last on the last, and then the tied all-reduce over the stages of the embedding's elements.
"""

from __future__ import annotations

import random
from fractions import Fraction
from math import prod

import simulator as sim

from placement_logic import ir

TENSORS = (("P", 2), ("Q", 3), ("R", 1))  # a bucket's tensors in registration order


def _layout(rank: int) -> list[tuple[str, int]]:
    order = TENSORS if rank == 0 else tuple(reversed(TENSORS))
    return [(name, i) for name, n in order for i in range(n)]


def _flat_wrong(n: int, rng: random.Random) -> bool:
    """n ranks, each with its own gradient per element, all-reduce their buffers by offset."""
    grads = [{(name, i): Fraction(rng.randint(1, 99)) for name, k in TENSORS for i in range(k)} for _ in range(n)]
    bufs = [[grads[r][e] for e in _layout(r)] for r in range(n)]
    summed = [sum(b[o] for b in bufs) for o in range(len(bufs[0]))]
    for r in range(n):
        for o, e in enumerate(_layout(r)):
            if summed[o] != sum(g[e] for g in grads):
                return True
    return False


def _tie_wrong(n: int, rng: random.Random) -> bool:
    """Two stages (first, last) of n data ranks each; a buffer of the embedding (E, 2 elements) and
    the stage's other weights, padded to a multiple of n; reduce-scatter over the n ranks, then the
    all-reduce of E over the two stages on each data rank; the owner of each E element on a stage
    must hold the true total."""
    e_len, other = 2, 2 * n - 2
    stages = {"first": [("E", i) for i in range(e_len)] + [("W", i) for i in range(other)],
              "last": [("V", i) for i in range(other)] + [("E", i) for i in range(e_len)]}
    size = e_len + other
    chunk = size // n
    g = {(s, d): {e: Fraction(rng.randint(1, 99)) for e in lay} for s, lay in stages.items() for d in range(n)}
    held = {}
    for s, lay in stages.items():
        for d in range(n):
            buf = [g[(s, d)][e] for e in lay]
            lo, hi = d * chunk, (d + 1) * chunk
            for o in range(lo, hi):
                buf[o] = sum(g[(s, x)][lay[o]] for x in range(n))
            held[(s, d)] = buf
    true = {("E", i): sum(g[(s, d)][("E", i)] for s in stages for d in range(n)) for i in range(e_len)}
    for lay in stages.values():
        for d in range(n):
            for o in range(d * chunk, (d + 1) * chunk):
                if lay[o][0] != "E":
                    continue
                tied = sum(held[(t, d)][stages[t].index(lay[o])] for t in stages)
                if tied != true[lay[o]]:
                    return True
    return False


def bucket_violations(plan: ir.Plan, sizes: dict[str, int], seed: int = 7) -> set:
    rng = random.Random(seed)
    for g in sim.groups_of(plan):
        axes = [a for o in plan.overrides if o.target == "grads" and o.verb == "bucket_order"
                and o.group in (None, "all", g) for a in (o.axes or ())]
        if not axes:
            continue
        counts = sim.reductions(plan, g)
        for a in dict.fromkeys(axes):
            if sizes[a] < 2 or counts[a] < 1:
                continue
            t = sim.axis_type(plan, g, a)
            if t in (sim.PARTIAL, sim.SPLIT) and _flat_wrong(sizes[a], rng):
                return {("buckets",)}
            if t == sim.TIE:
                scatter = [s for s in sim.grad_shard_axes(plan, g) if plan.role(s) is ir.Role.DATA]
                n = prod(sizes[s] for s in scatter)
                if n >= 2 and _tie_wrong(n, rng):
                    return {("buckets",)}
    return set()
