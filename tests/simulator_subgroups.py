"""The simulator's section for process groups over part of an axis and divisors on a set of an
axis's ranks other than rank 0 (docs/semantics.md, "Process groups over part of an axis"), written
from the semantics without the checker's code.

A block of an axis: rank i of the axis is in block i // B, B consecutive ranks (the last block
shorter where B does not divide the axis). A strided group (``reduce_strided by S``): rank i is in
group i mod S. The first K ranks (``reduce_first by K``): ranks 0..K-1 form one group, every other
rank is a group of its own (it reduces nothing). Consecutive groups of unequal sizes (``reduce_groups
by (S1, S2, ...)``): rank i is in the group whose run of ranks holds it, counted by the running sums
S1, S1 + S2, ... that are <= i; the statement describes the axis at the size S1 + S2 + ... only, and at
another size the simulator reports nothing of it. A group spec is B (an int: blocks) or a pair (verb,
E), E a tuple of sizes for reduce_groups. The process groups of a list of rank sets (``reduce_sets ranks
([0, 2, 3], [1, 4])``): rank i is in the group of the set that lists it, found by looking it up in each
list; the statement describes the axis only at the number of ranks the sets hold, and (E) is the tuple of
sets. ``block_reduce``: a sum (or a maximum) over each group. ``grad_block_violations``: every device's contribution to a group's gradient drawn at
random, reduced over each named axis within its blocks, against the sum over every device of those
axes: ``("blocks", group)`` and ``("gi", group)`` where some device holds another value. ``update_violations``: a
division by X on every rank of the named axes but the last (the coordinate n - 1 on each), or on
that last rank only: ``("update", group)`` where two devices step the group by different
coefficients (single-device training applies one coefficient to every element; a divisor no rank
applies, as on an axis of one rank, is the same on every rank). ``norm_blocks``: the block size of each axis the grad norm's reduction runs
in blocks over (``simulator.norm_violations`` reduces there with ``block_reduce``).
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import accumulate, product

from simulator import _value, groups_of, reductions

from placement_logic import ir


def _stated(plan: ir.Plan, target: str, verb: str, group: str | None) -> ir.Override | None:
    for who in ((group, "all", None) if group is not None else (None,)):
        found = [o for o in plan.overrides if o.target == target and o.verb == verb and o.group == who]
        if found:
            return found[-1]
    return None


PARTITIONS = ("reduce_blocks", "reduce_strided", "reduce_first", "reduce_groups", "reduce_sets")


def _key(i: int, spec) -> tuple:
    """The group rank i of an axis is in, under ``spec`` (B, or (verb, E))."""
    verb, e = ("reduce_blocks", spec) if isinstance(spec, int) else spec
    if verb == "reduce_strided":
        return ("residue", i % e)
    if verb == "reduce_first":
        return ("first",) if i < e else ("alone", i)
    if verb == "reduce_groups":
        return ("run", sum(1 for end in accumulate(e) if end <= i))
    if verb == "reduce_sets":
        return ("set", [j for j, members in enumerate(e) if i in members][0])
    return ("block", i // e)


def block_reduce(buf: dict, i: int, b, how: str = "sum") -> dict:
    """Each device's value replaced by the sum (or maximum) over its group of the axis at position i."""
    out: dict = {}
    for d, v in buf.items():
        key = d[:i] + (_key(d[i], b),) + d[i + 1:]
        if key not in out:
            out[key] = v
        else:
            out[key] = max(out[key], v) if how == "max" else out[key] + v
    return {d: out[d[:i] + (_key(d[i], b),) + d[i + 1:]] for d in buf}


def block_len(i: int, b, n: int) -> int:
    """How many ranks the group of rank i holds (counted: the last block shorter where b does not divide n)."""
    return sum(1 for j in range(n) if _key(j, b) == _key(i, b))


def _block(o: ir.Override, sizes: dict[str, int], plan: ir.Plan, bindings: dict):
    if o.verb == "reduce_groups":
        return (o.verb, tuple(int(_value(s, sizes, plan, bindings)) for s in o.sizes))
    if o.verb == "reduce_sets":
        return (o.verb, tuple(frozenset(int(_value(r, sizes, plan, bindings)) for r in s) for s in o.sets))
    b = _value(o.by, sizes, plan, bindings)
    assert b.denominator == 1 and b >= 1, b
    return int(b) if o.verb == "reduce_blocks" else (o.verb, int(b))


def _cuts(plan: ir.Plan, target: str, group: str | None, sizes: dict[str, int], bindings: dict) -> dict:
    """Each axis of one reduction with the groups it is cut into: the statements of the first of the group's own,
    ``all`` and none that states any, each axis cut by the last statement naming it (statements over different
    axes combine: blocks over one axis, strided groups over another); a statement that does not describe its axis
    at these sizes (a list of sizes or sets holding another number of ranks) cuts nothing."""
    for who in ((group, "all", None) if group is not None else (None,)):
        found = [o for o in plan.overrides if o.target == target and o.verb in PARTITIONS and o.group == who]
        if found:
            out = {}
            for o in found:
                if o.verb == "reduce_sets" and len(o.axes or ()) > 1:
                    continue  # rank sets over several axes: sets_over_axes
                b = _block(o, sizes, plan, bindings)
                for a in o.axes or ():
                    out[a] = b if _describes(b, o, sizes) else None
            return {a: b for a, b in out.items() if b is not None}
    return {}


