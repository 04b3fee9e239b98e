"""The simulator's clip norm and overflow flag (tests/simulator.py): every group's squared norm and overflow
flag drawn per shard, each rank's part reduced as the plan states (a sum, an average or a max, over whole
axes or blocks of their ranks, roots taken early, counted twice, on rank 0 only), against the single-device
norm and flag (``norm_violations``)."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from simulator_plan import (
    COMPLETE,
    GRAD_SPLIT,
    SHARDED,
    TIE,
    _allmax,
    _allreduce,
    _last_for,
    _overrides,
    axis_type,
    groups_of,
    kind_of,
    mode,
)

from placement_logic import ir


def grad_shard_axes(plan: ir.Plan, group: str) -> list[str]:
    out = [a for a in plan.mesh.names if axis_type(plan, group, a) in (SHARDED, COMPLETE)]
    out += [a for a in plan.mesh.names if plan.role(a) is ir.Role.DATA
            and mode(plan, group, ir.State.GRADS, a) in GRAD_SPLIT]
    if kind_of(plan, group) == "experts":
        out += [a for a in plan.mesh.names if plan.role(a) is ir.Role.EXPERT]
    return list(dict.fromkeys(out))


def _stated_norm(plan: ir.Plan, group: str | None) -> list[ir.Override]:
    """The clip-norm reductions stated for exactly ``group``: a sum, an average or a max over axes."""
    return [o for o in plan.overrides if o.target == "clip_norm" and o.verb in ("reduce", "average", "max")
            and o.group == group]


def _twice(plan: ir.Plan, g: str, sizes: dict[str, int]) -> int:
    """How many times a group counted twice in the norm (double_count) is counted: 2, or its tied stages."""
    if _last_for(plan, "clip_norm", "double_count", g) is None:
        return 1
    ties = [a for a in plan.mesh.names if axis_type(plan, g, a) == TIE]
    return (2 if sizes[ties[0]] >= 2 else 1) if ties else 2


def _exact_root(v: Fraction) -> Fraction:
    from math import isqrt

    n, m = isqrt(v.numerator), isqrt(v.denominator)
    assert n * n == v.numerator and m * m == v.denominator, v
    return Fraction(n, m)


def _dedupe_axes(plan: ir.Plan, g: str, written: bool, g_axes: list[str]) -> set[str]:
    """The axes of the duplicate filter (semantics.md, "Global reductions"): the derived reduction counts a
    replicated group's copies on one rank of each axis it sums over; a written reduction is a plain sum,
    filtered only over the axes a dedupe override states."""
    if not written:
        return set(g_axes)
    stated = _last_for(plan, "clip_norm", "dedupe", g)
    return set(stated.axes or ()) if stated is not None else set()


def _norm_reduced(part: dict, g_axes: list[str], how: str, blocks: dict, pos: dict[str, int],
                  sizes: dict[str, int]) -> dict:
    """A group's per-device norm values after its reduction over each of ``g_axes`` in turn: a sum, an average
    or a max, over the whole axis or over blocks of its ranks (simulator_subgroups)."""
    import simulator_subgroups

    for a in g_axes:
        if a in blocks:  # a reduction over blocks of the axis's ranks (simulator_subgroups)
            part = simulator_subgroups.block_reduce(part, pos[a], blocks[a], "max" if how == "max" else "sum")
            if how == "average":
                part = {d: v / simulator_subgroups.block_len(d[pos[a]], blocks[a], sizes[a])
                        for d, v in part.items()}
        elif how == "max":
            part = _allmax(part, pos[a])
        else:
            part = _allreduce(part, pos[a])
            if how == "average":
                part = {d: v / sizes[a] for d, v in part.items()}
    return part


def norm_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict | None = None) -> set:
    out = set()
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    devices = list(product(*[range(sizes[a]) for a in axes]))
    import simulator_kvnorm as kvn  # K >= 2 kv heads copied over a tensor axis: a group of its own in the norm

    copies = kvn.copy_axes(plan, sizes)
    import simulator_kvproduct as kvp  # kv heads copied over several tensor axes: the joint index

    joint = kvp.layout(plan, "kv", sizes)
    if joint is not None:
        copies = {a: c for a, c in copies.items() if a not in joint[0]}
    groups = groups_of(plan) + (["kv"] if (copies or joint) and "kv" not in groups_of(plan) else [])

    def extent(g: str, a: str) -> int:
        if g == "kv" and joint is not None and a in joint[0]:
            return plan.model.transformer.kv_heads.value if a == joint[0][0] else 1
        return kvn.extent(g, a, sizes, copies)

    def shard_key(g: str, d) -> tuple:
        if g == "kv" and joint is not None:
            return tuple((kvp.head(d, pos, joint, sizes) if a == joint[0][0] else 0) if a in joint[0]
                         else kvn.key(g, a, d[pos[a]], copies) for a in shard[g])
        return tuple(kvn.key(g, a, d[pos[a]], copies) for a in shard[g])
    shard = {g: grad_shard_axes(plan, g) for g in groups}
    sharded_somewhere = {a for g in groups for a in shard[g]}
    plan_clip = _stated_norm(plan, "all") or _stated_norm(plan, None)
    roots = _overrides(plan, "clip_norm", "sqrt_before_reduce")
    default_axes = list(plan_clip[-1].axes or ()) if plan_clip else [a for a in axes if a in sharded_somewhere]
    # squared norms and overflow flags per (group, shard)
    q = {}
    flags = {}
    for g in groups:
        # with a root taken early, values whose counted multiple is a perfect square keep the roots exact
        f = _twice(plan, g, sizes) if roots else 1
        for s in product(*[range(int(extent(g, a))) for a in shard[g]]):
            q[(g, s)] = Fraction(f * rng.randint(0, 3) ** 2) if roots else Fraction(rng.randint(0, 3))
            flags[(g, s)] = rng.random() < 0.3
    expected = sum(q.values(), Fraction(0))
    total = {d: Fraction(0) for d in devices}
    import simulator_subgroups  # a norm reduction over blocks of an axis's ranks

    blocks = simulator_subgroups.norm_blocks(plan, sizes, bindings or {})
    for g in groups:
        own = _stated_norm(plan, g)
        stated = own or plan_clip
        how = stated[-1].verb if stated else "reduce"  # reduce (a sum), average or max, over each axis
        root = any(o.group in (None, "all", g) for o in roots)
        g_axes = list(own[-1].axes or ()) if own else default_axes
        filtered = _dedupe_axes(plan, g, bool(own or plan_clip), g_axes)
        r0 = _last_for(plan, "clip_norm", "rank0_only", g)
        rank0 = set(r0.axes or ()) if r0 is not None else set()
        import simulator_rankset  # a count on a set of one axis's ranks: those ranks, not the filter, count g there

        filtered -= simulator_rankset.norm_ranked_axes(plan, g)
        part = {}
        for d in devices:
            s = shard_key(g, d)
            counted = (kvp.counted(plan, d, pos, g_axes, joint, sizes) if g == "kv" and joint is not None
                       else kvn.counted(plan, g, dict(zip(axes, d)), g_axes, copies)) and all(d[pos[a]] == 0 for a in set(g_axes) if a not in shard[g] and a in filtered) \
                and all(d[pos[a]] == 0 for a in rank0) \
                and simulator_rankset.norm_counted(plan, g, dict(zip(axes, d)), sizes, bindings or {})  # rank0_only: only rank 0 of these axes contributes
            part[d] = q[(g, s)] * _twice(plan, g, sizes) if counted else Fraction(0)
        if root:  # each rank's norm, not its square
            part = {d: _exact_root(v) for d, v in part.items()}
        import simulator_normsets  # rank sets over several axes: each device's set summed, those axes taken out

        part, g_axes = simulator_normsets.reduce(plan, part, g_axes, pos, sizes)
        part = _norm_reduced(part, g_axes, how, blocks, pos, sizes)
        for d in devices:
            total[d] += part[d] ** 2 if root else part[d]
    eps_o = _overrides(plan, "clip_norm", "eps_before_reduce")
    if eps_o:  # ε on each rank's squared norm before the plan's reduction (simulator_perrank); single device: S + ε
        import simulator_perrank

        how = plan_clip[-1].verb if plan_clip else "reduce"
        eps, part = simulator_perrank.eps_part(plan, sizes, eps_o[-1], default_axes, how, bindings or {})
        total = {d: v + part[d] for d, v in total.items()}
        expected += eps
    import simulator_normeps  # ε on some ranks' squared norms before the plan's (summed) reduction

    on_ranks = simulator_normeps.stated(plan)
    if on_ranks is not None:
        eps, part = simulator_normeps.eps_part(plan, on_ranks, sizes, default_axes, bindings or {})
        total = {d: v + part[d] for d, v in total.items()}
        expected += eps
    if any(v != expected for v in total.values()):
        out.add(("clip",))
    ovf_o = _overrides(plan, "overflow", "reduce")
    # the overflow flag has its own reduction: the derived axes unless an overflow override says
    # otherwise (a clip-norm override leaves it alone)
    ovf_axes = list(ovf_o[-1].axes or ()) if ovf_o else [a for a in axes if a in sharded_somewhere]

    def overflow_differs(flags: dict) -> bool:
        any_flag = any(flags.values())
        buf = {d: any(flags[(g, shard_key(g, d))] for g in groups)
               for d in devices}
        for a in ovf_axes:
            sums: dict = {}
            for d, v in buf.items():
                key = d[:pos[a]] + d[pos[a] + 1:]
                sums[key] = sums.get(key, False) or v
            buf = {d: sums[d[:pos[a]] + d[pos[a] + 1:]] for d in buf}
        return any(v != any_flag for v in buf.values())

    # the random flags, and every single shard overflowing alone (the witness a random draw can miss:
    # another group's flag, seen by every device, hides a divergence)
    if overflow_differs(flags) or any(overflow_differs({k: k == one for k in flags}) for one in flags):
        out.add(("overflow",))
    return out
