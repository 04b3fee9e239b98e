"""The obligation of ``check.amax_blocks``: ``SC amax[g]`` beside ``override amax[g]: blockwise over (AXES) by
B`` or ``rowwise over (AXES)``: every scaling block of g's fp8 tensors lies inside one rank's shard along each
dimension a named axis splits (the shard's elements a multiple of B), so each rank's block maxima, and the
scales fp8_max / amax, are single-device training's. Its z3 negation (sizes, the model's shape facts holding,
at which a named axis's shard boundary falls inside a block) and the concrete replay of a witness: the block
that straddles two ranks, one element on each side, and the scales each rank and single-device training give.

Input: the obligations so far, the step model, the replay context and the plan. Output: the obligations
with these added (only where the plan states them).
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..solver.session import value_of
from . import amax, amax_blocks
from .divisors import divisors
from .replay import _frac
from .report import Counterexample, coords_text
from .rules import STATE_CONSISTENCY


def extend(obs: list, step, ctx, plan, obligation) -> list:
    if plan is None:
        return obs
    sp = step.sequence_parallel
    amax_blocks.check_override(plan, step.groups, sp, ctx.bindings)
    for o in amax_blocks.stated(plan):
        found = amax_blocks.splits(plan, o, step.groups, sp, ctx.bindings)
        b = amax_blocks.block(o, ctx.bindings)
        name = f"SC amax[{o.group}]" if o.group not in (None, "all") else "SC amax"
        obs.append(obligation(
            name, STATE_CONSISTENCY, o.span,
            "every fp8 scaling block (row) of the group lies inside one rank's shard along each dimension the "
            "named axes split, so each rank's block amax is single-device training's",
            lambda env, found=found, b=b: _negation(env, found, b),
            lambda w, o=o, found=found, b=b: replay(ctx, w, o, found, b),
            tuple(f"replaces {amax_blocks.head(x)} (line {x.span.line}): the last granularity statement of a "
                  "key is the one in force" for x in amax_blocks.replaced(plan, o))))
    return obs


def _prefix(d: amax_blocks.Dim, a: str) -> tuple[str, ...]:
    return d.axes if d.copies else d.axes[:d.axes.index(a) + 1]


def _divisors(v: int) -> list[int]:
    return divisors(v)  # by factoring: a trial division up to √v would not end for seq = 10**30


def _negation(env, found, b):
    c = env.sess.ctx
    arms, side = [], []
    for i, (_g, d, a) in enumerate(found):
        if not d.copies:
            side += [z3.Or([env.size(x) == k for k in _divisors(d.value)]) for x in _prefix(d, a)]
        n = z3.IntVal(d.scale, c)
        for x in _prefix(d, a):
            n = n * env.size(x)
        width = d.value * d.unit if b is None else b
        count = z3.If(d.value % n == 0, d.value / n, 1) if d.copies else d.value / n
        cross = (count * d.unit) % width != 0
        arms.append((i, z3.And(env.size(a) >= 2, cross)))
    cons = side + ([z3.Or([x for _, x in arms])] if arms else [z3.BoolVal(False, c)])

    def extract(model):
        i = next(k for k, x in arms if value_of(model, x))
        return {"kind": "amax_blocks", "sizes": env.size_values(model), "arm": i}

    return cons, extract


def _boundary(d: amax_blocks.Dim, a: str, sizes: dict) -> int:
    """The position of the first element of the shard at coordinate 1 of ``a`` (others 0)."""
    n = d.scale
    for x in d.axes:
        n *= sizes.get(x, 1)
    if d.copies:
        return d.shard(n)
    stride = 1
    for x in d.axes[d.axes.index(a) + 1:]:
        stride *= sizes.get(x, 1)
    return stride * d.shard(n)


def replay(ctx, w, o, found, b):
    """The boundary p between a's coordinates 0 and 1 inside the block [kB, kB + B): rank A holds element
    p - 1 = 1, rank B element p = 2, the block's other elements 0. E4M3's fp8_max is 448."""
    sizes, (g, d, a) = w["sizes"], found[w["arm"]]
    if sizes.get(a, 1) < 2:
        return None
    p = _boundary(d, a, sizes)
    width = d.value * d.unit if b is None else b
    if p % width == 0:
        return None
    k = p // width
    names = ctx.step.axes
    faster = d.axes[d.axes.index(a) + 1:] if not d.copies else ()
    ra = coords_text(names, [sizes.get(x, 1) - 1 if x in faster else 0 for x in names])
    rb = coords_text(names, [1 if x == a else 0 for x in names])
    fmax = Fraction(amax.FP8_MAX)
    s_a, s_b, s_one = fmax / 1, fmax / 2, fmax / 2
    unit = "row" if b is None else f"block of {b}"
    eq = (f"the {unit} [{k * width}, {(k + 1) * width}) of {d.what} of the {g} tensors has amax 2 on one device, "
          f"scale {_frac(s_one)}; split at element {p} (shards of {d.shard(_count(d, sizes))}), {ra} sees amax 1 and "
          f"scales by {_frac(s_a)}, {rb} sees 2 and scales by {_frac(s_b)}")
    stmt = (f"override amax: {o.verb} over ({', '.join(o.axes or ())}) at line {o.span.line}"
            + ("" if b is None else f", blocks of {b}"))
    diag = (f"the fp8 scales of the {g} layers are taken per {'row' if b is None else 'block'} from each rank's own "
            f"shard ({stmt}), but {a} cuts {d.what} ({d.value} {'elements' if d.unit == 1 else f'heads of {d.unit}'}) into shards of {d.shard(_count(d, sizes))} "
            f"elements, not a multiple of the {'row' if b is None else f'block size {b}'}: a "
            f"{'row' if b is None else 'block'} straddles two ranks and each takes the maximum of its part only "
            f"(its amax needs an all-reduce (max) over {a}, or shards of whole {'rows' if b is None else 'blocks'})",)
    note = (f"{ra}'s element 1 is cast to 1 x {_frac(s_a)} = {_frac(s_a)} in place of single-device training's "
            f"1 x {_frac(s_one)} = {_frac(s_one)}",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", ra), ("rank B", rb)),
                          (("element", f"{p - 1} = 1 on {ra}, {p} = 2 on {rb}, the {unit}'s others 0"),
                           ("fp8_max", f"{amax.FP8_MAX} (E4M3)")),
                          eq, diag, ctx.command(sizes), note)


def _count(d: amax_blocks.Dim, sizes: dict) -> int:
    n = d.scale
    for x in d.axes:
        n *= sizes.get(x, 1)
    return n

