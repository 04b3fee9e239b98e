"""The simulator's section for two or more clips on sets of ranks for one group (docs/semantics.md,
"Per-rank operations and partial values"), written from the semantics without the checker's code.

``clip_violations``: the group's clip statements (``clip_rank0_only`` on rank 0 of each named axis,
``clip_on_ranks`` on the named ranks of the process group over its axes, the first axis the most
significant), every statement of a verb at the first of the group, ``all`` and no group that states the
verb; where there are two or more, each device multiplies its gradient by the clip coefficient once per
statement whose rank set holds it, against single-device training, which multiplies every element once:
``("update", group)`` where some device's update differs. With one clip statement the verb's own section
(simulator_perrank, simulator_rankset) decides.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from simulator import groups_of
from simulator_rankset import group_rank, named, stated

from placement_logic import ir

CLIP_VERBS = ("clip_rank0_only", "clip_on_ranks")


def clips(plan: ir.Plan, group: str) -> list[ir.Override]:
    """Every clip statement on sets of ranks that applies to the group: per verb, the group's own, else
    the plan's (``all``, then no group)."""
    return stated(plan, group, CLIP_VERBS)


def combined(plan: ir.Plan, group: str) -> bool:
    """Two or more clips for the group: counted here, not by each verb's own section."""
    return len(clips(plan, group)) >= 2


def _holds(o: ir.Override, coords: dict[str, int], sizes: dict[str, int], plan: ir.Plan, bindings: dict) -> bool:
    if o.verb == "clip_rank0_only":
        return all(coords[a] == 0 for a in o.axes)
    return group_rank(o, coords, sizes) in named(o, sizes, plan, bindings)


def clip_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    out = set()
    axes = list(plan.mesh.names)
    devices = [dict(zip(axes, d)) for d in product(*[range(sizes[a]) for a in axes])]
    for g in groups_of(plan):
        ops = clips(plan, g)
        if len(ops) < 2:
            continue
        grad = Fraction(rng.choice([-3, -1, 1, 2, 5]))
        cap = Fraction(rng.randint(1, 4))
        norm = cap + rng.randint(1, 4)  # a norm above max_norm: the step a clip changes
        coef = cap / norm
        reference = grad * coef  # single-device training clips every element once
        for d in devices:
            upd = grad
            for o in ops:
                if _holds(o, d, sizes, plan, bindings):
                    upd *= coef
            if upd != reference:
                out.add(("update", g))
                break
    return out
