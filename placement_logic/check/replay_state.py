"""Concrete replay of the plan-wide state-consistency conditions and structural rules.

Input: a replay ``Context`` and a solver witness. Output: a re-checked
``Counterexample`` or None. Covers the global grad norm and clip coefficient, the
loss-scale overflow decision, dropout seeds, the parameter re-gather after a sharded
optimizer step, gathers over replicated axes, offload fetches and axis bindings, each
simulated device by device in exact arithmetic.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from . import clipagg, kvjoint, kvnorm, kvproduct, perrank, rankcount
from .replay import Context, _frac, coords_text
from .report import Counterexample
from .values import resolver

Coord = tuple[int, ...]


def _devices(ctx: Context, sizes: dict[str, int]) -> list[Coord]:
    return list(product(*[range(sizes[a]) for a in ctx.step.axes]))


def _allreduce(buf: dict[Coord, object], i: int, op) -> dict[Coord, object]:
    sums: dict[Coord, object] = {}
    for dev, v in buf.items():
        key = dev[:i] + dev[i + 1:]
        sums[key] = op(sums[key], v) if key in sums else v
    return {dev: sums[dev[:i] + dev[i + 1:]] for dev in buf}


def _coord(g, dev, pos: dict[str, int], sizes: dict[str, int]) -> Coord:
    """The shard of g that device ``dev`` holds (a copied kv head: rank // (n/K) on its copy axis)."""
    joint = kvjoint.coord(g, dev, pos)  # copy groups crossing the axes: the joint index's head
    return joint if joint is not None else tuple(kvnorm.head_of(g, a, dev[pos[a]], sizes[a]) for a in g.shard_axes)


def replay_norm(ctx: Context, w: dict, boolean: bool) -> Counterexample | None:
    """Grad norm / overflow: each device's local part, the plan's all-reduces, vs the global value."""
    step = ctx.step
    sizes = w["sizes"]
    axes = step.axes
    pos = {a: i for i, a in enumerate(axes)}
    reduce_axes = step.overflow_axes if boolean else step.clip_axes
    if not kvproduct.layout_ok(step.groups, sizes):
        return None  # a size that is no multiple of the kv heads copied over it (or off a pinned one): no such mesh
    devices = _devices(ctx, sizes)
    placed: dict[tuple[str, Coord], object] = {}
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    for (group, block), v in w["blocks"].items():
        if not v:
            continue
        g = step.group(group)
        slot = rankcount.slots(g, sizes, leaf)  # count_on_ranks: the observer's piece on a named rank
        shard = tuple(slot[a][a in block] if a in slot else 1 if a in block else 0 for a in g.shard_axes)
        if any(c >= sizes[a] for a, c in zip(g.shard_axes, shard)):
            return None
        placed[(group, shard)] = v
    if boolean:
        buf: dict[Coord, object] = {}
        for dev in devices:
            buf[dev] = any(placed.get((g.group, _coord(g, dev, pos, sizes))) for g in step.groups)
        for a in reduce_axes:
            buf = _allreduce(buf, pos[a], lambda x, y: x or y)
    else:
        # every group's squared-norm partial sum is reduced over that group's own axes
        buf = {dev: Fraction(0) for dev in devices}
        for g in step.groups:
            g_axes = g.clip_axes if g.clip_axes is not None else reduce_axes
            if g.clip_sqrt or g.clip_agg != "sum":  # an average, a max, or roots before the reduction
                got = _aggregated(g, g_axes, devices, pos, sizes, placed)
                if got is None:
                    return None
                for dev in devices:
                    buf[dev] = buf[dev] + got[dev]
                continue
            part: dict[Coord, object] = {}
            for dev in devices:
                v = placed.get((g.group, _coord(g, dev, pos, sizes)))
                # the duplicate filter: a copy is counted on rank 0 of every filtered axis only (a copied kv
                # head on the first rank of its copy group)
                counted = bool(v) and all(dev[pos[a]] == 0 for a in set(g_axes)
                                          if a not in g.shard_axes and a in rankcount.filtered(g)) \
                    and all(dev[pos[a]] == 0 for a in g.clip_rank0) \
                    and kvnorm.counted_copy(g, dev, pos, sizes, g_axes) \
                    and rankcount.counted(g, dev, pos, sizes, leaf)  # rank0_only (perrank), count_on_ranks
                dc = 1
                if counted and g.double_count:
                    tie = [d for d in g.dims if d.tie]
                    dc = (2 if sizes[tie[0].axis] >= 2 else 1) if tie else 2
                part[dev] = Fraction(v) * dc if counted else Fraction(0)
            for a in g_axes:
                part = _allreduce(part, pos[a], lambda x, y: x + y)
            for dev in devices:
                buf[dev] = buf[dev] + part[dev]
    if boolean:
        expected = any(bool(v) for v in placed.values())
    else:
        expected = sum((Fraction(v) for v in placed.values()), Fraction(0))
    bad = [dev for dev in devices if buf[dev] != expected]
    if not bad:
        return None
    dev = bad[0]
    where = ", ".join(f"{g}{coords_text(step.group(g).shard_axes, s)}" if step.group(g).shard_axes
                      else f"{g} (whole on every device)" for g, s in sorted(placed))
    group_axes = {g.clip_axes for g in step.groups if g.clip_axes is not None}
    if not boolean and len(group_axes) > 1:
        reduce_text = "; ".join(f"{g.group}: " + (f"all-reduce over ({', '.join(g.clip_axes)})" if g.clip_axes
                                                   else "no all-reduce") for g in step.groups)
    else:
        reduce_text = f"all-reduce over ({', '.join(reduce_axes)})" if reduce_axes else "no all-reduce"
    if boolean:
        other = next((d for d in devices if buf[d] != buf[dev]), None)
        devs = [("observer", coords_text(axes, dev))]
        if other is not None:
            devs.append(("disagrees with", coords_text(axes, other)))
        eq = (f"overflow decision on {coords_text(axes, dev)} = {'skip' if buf[dev] else 'step'}, "
              f"global decision = {'skip' if expected else 'step'}")
        values = (("inf/nan gradients", f"only in the shards {where}"), ("reduction", reduce_text))
        how = f"all-reduced only over ({', '.join(reduce_axes)})" if reduce_axes else "not all-reduced"
        diag = (f"the found-inf flag is {how} but gradients are sharded over "
                f"({', '.join(sorted({a for g in step.groups for a in g.shard_axes}))}): devices that do not hold "
                "the overflowing shard step while the others skip",)
        return Counterexample(ctx.sizes_tuple(sizes), tuple(devs), values, eq, diag, ctx.command(sizes))
    clip2 = expected / 4
    coef = lambda n2: min(Fraction(1), clip2 / n2) if n2 else Fraction(1)
    eq = (f"grad-norm² on {coords_text(axes, dev)} = {_frac(buf[dev])}, global grad-norm² = {_frac(expected)}; "
          f"clip coefficient² with max_norm² = {_frac(clip2)}: {_frac(coef(buf[dev]))} instead of {_frac(coef(expected))}")
    values = (("squared gradient norms", f"{where} (one value per listed shard, 0 elsewhere)"), ("reduction", reduce_text))
    values += tuple((f"{g.group} heads over {a}", kvproduct.joint_text(g, a, sizes[a] // k) or (
                     f"head h held by the {a} ranks h·{sizes[a] // k} .. h·{sizes[a] // k} + {sizes[a] // k - 1} "
                     "(its copy group)"))
                    for g in step.groups for a, k in kvnorm.copy_heads(g).items() if sizes[a] // k >= 2)
    derived = ctx.derived.clip_axes
    diag = []
    for who, axes_g in ([(None, reduce_axes)] if len(group_axes) <= 1
                        else [(g.group, g.clip_axes) for g in step.groups]):
        of = f" of {who}" if who else ""
        missing = [a for a in dict.fromkeys(derived) if a not in axes_g]
        if missing:
            diag.append(f"squared norms{of} are not summed over ({', '.join(missing)}), where the gradients are "
                        "sharded: each shard is clipped with its own local norm")
        extra = [a for a in sorted(set(axes_g)) if axes_g.count(a) > derived.count(a)]
        if extra:
            diag.append(f"squared norms{of} are summed too often over ({', '.join(sorted(extra))})")
    for g in step.groups:
        copies = [a for a in dict.fromkeys(g.clip_axes or ()) if a not in g.shard_axes and a not in g.clip_filter
                  and a in derived and sizes[a] >= 2 and a not in rankcount.axes(g)]  # (else: above; rank sets: below)
        if copies:
            diag.append(f"{g.group} is replicated over ({', '.join(copies)}) and its squared norm is summed there "
                        "with no duplicate filter: every copy is counted")
        diag += kvnorm.diagnosis(g, sizes)
        if g.double_count:
            diag.append(f"{g.group} is counted twice in the norm (it is held on two devices and not de-duplicated)")
        avg = [a for a in g.clip_rank0 if g.clip_agg == "average" and a not in g.shard_axes and sizes[a] >= 2]
        if avg:
            diag.append(f"{g.group} is counted in the norm on rank 0 of ({', '.join(avg)}) only and the ranks' "
                        f"values are averaged there: its squared norm divided by {'·'.join(avg)}")
        diag += rankcount.diagnosis(g, sizes, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()}))
        lost = perrank.dropped(g, lambda a: sizes[a] >= 2)
        if lost:
            diag.append(f"{g.group} is counted in the norm on rank 0 of ({', '.join(lost)}) only (override at line "
                        f"{g.clip_rank0_span.line}), but its gradient is sharded there: the squared norms of the "
                        "other ranks' pieces are dropped")
    diag = _aggregation_causes(step, sizes) + diag
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", coords_text(axes, dev)),), values, eq, tuple(diag),
                          ctx.command(sizes))