def _over_axes(plan: ir.Plan, group: str) -> list[ir.Override]:
    """The statements of group's gradient reduction that list rank sets over several axes (the same choice of
    statements as ``_cuts``: the group's own, else ``all``, else none)."""
    for who in (group, "all", None):
        found = [o for o in plan.overrides if o.target == "grads" and o.verb in PARTITIONS and o.group == who]
        if found:
            return [o for o in found if o.verb == "reduce_sets" and len(o.axes or ()) > 1]
    return []


def sets_over_axes(buf: dict, pos: dict, o: ir.Override, sizes: dict[str, int], reduced: set,
                   plan: ir.Plan, bindings: dict) -> tuple[dict, dict] | None:
    """Rank sets over several axes applied by enumerating the devices: the group ranks of the named axes numbered
    in the order ``itertools.product`` walks their coordinates (the last axis fastest), each device summing the
    devices of its set (its other coordinates kept); against the derived sum over the named axes the gradient is
    reduced over. None where the sets do not hold every rank of the product at these sizes."""
    names = list(o.axes)
    walk = list(product(*[range(sizes[a]) for a in names]))
    sets = [{int(_value(r, sizes, plan, bindings)) for r in s} for s in o.sets]
    if set().union(*sets) != set(range(len(walk))):
        return None
    set_of = {walk[r]: j for j, s in enumerate(sets) for r in s}
    mine = lambda d: tuple(d[pos[a]] for a in names)  # noqa: E731
    rest = lambda d: tuple(x for i, x in enumerate(d) if i not in {pos[a] for a in names})  # noqa: E731
    piece = lambda d: tuple(d[pos[a]] for a in names if a not in reduced)  # noqa: E731
    by_set: dict = {}
    by_piece: dict = {}
    for d, v in buf.items():
        by_set[(rest(d), set_of[mine(d)])] = by_set.get((rest(d), set_of[mine(d)]), 0) + v
        by_piece[(rest(d), piece(d))] = by_piece.get((rest(d), piece(d)), 0) + v
    return ({d: by_set[(rest(d), set_of[mine(d)])] for d in buf}, {d: by_piece[(rest(d), piece(d))] for d in buf})


def norm_blocks(plan: ir.Plan, sizes: dict[str, int], bindings: dict) -> dict:
    return _cuts(plan, "clip_norm", None, sizes, bindings)


def _describes(b, o: ir.Override, sizes: dict[str, int]) -> bool:
    """Whether the statement describes the axis at these sizes (a list of sizes: at their sum only)."""
    if isinstance(b, tuple) and b[0] == "reduce_sets":
        return set().union(*b[1]) == set(range(sizes[o.axes[0]]))
    return not (isinstance(b, tuple) and b[0] == "reduce_groups" and sum(b[1]) != sizes[o.axes[0]])


def grad_block_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    out = set()
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    devices = list(product(*[range(sizes[a]) for a in axes]))
    for g in groups_of(plan):
        cuts = _cuts(plan, "grads", g, sizes, bindings)
        multi = _over_axes(plan, g)
        if not cuts and not multi:
            continue
        buf = {d: Fraction(rng.randint(-3, 3)) for d in devices}
        whole, blocks = dict(buf), dict(buf)
        for a, b in cuts.items():
            whole = block_reduce(whole, pos[a], sizes[a])  # one block holding the whole axis
            blocks = block_reduce(blocks, pos[a], b)
        reduced = {a for a, k in reductions(plan, g).items() if k >= 1}
        for o in multi:
            both = sets_over_axes(dict(zip(devices, (blocks[d] for d in devices))), pos, o, sizes, reduced, plan,
                                  bindings)
            if both is not None:
                blocks = both[0]
                whole = sets_over_axes(whole, pos, o, sizes, reduced, plan, bindings)[1]
        if any(whole[d] != blocks[d] for d in devices):
            # the blocks hold different sums, so some device's gradient is not the global one: the
            # gradient entering the update is wrong whatever the rest of the plan does
            out |= {("blocks", g), ("gi", g)}
    return out


def _applied(verb: str, coords: list[int], ns: list[int]) -> bool:
    at_last = all(c == n - 1 for c, n in zip(coords, ns))
    return at_last if verb == "divide_last_only" else not at_last


def update_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    out = set()
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    devices = list(product(*[range(sizes[a]) for a in axes]))
    for g in groups_of(plan):
        import simulator_rankset  # two or more divisors for g: their product (simulator_rankset)

        ops = [o for o in (_stated(plan, "grads", v, g) for v in ("divide_except_last", "divide_last_only"))
               if o is not None]
        if not ops or simulator_rankset.combined(plan, g):
            continue
        grad = Fraction(rng.choice([-3, -1, 1, 2, 5]))
        coefs = [(o, 1 / _value(o.by, sizes, plan, bindings)) for o in ops]
        updates = set()
        for d in devices:
            upd = grad
            for o, c in coefs:
                named = list(o.axes or ())
                if _applied(o.verb, [d[pos[a]] for a in named], [sizes[a] for a in named]):
                    upd *= c
            updates.add(upd)
        if updates != {grad}:  # the replicas (or shards) of g step by different coefficients, or all divide again
            out.add(("update", g))
    return out
