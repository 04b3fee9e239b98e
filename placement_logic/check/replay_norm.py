"""Concrete replay of ``SC clip_norm`` and ``SC overflow``: the global grad norm (and so the clip
coefficient) and the loss-scale overflow decision.

Input: a replay ``Context`` and the witness of ``encode_norm.norm_negation`` (the sizes and each
group's value on each block of its shard axes). Output: a re-checked ``Counterexample`` or None.
Each device's local part and the plan's all-reduces are simulated device by device in exact
arithmetic and compared with the global value; the counterexample names the causes at its sizes.
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
    pos = {a: i for i, a in enumerate(step.axes)}
    reduce_axes = step.overflow_axes if boolean else step.clip_axes
    if not kvproduct.layout_ok(step.groups, sizes):
        return None  # a size that is no multiple of the kv heads copied over it (or off a pinned one): no such mesh
    devices = _devices(ctx, sizes)
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    placed = _placed(step, w["blocks"], sizes, leaf)
    if placed is None:
        return None
    if boolean:
        buf = _flags(step, devices, pos, sizes, placed, reduce_axes)
    else:
        buf = _norms(step, devices, pos, sizes, placed, reduce_axes, leaf)
        if buf is None:
            return None
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
    reduce_text = _reduce_text(step, reduce_axes, boolean)
    if boolean:
        return _overflow_counterexample(ctx, sizes, devices, buf, dev, expected, (where, reduce_text), reduce_axes)
    return _clip_counterexample(ctx, sizes, buf[dev], dev, expected, (where, reduce_text), reduce_axes)


def _placed(step, blocks: dict, sizes: dict[str, int], leaf) -> dict[tuple[str, Coord], object] | None:
    """The witness's nonzero block values on the shards that hold them (None: a shard off the mesh)."""
    placed: dict[tuple[str, Coord], object] = {}
    for (group, block), v in blocks.items():
        if not v:
            continue
        g = step.group(group)
        slot = rankcount.slots(g, sizes, leaf)  # count_on_ranks: the observer's piece on a named rank
        shard = tuple(slot[a][a in block] if a in slot else 1 if a in block else 0 for a in g.shard_axes)
        if any(c >= sizes[a] for a, c in zip(g.shard_axes, shard)):
            return None
        placed[(group, shard)] = v
    return placed


def _flags(step, devices: list[Coord], pos: dict[str, int], sizes: dict[str, int], placed: dict,
           reduce_axes: tuple[str, ...]) -> dict[Coord, object]:
    """Every device's found-inf flag after the plan's all-reduces (a logical or)."""
    buf: dict[Coord, object] = {}
    for dev in devices:
        buf[dev] = any(placed.get((g.group, _coord(g, dev, pos, sizes))) for g in step.groups)
    for a in reduce_axes:
        buf = _allreduce(buf, pos[a], lambda x, y: x or y)
    return buf


def _norms(step, devices: list[Coord], pos: dict[str, int], sizes: dict[str, int], placed: dict,
           reduce_axes: tuple[str, ...], leaf) -> dict[Coord, object] | None:
    """Every device's squared norm: each group's partial sum reduced over that group's own axes
    (None: a sum of roots with no exact value)."""
    buf = {dev: Fraction(0) for dev in devices}
    for g in step.groups:
        g_axes = g.clip_axes if g.clip_axes is not None else reduce_axes
        if g.clip_sqrt or g.clip_agg != "sum":  # an average, a max, or roots before the reduction
            part = _aggregated(g, g_axes, devices, pos, sizes, placed)
            if part is None:
                return None
        else:
            part = {dev: _counted_part(g, g_axes, dev, pos, sizes, placed, leaf) for dev in devices}
            for a in g_axes:
                part = _allreduce(part, pos[a], lambda x, y: x + y)
        for dev in devices:
            buf[dev] = buf[dev] + part[dev]
    return buf