def _aggregation_causes(step, sizes: dict[str, int]) -> list[str]:
    """The causes an average, a max or a root before the reduction (clipagg) gives at these sizes,
    one line per kind and axes, naming every group it applies to."""
    by: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for g in step.groups:
        pend = tuple(clipagg.pending(g, lambda a: sizes[a] >= 2))
        shard = tuple(a for a in dict.fromkeys(g.clip_axes or ()) if sizes[a] >= 2 and a in g.shard_axes)
        if g.clip_sqrt and pend:
            by.setdefault(("sqrt", pend), []).append(g.group)
        elif g.clip_agg == "max" and pend:
            by.setdefault(("max", pend), []).append(g.group)
        elif g.clip_agg == "average" and shard:
            by.setdefault(("average", shard), []).append(g.group)
    out = []
    for (kind, axes), names in by.items():
        over, who = ", ".join(axes), ", ".join(names)
        if kind == "sqrt":
            out.append(f"the norm of {who} is taken (a square root) on every rank before the reduction over ({over}), "
                       "where the squared norm is still a partial sum: the roots are added, and sqrt(a) + sqrt(b) is "
                       "not sqrt(a + b)")
        elif kind == "max":
            out.append(f"the squared norms of {who} are combined by max over ({over}), where the gradient is "
                       "sharded: the largest piece stands for the sum of all")
        else:
            out.append(f"the squared norms of {who} are averaged over ({over}) (an all-reduce with AVG), where the "
                       f"gradient is sharded: their sum divided by {'·'.join(axes)}")
    return out


