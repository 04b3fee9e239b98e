"""The obligations of ``check.subgroups``: ``GI grads[g] blocks`` for a gradient reduction run within
blocks of an axis's ranks, and the blocks of the grad norm's reduction added to ``SC clip_norm``;
each with its z3 negation and the concrete replay of a witness. (A divisor on every rank but the
last, or on the last only, is ``SC update[g]``: ``check.rankupdate_obligations``.)

Input: the obligations so far, the step model, the replay context and the plan. Output: the
obligations with these added (only where the plan states them) and ``SC clip_norm`` wrapped.
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..solver.session import value_of
from . import subgroups as sg
from .replay import _frac, coords_text
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY
from .values import fold, resolver


def extend(obs: list, step, ctx, plan, obligation) -> list:
    if plan is None:
        return obs
    for g in step.groups:
        o = sg.grad_blocks(plan, g.group)
        if o is None:
            continue
        obs.append(obligation(
            f"GI grads[{g.group}] blocks", GRADIENT_INTEGRITY, o.span,
            f"the {g.group} gradient is reduced over the whole of every axis its reduction runs in blocks over "
            f"({', '.join(o.axes or ())}): one block of B ranks holds the axis, so every rank holds the sum of "
            "every rank's contribution",
            lambda env, o=o: _blocks_negation(env, o, "blocks"),
            lambda w, g=g, o=o: replay_grad_blocks(ctx, w, g.group, o)))
    o = sg.norm_blocks(plan)
    if o is not None:
        for ob in obs:
            if ob.name == "SC clip_norm":
                ob.encode = _wrap(ob.encode, o)
                ob.replay = _wrap_replay(ob.replay, ctx, o)
                ob.span = o.span
    return obs


def _cond(env, o):
    """B a positive whole number below the size of a named axis: two blocks or more there."""
    b = env.value(o.by)
    side = [b >= 1] + ([z3.IsInt(b)] if z3.is_real(b) else [])
    arms = [(a, env.real(env.size(a)) > b) for a in o.axes or ()]
    return side, arms


def _blocks_negation(env, o, kind):
    side, arms = _cond(env, o)
    cons = side + [z3.Or([c for _, c in arms])]

    def extract(model):
        a = next(a for a, c in arms if value_of(model, c))
        return {"kind": kind, "sizes": env.size_values(model), "axis": a}

    return cons, extract


def _wrap(orig, o):
    """The original negation, or a norm block smaller than a named axis."""
    def encode(env):
        cons, extract = orig(env)
        flag = env.sess.bool("clip_norm_blocks")
        side, arms = _cond(env, o)
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, z3.And(side + [z3.Or([c for _, c in arms])]))]

        def ex(model):
            if value_of(model, flag):
                a = next(a for a, c in arms if value_of(model, c))
                return {"kind": "norm_blocks", "sizes": env.size_values(model), "axis": a}
            return extract(model)

        return out, ex
    return encode


def _block(ctx, o, sizes) -> Fraction:
    return Fraction(fold(o.by, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})))


def _ranks(ctx, sizes, axis, b):
    """Rank 0 and the first rank of the second block of ``axis`` (coordinate B there, 0 elsewhere)."""
    names = ctx.step.axes
    return (coords_text(names, [0] * len(names)), coords_text(names, [int(b) if a == axis else 0 for a in names]))


def replay_grad_blocks(ctx, w, group, o):
    """Every rank's contribution 0 but rank 0's, 1: the sum over the axis is 1 on every rank; the sum
    over the block of the first rank of the second block is 0."""
    sizes, axis = w["sizes"], w["axis"]
    b, n = _block(ctx, o, sizes), sizes[axis]
    if b.denominator != 1 or not 1 <= b < n:
        return None
    r0, r1 = _ranks(ctx, sizes, axis, b)
    hi = min(2 * int(b), n) - 1
    eq = (f"the reduced {group} gradient on {r1} is 0 (the sum over ranks {int(b)}..{hi} of {axis}, its block), on {r0} "
          f"1; summed over all {n} ranks of {axis}, as single-device training sums every token's contribution, it "
          "is 1")
    diag = (f"the {group} gradient is reduced over {axis} within blocks of {_frac(b)} consecutive ranks (override "
            f"{o.verb} at line {o.span.line}: a process group over part of the axis, such as one group per node), "
            f"not over the whole axis of {n} ranks: each block holds a partial sum of its own, so the replicas of "
            f"{group} in different blocks receive different gradients, none of them the global one",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                          (("per-rank contribution", f"1 on {r0}, 0 on every other rank"),
                           ("block size", _frac(b))), eq, diag, ctx.command(sizes))


def _wrap_replay(orig, ctx, o):
    def replay(w):
        if w.get("kind") != "norm_blocks":
            return orig(w)
        sizes, axis = w["sizes"], w["axis"]
        b, n = _block(ctx, o, sizes), sizes[axis]
        if b.denominator != 1 or not 1 <= b < n:
            return None
        r0, r1 = _ranks(ctx, sizes, axis, b)
        eq = (f"grad-norm² on {r1} = 0, on {r0} = 1, but the global value is 1: the ranks of the second block of "
              f"{axis} clip by a norm that misses the first block's shards")
        diag = (f"the grad norm is reduced over {axis} within blocks of {_frac(b)} consecutive ranks (override "
                f"{o.verb} at line {o.span.line}: a process group over part of the axis), not over the whole axis of "
                f"{n} ranks whose shards it sums: each block's norm counts its own shards only, and the blocks clip "
                "by different coefficients",)
        return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                              (("squared norms s", f"1 on the shard of {r0}, 0 on every other shard"),
                               ("block size", _frac(b))), eq, diag, ctx.command(sizes))
    return replay
