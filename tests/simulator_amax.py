"""The simulator's section for the fp8 amax (docs/semantics.md, "Per-rank operations and partial values"),
written from the semantics without the checker's code.

Each device holds a piece of a group's fp8 tensors: pieces differ between the ranks of a data, context,
sequence or expert axis (different tokens) and of a tensor axis where the group's gradient (so its weight)
is split or the plan is sequence-parallel; the pieces' largest magnitudes are drawn at random. A device's
amax is the maximum over the devices it all-reduces with (every axis over which the pieces differ, but
the ones ``amax[g]: local`` names, or those ``amax[g]: reduce`` leaves out); its scale is 448 / amax. Single-device training's is 448 / the maximum
over every piece. The statements hold together in any order: every ``local`` naming g or every group leaves its
axes out; the ``reduce`` axes are those of g's own ``reduce`` statements, or where g has none of the ones for every
group. ``violations``: ``("amax", g)`` where some device's scale differs.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from simulator import grad_shard_axes, groups_of

from placement_logic import ir

TOKENS = (ir.Role.DATA, ir.Role.CONTEXT, ir.Role.SEQUENCE, ir.Role.EXPERT)


def violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random) -> set:
    out = set()
    axes = list(plan.mesh.names)
    devices = list(product(*[range(sizes[a]) for a in axes]))
    sp = plan.sequence_parallel or any(plan.role(a) is ir.Role.SEQUENCE for a in axes)
    for g in groups_of(plan):
        stmts = [o for o in plan.overrides if o.target == "amax" and o.verb in ("local", "reduce")
                 and o.group in (None, "all", g)]
        if not stmts:
            continue
        named = {a for o in stmts if o.verb == "local" for a in (o.axes or ())}
        red = [o for o in stmts if o.verb == "reduce" and o.group == g] or [o for o in stmts if o.verb == "reduce"]
        if red:
            named |= {a for a in axes if not any(a in (o.axes or ()) for o in red)}
        split = grad_shard_axes(plan, g)
        differ = [a for a in axes if plan.role(a) in TOKENS or (plan.role(a) is ir.Role.TENSOR and (a in split or sp))]
        piece = {}
        for d in devices:
            key = tuple(d[axes.index(a)] for a in differ)
            piece.setdefault(key, rng.choice([1, 2, 3, 4]))
        value = {d: piece[tuple(d[axes.index(a)] for a in differ)] for d in devices}
        reduced = [a for a in differ if a not in named]
        single = Fraction(448, max(value.values()))
        for d in devices:
            peers = [e for e in devices if all(e[i] == d[i] for i, a in enumerate(axes) if a not in reduced)]
            if Fraction(448, max(value[e] for e in peers)) != single:
                out.add(("amax", g))
                break
    return out
