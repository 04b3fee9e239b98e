"""The simulator's section for per-rank operations on the update and the loss scale, and the
epsilon on each rank's squared norm (docs/semantics.md, "Per-rank operations and partial
values"), written from the semantics without the checker's code.

``update_violations``: every device applies to each group's gradient the coefficients the plan
says it applies on that device (a clip coefficient min(1, max_norm / norm) or a division by X,
on rank 0 of the named axes only), against single-device training, which applies them to every
element: ``("update", group)`` where some device's update differs. ``scale_violations``: each
device's found-inf flag (its shards' flags, all-reduced over the overflow axes but the ones the
loss scale reads locally; random flags and each shard's overflow alone), the scale halved where
it is set, against the scale single-device training reaches: ``("loss_scale",)``. ``eps_part``: ε on every device, through the plan's norm
reduction (a sum, an average or a max over its axes, an axis twice when stated twice).
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from simulator import _allmax, _allreduce, _overrides, _value, grad_shard_axes, groups_of

from placement_logic import ir


def _stated(plan: ir.Plan, verb: str, group: str) -> ir.Override | None:
    for who in (group, "all", None):
        found = [o for o in plan.overrides if o.target == "grads" and o.verb == verb and o.group == who]
        if found:
            return found[-1]
    return None


def update_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    out = set()
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    devices = list(product(*[range(sizes[a]) for a in axes]))
    for g in groups_of(plan):
        import simulator_rankclips  # two or more clips for g: counted per device (simulator_rankclips)
        import simulator_rankset  # two or more divisors for g: their product (simulator_rankset)

        ops = [o for o in (_stated(plan, v, g) for v in ("clip_rank0_only", "divide_rank0_only")) if o is not None
               and not (o.verb == "divide_rank0_only" and simulator_rankset.combined(plan, g))
               and not (o.verb == "clip_rank0_only" and simulator_rankclips.combined(plan, g))]
        if not ops:
            continue
        grad = Fraction(rng.choice([-3, -1, 1, 2, 5]))
        coefs = []
        for o in ops:
            if o.verb == "clip_rank0_only":
                # a norm above max_norm (the step a clip changes; below it every rank's coefficient is 1)
                cap = Fraction(rng.randint(1, 4))
                norm = cap + rng.randint(1, 4)
                coefs.append((o, min(Fraction(1), cap / norm)))
            else:
                coefs.append((o, 1 / _value(o.by, sizes, plan, bindings)))
        reference = grad  # single-device training clips every element and divides by nothing more
        for o, c in coefs:
            if o.verb == "clip_rank0_only":
                reference *= c
        for d in devices:
            upd = grad
            for o, c in coefs:
                if all(d[pos[a]] == 0 for a in o.axes or ()):
                    upd *= c
            if upd != reference:
                out.add(("update", g))
                break
    return out


def scale_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random) -> set:
    local = _overrides(plan, "loss_scale", "local")
    if not local:
        return set()
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    devices = list(product(*[range(sizes[a]) for a in axes]))
    groups = groups_of(plan)
    shard = {g: grad_shard_axes(plan, g) for g in groups}
    ovf = _overrides(plan, "overflow", "reduce")
    reduced = list(ovf[-1].axes or ()) if ovf else [a for a in axes if any(a in shard[g] for g in groups)]
    read = [a for a in reduced if a not in (local[-1].axes or ())]
    shards = [(g, s) for g in groups for s in product(*[range(sizes[a]) for a in shard[g]])]
    # random flags, and every single shard's overflow alone (a random draw often sets a replicated group's
    # flag, which every device sees, and then misses a shard seen by one rank only)
    tries = [{k: rng.random() < 0.3 for k in shards}] + [{k: k == one for k in shards} for one in shards]
    start = 2 ** 16
    for flags in tries:
        buf = {d: any(flags[(g, tuple(d[pos[a]] for a in shard[g]))] for g in groups) for d in devices}
        for a in read:
            seen: dict = {}
            for d, v in buf.items():
                key = d[:pos[a]] + d[pos[a] + 1:]
                seen[key] = seen.get(key, False) or v
            buf = {d: seen[d[:pos[a]] + d[pos[a] + 1:]] for d in buf}
        single = start // 2 if any(flags.values()) else start
        if any((start // 2 if v else start) != single for v in buf.values()):
            return {("loss_scale",)}
    return set()


def eps_part(plan: ir.Plan, sizes: dict[str, int], o: ir.Override, plan_axes: list[str], how: str,
             bindings: dict) -> tuple[Fraction, dict]:
    """ε, and what each device holds after ε on every device goes through the plan's reduction."""
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    eps = _value(o.by, sizes, plan, bindings)
    part = {d: eps for d in product(*[range(sizes[a]) for a in axes])}
    for a in plan_axes:
        if how == "max":
            part = _allmax(part, pos[a])
        else:
            part = _allreduce(part, pos[a])
            if how == "average":
                part = {d: v / sizes[a] for d, v in part.items()}
    return eps, part