def _counted_part(g, g_axes, dev: Coord, pos: dict[str, int], sizes: dict[str, int], placed: dict, leaf) -> Fraction:
    """The squared norm of g that ``dev`` enters into the sum (0 where it is not counted there)."""
    v = placed.get((g.group, _coord(g, dev, pos, sizes)))
    # the duplicate filter: a copy is counted on rank 0 of every filtered axis only (a copied kv
    # head on the first rank of its copy group)
    counted = bool(v) and all(dev[pos[a]] == 0 for a in set(g_axes)
                              if a not in g.shard_axes and a in rankcount.filtered(g)) \
        and all(dev[pos[a]] == 0 for a in g.clip_rank0) \
        and kvnorm.counted_copy(g, dev, pos, sizes, g_axes) \
        and rankcount.counted(g, dev, pos, sizes, leaf)  # rank0_only (perrank), count_on_ranks
    return Fraction(v) * _double(g, sizes) if counted else Fraction(0)


def _double(g, sizes: dict[str, int]) -> int:
    """How often a counted value of g enters the norm: twice where it is double-counted (a tie over an
    axis of one rank holds it once)."""
    if not g.double_count:
        return 1
    tie = [d for d in g.dims if d.tie]
    return (2 if sizes[tie[0].axis] >= 2 else 1) if tie else 2


def _reduce_text(step, reduce_axes: tuple[str, ...], boolean: bool) -> str:
    group_axes = {g.clip_axes for g in step.groups if g.clip_axes is not None}
    if not boolean and len(group_axes) > 1:
        return "; ".join(f"{g.group}: " + (f"all-reduce over ({', '.join(g.clip_axes)})" if g.clip_axes
                                           else "no all-reduce") for g in step.groups)
    return f"all-reduce over ({', '.join(reduce_axes)})" if reduce_axes else "no all-reduce"


def _overflow_counterexample(ctx: Context, sizes: dict[str, int], devices: list[Coord], buf: dict, dev: Coord,
                             expected: bool, texts: tuple[str, str], reduce_axes: tuple[str, ...]) -> Counterexample:
    """A device whose overflow decision differs from the global one, and one it disagrees with."""
    step, axes = ctx.step, ctx.step.axes
    where, reduce_text = texts
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


def _clip_counterexample(ctx: Context, sizes: dict[str, int], got: Fraction, dev: Coord, expected: Fraction,
                         texts: tuple[str, str], reduce_axes: tuple[str, ...]) -> Counterexample:
    """A device whose squared grad norm (``got``), and so its clip coefficient, differs from the global one."""
    step, axes = ctx.step, ctx.step.axes
    where, reduce_text = texts
    clip2 = expected / 4
    coef = lambda n2: min(Fraction(1), clip2 / n2) if n2 else Fraction(1)
    eq = (f"grad-norm² on {coords_text(axes, dev)} = {_frac(got)}, global grad-norm² = {_frac(expected)}; "
          f"clip coefficient² with max_norm² = {_frac(clip2)}: {_frac(coef(got))} instead of {_frac(coef(expected))}")
    values = (("squared gradient norms", f"{where} (one value per listed shard, 0 elsewhere)"), ("reduction", reduce_text))
    values += tuple((f"{g.group} heads over {a}", kvproduct.joint_text(g, a, sizes[a] // k) or (
                     f"head h held by the {a} ranks h·{sizes[a] // k} .. h·{sizes[a] // k} + {sizes[a] // k - 1} "
                     "(its copy group)"))
                    for g in step.groups for a, k in kvnorm.copy_heads(g).items() if sizes[a] // k >= 2)
    diag = _reduction_causes(step, ctx.derived.clip_axes, reduce_axes)
    for g in step.groups:
        diag += _group_causes(ctx, g, sizes)
    diag = _aggregation_causes(step, sizes) + diag
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", coords_text(axes, dev)),), values, eq, tuple(diag),
                          ctx.command(sizes))


def _reduction_causes(step, derived: tuple[str, ...], reduce_axes: tuple[str, ...]) -> list[str]:
    """Axes the norm (or a group's part of it) is not summed over where it should be, or summed too often."""
    group_axes = {g.clip_axes for g in step.groups if g.clip_axes is not None}
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
    return diag


def _group_causes(ctx: Context, g, sizes: dict[str, int]) -> list[str]:
    """Why group g's part of the norm is counted wrongly at these sizes: copies, kv heads, a double count,
    rank 0 or rank sets."""
    derived = ctx.derived.clip_axes
    diag = []
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
    return diag


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
        x = Fraction(v) * _double(g, sizes) if counted else Fraction(0)
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