def _aggregated(g, g_axes, devices, pos, sizes, placed) -> dict | None:
    """Group g's squared norm on every device after its reductions, each rank's value combined as
    the plan says (clipagg): summed, averaged or maximised, and with ``clip_sqrt`` each rank's root
    taken first and the result squared after. A root is kept exact as c·sqrt(r); a sum of roots of
    different radicands cannot be (None: no exact replay)."""
    part: dict[Coord, tuple[Fraction, Fraction]] = {}
    for dev in devices:
        v = placed.get((g.group, _coord(g, dev, pos, sizes)))
        counted = bool(v) and all(dev[pos[a]] == 0 for a in set(g_axes) if a not in g.shard_axes and a in g.clip_filter) \
            and all(dev[pos[a]] == 0 for a in g.clip_rank0) and kvnorm.counted_copy(g, dev, pos, sizes, g_axes)
        dc = 1
        if counted and g.double_count:
            tie = [d for d in g.dims if d.tie]
            dc = (2 if sizes[tie[0].axis] >= 2 else 1) if tie else 2
        x = Fraction(v) * dc if counted else Fraction(0)
        part[dev] = (Fraction(1), x) if g.clip_sqrt else (x, Fraction(1))  # value = c * sqrt(r)

    def combine(everyone: list) -> tuple[Fraction, Fraction] | None:
        xs = [x for x in everyone if x[0] and x[1]]
        if not xs:
            return (Fraction(0), Fraction(1))
        if g.clip_agg == "max":
            return max(xs, key=lambda x: x[0] * x[0] * x[1])
        if len({r for _, r in xs}) > 1:
            return None
        total = sum((c for c, _ in xs), Fraction(0))
        return (total / (len(everyone) if g.clip_agg == "average" else 1), xs[0][1])

    for a in g_axes:
        i = pos[a]
        groups: dict[Coord, list] = {}
        for dev, x in part.items():
            groups.setdefault(dev[:i] + dev[i + 1:], []).append(x)
        new = {}
        for key, xs in groups.items():
            got = combine(xs)
            if got is None:
                return None
            new[key] = got
        part = {dev: new[dev[:i] + dev[i + 1:]] for dev in part}
    return {dev: (c * c * r if g.clip_sqrt else c) for dev, (c, r) in part.items()}


