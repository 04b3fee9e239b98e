"""The simulator's section for the grad norm's epsilon on some ranks (docs/semantics.md, "Global reductions"),
written from the semantics without the checker's code.

``eps_part``: ``override clip_norm: eps_on_ranks over (AXES) ranks (R1, ...) by EPS`` -- every device whose rank
in the group over AXES (its coordinates there, the first axis most significant) is named holds ε, every other
0; that passes through the plan's norm reduction (a sum over each of its axes in turn) and is added to each
device's squared norm; single-device training adds ε once.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from simulator import _allreduce, _value
from simulator_rankset import group_rank, named

from placement_logic import ir


def stated(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in plan.overrides if o.target == "clip_norm" and o.verb == "eps_on_ranks"), None)


def eps_part(plan: ir.Plan, o: ir.Override, sizes: dict[str, int], norm_axes: list[str],
             bindings: dict) -> tuple[Fraction, dict]:
    """ε, and what each device holds after the named ranks' ε goes through the plan's sum over its norm axes."""
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    eps = _value(o.by, sizes, plan, bindings)
    ranks = named(o, sizes, plan, bindings)
    part = {d: (eps if group_rank(o, dict(zip(axes, d)), sizes) in ranks else Fraction(0))
            for d in product(*[range(sizes[a]) for a in axes])}
    for a in norm_axes:
        part = _allreduce(part, pos[a])
    return eps, part
