"""The simulator's section for a clip coefficient or a divisor on a set of one axis's ranks
(docs/semantics.md, "Per-rank operations and partial values"), written from the semantics
without the checker's code.

``update_violations``: every device applies to each group's gradient the coefficient of a
``clip_on_ranks`` / ``divide_on_ranks`` statement when its rank in the process group over the named
axes (its coordinates there as one number, the first axis most significant) is one of the named ranks (each rank expression evaluated at the sizes; a value that is not a whole
number in [0, n) names no rank): ``("update", group)`` where two devices' updates differ, or where a
clip is skipped on some device (single-device training clips every element). A divisor named on no
rank at a size divides nowhere there: the derived step.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from simulator import _value, groups_of

from placement_logic import ir

VERBS = ("clip_on_ranks", "divide_on_ranks")


def _stated(plan: ir.Plan, verb: str, group: str) -> ir.Override | None:
    for who in (group, "all", None):
        found = [o for o in plan.overrides if o.target == "grads" and o.verb == verb and o.group == who]
        if found:
            return found[-1]
    return None


def _group(o: ir.Override, sizes: dict[str, int]) -> int:
    """The ranks of the process group over the named axes."""
    n = 1
    for a in o.axes:
        n *= sizes[a]
    return n


def group_rank(o: ir.Override, coords: dict[str, int], sizes: dict[str, int]) -> int:
    """A device's rank in the group over the named axes: its coordinates there as one number, the first
    named axis the most significant digit (a device mesh flattened over those axes)."""
    digits = [(coords[a], sizes[a]) for a in o.axes]
    k, weight = 0, 1
    for c, n in reversed(digits):
        k += c * weight
        weight *= n
    return k


def named(o: ir.Override, sizes: dict[str, int], plan: ir.Plan, bindings: dict) -> set[int]:
    n = _group(o, sizes)
    out = set()
    for r in o.ranks or ():
        v = _value(r, sizes, plan, bindings)
        if v.denominator == 1 and 0 <= v < n:
            out.add(int(v))
    return out


def update_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    out = set()
    axes = list(plan.mesh.names)
    devices = list(product(*[range(sizes[a]) for a in axes]))
    for g in groups_of(plan):
        import simulator_rankclips  # two or more clips: counted per device there

        ops = [o for o in (_stated(plan, v, g) for v in VERBS) if o is not None
               and not (o.verb == "divide_on_ranks" and combined(plan, g))  # a product: product_violations
               and not (o.verb == "clip_on_ranks" and simulator_rankclips.combined(plan, g))]
        if not ops:
            continue
        grad = Fraction(rng.choice([-3, -1, 1, 2, 5]))
        coefs = []
        for o in ops:
            if o.verb == "clip_on_ranks":
                # a norm above max_norm (the step a clip changes; below it every rank's coefficient is 1)
                cap = Fraction(rng.randint(1, 4))
                norm = cap + rng.randint(1, 4)
                coefs.append((o, min(Fraction(1), cap / norm), named(o, sizes, plan, bindings)))
            else:
                coefs.append((o, 1 / _value(o.by, sizes, plan, bindings), named(o, sizes, plan, bindings)))
        # single-device training clips every element and divides by nothing beyond the step's normalisation
        reference = grad
        for o, c, _ in coefs:
            if o.verb == "clip_on_ranks":
                reference *= c
        updates = set()
        for d in devices:
            upd = grad
            for o, c, ranks in coefs:
                if group_rank(o, dict(zip(axes, d)), sizes) in ranks:
                    upd *= c
            updates.add(upd)
        # the ranks disagree, a clip (coefficient below 1) is skipped on some rank, or a divisor is applied on
        # some rank (on every rank alike too: the gradient divided again)
        if updates != {reference}:
            out.add(("update", g))
    return out


def _count_stated(plan: ir.Plan, group: str) -> ir.Override | None:
    for who in (group, "all", None):
        found = [o for o in plan.overrides if o.target == "clip_norm" and o.verb == "count_on_ranks" and o.group == who]
        if found:
            return found[-1]
    return None


def norm_counted(plan: ir.Plan, group: str, coords: dict[str, int], sizes: dict[str, int], bindings: dict) -> bool:
    """``clip_norm[g]: count_on_ranks over (AXES) ranks (...)``: the device contributes g's squared norm
    only where its rank in the process group over AXES (its coordinates there as one number, the first axis most
    significant) is one of the named ranks (each rank evaluated at the sizes)."""
    o = _count_stated(plan, group)
    return o is None or group_rank(o, coords, sizes) in named(o, sizes, plan, bindings)


def norm_ranked_axes(plan: ir.Plan, group: str) -> set[str]:
    """The axis whose ranks the statement names: there it, not the duplicate filter, says who counts g."""
    o = _count_stated(plan, group)
    return set(o.axes or ()) if o is not None else set()


# two or more divisors on sets of ranks for one group: each device applies the product of those naming it
DIVISORS = ("divide_rank0_only", "divide_except_last", "divide_last_only", "divide_on_ranks")


def divisors(plan: ir.Plan, group: str) -> list[ir.Override]:
    """The group's divisor statements on sets of ranks: per verb every one of its own, else of the plan's
    (``all``, then no group); two of one verb both divide."""
    return stated(plan, group, DIVISORS)


def stated(plan: ir.Plan, group: str, verbs: tuple[str, ...]) -> list[ir.Override]:
    """The ``grads`` statements of the verbs that apply to the group: per verb every one of the group's
    own, else of the plan's (``all``, then no group)."""
    out = []
    for verb in verbs:
        for who in (group, "all", None):
            found = [o for o in plan.overrides if o.target == "grads" and o.verb == verb and o.group == who]
            if found:
                out += found
                break
    return out


def combined(plan: ir.Plan, group: str) -> bool:
    """Two or more divisors for the group: their product is computed here, not by each verb's own section."""
    return len(divisors(plan, group)) >= 2


def _names(o: ir.Override, coords: dict[str, int], sizes: dict[str, int], plan: ir.Plan, bindings: dict) -> bool:
    """Whether the statement's rank set holds the device (docs/semantics.md, "Per-rank operations")."""
    if o.verb == "divide_on_ranks":
        return group_rank(o, coords, sizes) in named(o, sizes, plan, bindings)
    if o.verb == "divide_rank0_only":
        return all(coords[a] == 0 for a in o.axes)
    last = all(coords[a] == sizes[a] - 1 for a in o.axes)
    return last if o.verb == "divide_last_only" else not last


def product_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    out = set()
    axes = list(plan.mesh.names)
    for g in groups_of(plan):
        if not combined(plan, g):
            continue
        grad = Fraction(rng.choice([-3, -1, 1, 2, 5]))
        ops = divisors(plan, g)
        updates = set()
        for d in product(*[range(sizes[a]) for a in axes]):
            coords = dict(zip(axes, d))
            upd = grad
            for o in ops:
                if _names(o, coords, sizes, plan, bindings):
                    upd /= _value(o.by, sizes, plan, bindings)
            updates.add(upd)
        if updates != {grad}:  # two ranks' products differ, or every rank divides alike: a division too many
            out.add(("update", g))
    return out