def replay_seed(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    sizes, axis = w["sizes"], w["axis"]
    vary = [a for a in step.axes if a in step.seed_vary]
    base = 1234

    def seed(dev: dict[str, int]) -> int:
        s, stride = base, 1
        for a in reversed(vary):
            s += dev[a] * stride
            stride *= sizes[a]
        return s

    d0 = {a: 0 for a in step.axes}
    d1 = dict(d0, **{axis: 1})
    s0, s1 = seed(d0), seed(d1)
    replicated = not step.sequence_parallel
    if replicated and s0 == s1 or not replicated and s0 != s1:
        return None
    if replicated:
        eq = (f"residual-region dropout seed on {coords_text(step.axes, d0.values())} = {s0} but on "
              f"{coords_text(step.axes, d1.values())} = {s1}: the replicated hidden states get different masks and diverge")
        diag = (f"dropout seeds vary over {axis}, where the residual region (dropout after the row-parallel "
                "all-reduce) is replicated; it must use the same seed on every rank of the axis",)
    else:
        eq = (f"sequence-parallel dropout seed on both {coords_text(step.axes, d0.values())} and "
              f"{coords_text(step.axes, d1.values())} = {s0}: two different sequence slices get the same mask")
        diag = (f"under sequence parallel the residual region is split over {axis}; each slice needs its own seed",)
    return Counterexample(ctx.sizes_tuple(sizes),
                          (("rank A", coords_text(step.axes, d0.values())), ("rank B", coords_text(step.axes, d1.values()))),
                          (("seed rule", f"seed = {base} + rank offset over ({', '.join(vary) or 'no axis'})"),),
                          eq, diag, ctx.command(sizes))


def replay_regather(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    theta = [Fraction(1)] * n
    delta = Fraction(-1, 10)
    copies = []
    for rank in range(n):
        mine = list(theta)
        mine[rank] += delta  # the optimizer updates only the shard this rank owns
        copies.append(mine)
    if axis in step.regather_axes:
        owned = [copies[r][r] for r in range(n)]
        copies = [list(owned) for _ in range(n)]
    if copies[0] == copies[1]:
        return None
    eq = (f"after the step, params shard 1 on {axis}=0 is {_frac(copies[0][1])} but on {axis}=1 (its owner) is "
          f"{_frac(copies[1][1])}")
    return Counterexample(ctx.sizes_tuple(sizes), (("stale replica", f"({axis}=0)"), ("owner", f"({axis}=1)")),
                          (("params before", "1 per element"), ("update of shard 1", _frac(delta))),
                          eq, (f"params are replicated over {axis} but the optimizer state is sharded there; the "
                               f"updated shards are never all-gathered over {axis}",), ctx.command(sizes))


def replay_gather(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    sizes, axis = w["sizes"], w["axis"]
    modes = dict(step.param_modes)
    if modes[axis] in ("S", "S*", "O"):
        return None
    n = sizes[axis]
    eq = f"all-gather over {axis} of a params buffer replicated there yields {n} copies: {n}·|Θ| elements, expected |Θ|"
    return Counterexample(ctx.sizes_tuple(sizes), (("gathering device", f"({axis}=0)"),),
                          (("params mode on " + axis, modes[axis]), ("gathered size", f"{n}·|Θ|")),
                          eq, (f"params are {modes[axis]} over {axis}, so there is nothing to gather there",),
                          ctx.command(sizes))


def replay_fetch(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    if not step.offloaded or step.fetch:
        return None
    sizes = w["sizes"]
    eq = "forward of the first layer on device 0 reads params from device memory, where none are resident"
    return Counterexample(ctx.sizes_tuple(sizes), (("device", "0"),),
                          (("params residency", "off-device"), ("fetch path", "none")),
                          eq, ("params are offloaded and never fetched or gathered back to the device before use",),
                          ctx.command(sizes))


def replay_axis_roles(ctx: Context, w: dict) -> Counterexample | None:
    bound = dict(ctx.step.axis_bindings)[w["axis"]]
    if len(bound) <= 1:
        return None
    sizes = w["sizes"]
    eq = f"axis {w['axis']} is bound to {len(bound)} strategies: {', '.join(bound)}"
    return Counterexample(ctx.sizes_tuple(sizes), (), (("strategies", ", ".join(bound)),), eq,
                          ("each strategy issues its own collectives over the same devices",), ctx.command(sizes))


def replay_tie(ctx: Context, w: dict) -> Counterexample | None:
    sizes = w["sizes"]
    g = ctx.step.group("embedding")
    tie = next(d for d in g.dims if d.tie)
    if sizes[tie.axis] < 2:
        return None
    a, b = Fraction(1), Fraction(2)
    held = a if tie.k == 0 else (a + b) * 2 ** (tie.k - 1)
    if held == a + b:
        return None
    eq = (f"tied embedding grad on the first {tie.axis} stage = {_frac(held)}; the parameter's gradient is "
          f"input-embedding part {a} + output-projection part {b} = {_frac(a + b)}")
    return Counterexample(ctx.sizes_tuple(sizes), (("first stage", f"({tie.axis}=0)"),
                                                   ("last stage", f"({tie.axis}={sizes[tie.axis] - 1})")),
                          (("input embedding grad", "1"), ("output projection grad", "2")), eq,
                          (f"the tied pair is all-reduced {tie.k} times over the first and last {tie.axis} stage; "
                           "it must be exactly once",), ctx.command(sizes))


def replay_usable(ctx: Context, w: dict) -> Counterexample | None:
    """Params sharded (``S``) or gathered other than once over a data axis: the forward runs with
    the wrong weights. A two-element weight row, input (1, 1), one output: y = w·x."""
    sizes, axis, times = w["sizes"], w["axis"], w.get("times", 0)
    n = sizes[axis]
    if n < 2 or times == 1:
        return None
    weights = [Fraction(i + 1) for i in range(n)]  # element i is held by rank i
    full = sum(weights, Fraction(0))
    held = [weights[0]] if times == 0 else weights * times  # rank 0's buffer before the forward
    used = sum(held, Fraction(0))
    if used == full:
        return None
    what = ("only its own shard" if times == 0 else f"every shard {times} times")
    eq = (f"forward output on ({axis}=0) with input 1 per element = {_frac(used)}, single device = {_frac(full)}")
    if times == 0:
        diag = (f"params are sharded over {axis} and never all-gathered over it: each {axis} rank runs the "
                f"forward with 1/{n} of the weights",)
    else:
        diag = (f"params are all-gathered over {axis} {times} times before use: the reconstructed unit holds "
                f"{times} copies of every shard",)
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", f"({axis}=0)"),),
                          (("params", ", ".join(f"element {i} = {_frac(x)} on {axis}={i}" for i, x in enumerate(weights))),
                           ("forward uses", what)), eq, diag, ctx.command(sizes))


def replay_optimizer(ctx: Context, w: dict) -> Counterexample | None:
    """Gradients sharded over an axis on which the optimizer state is replicated: every replica
    steps the whole parameter with a gradient buffer it holds only a shard of."""
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    if n < 2:
        return None
    lr = Fraction(1, 10)
    theta = [Fraction(1)] * n
    grad = [Fraction(i + 1) for i in range(n)]  # the fully reduced gradient, element by element
    expected = [t - lr * g for t, g in zip(theta, grad)]
    held = [grad[0]] + [Fraction(0)] * (n - 1)  # rank 0 holds the reduced shard 0 only
    got = [t - lr * g for t, g in zip(theta, held)]
    bad = next((i for i in range(n) if got[i] != expected[i]), None)
    if bad is None:
        return None
    eq = (f"after the step, params element {bad} on ({axis}=0) = {_frac(got[bad])}, single device = "
          f"{_frac(expected[bad])}")
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", f"({axis}=0)"),),
                          (("reduced gradient", ", ".join(_frac(g) for g in grad)),
                           (f"held on ({axis}=0)", f"shard 0 only ({_frac(grad[0])})"), ("learning rate", _frac(lr))),
                          eq, (f"gradients are sharded over {axis} but the optimizer state is replicated there: each "
                               f"replica steps every element with only its own shard of the gradient",),
                          ctx.command(sizes))
