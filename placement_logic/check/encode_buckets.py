"""The obligation ``GI grads bucket layout`` (``check.buckets``): its z3 negation (some axis where a
group's flat buffers are laid out differently reaches a sum with two or more ranks) and the
concrete replays, in exact rationals: two tensors bucketed in opposite orders on two ranks, and
the tied embedding reduce-scattered at different offsets on the first and last pipeline stage.
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..diagnostics import NO_SPAN
from . import encode as en
from .buckets import Misaligned
from .dims import SPLIT, TOKEN
from .replay import Context, _frac, coords_text
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY

NAME = "GI grads bucket layout"
P_LEN, Q_LEN = 2, 3  # the two tensors of a bucket in the replay


def obligation(step, ctx: Context, make):
    """``make``: the ``Obligation`` constructor (obligations.py owns it)."""
    bm = step.buckets
    span = bm.span if bm.span is not None else step.plan_span
    span = step.plan_span if span == NO_SPAN else span

    def negation(env):
        bad = []
        for m in bm.misaligned:
            extra = (env.sess.true() if not m.scatter else
                     z3.Or([env.size(s) >= 2 for s in m.scatter]))
            bad.append((m.axis, extra))
        return en.axes_negation(env, "buckets", bad)

    reduced = any(d.k >= 1 and (d.kind in (TOKEN, SPLIT) or d.tie) for g in step.groups for d in g.dims)
    return make(NAME, GRADIENT_INTEGRITY, span,
                "every rank of a bucketed reduction lays its flat gradient buffer out alike (the same parameters in "
                "the same order), so the collective sums the same element of the same parameter from every rank",
                negation, lambda w: replay(ctx, w),
                () if reduced else ("vacuous: no gradient is reduced over any axis",))


def _pair(ctx: Context, axis: str, value: int = 1) -> tuple[dict[str, int], dict[str, int]]:
    d0 = {a: 0 for a in ctx.step.axes}
    return d0, dict(d0, **{axis: value})


def replay(ctx: Context, w: dict) -> Counterexample | None:
    sizes, axis = w["sizes"], w["axis"]
    if sizes[axis] < 2:
        return None
    for m in ctx.step.buckets.misaligned:
        if m.axis != axis:
            continue
        if not m.scatter:
            return _replay_flat(ctx, sizes, m)
        scatter = [s for s in m.scatter if sizes[s] >= 2]
        if scatter:
            return _replay_tie(ctx, sizes, m, scatter[0])
    return None


def _replay_flat(ctx: Context, sizes: dict[str, int], m: Misaligned) -> Counterexample:
    """Two tensors P (2 elements) and Q (3) of the group; rank r's gradients (r+1)·[1, 2] and
    (r+1)·[10, 20, 30]. Rank 0 of the axis buckets P then Q, the others Q then P; the collective
    sums offset 0 of every rank, which rank 0 reads back as P[0]."""
    step, n, g = ctx.step, sizes[m.axis], m.group
    p = [[Fraction((r + 1) * (i + 1)) for i in range(P_LEN)] for r in range(n)]
    q = [[Fraction((r + 1) * 10 * (j + 1)) for j in range(Q_LEN)] for r in range(n)]
    bufs = [p[r] + q[r] if r == 0 else q[r] + p[r] for r in range(n)]
    got = sum(b[0] for b in bufs)
    want = sum(p[r][0] for r in range(n))
    d0, d1 = _pair(ctx, m.axis)
    a_txt, b_txt = coords_text(step.axes, d0.values()), coords_text(step.axes, d1.values())
    eq = (f"{g} P[0] on {a_txt} after the reduction over {m.axis} = {_frac(got)} (offset 0 of every rank: P[0] = "
          f"{_frac(p[0][0])} from {a_txt}, Q[0] from the others, {_frac(q[1][0])} from {b_txt}) but the sum of P[0] "
          f"over the {n} {m.axis} ranks = {_frac(want)}")
    diag = (f"the {g} gradient buckets are laid out in different parameter orders on the {m.axis} ranks (override at "
            f"line {m.span.line}): the collective over {m.axis} sums the elements at equal offsets, so it adds one "
            "tensor's gradient into another's; every rank must bucket the same parameters in the same order "
            "(registration order, not the order the gradients become ready on each rank)",)
    values = (("layout A", f"P[0:{P_LEN}], Q[0:{Q_LEN}]"), ("layout B", f"Q[0:{Q_LEN}], P[0:{P_LEN}]"),
              ("P grad on A", _vec(p[0])), ("Q grad on A", _vec(q[0])),
              ("P grad on B", _vec(p[1])), ("Q grad on B", _vec(q[1])))
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", a_txt), ("rank B", b_txt)), values, eq, diag,
                          ctx.command(sizes))


def _replay_tie(ctx: Context, sizes: dict[str, int], m: Misaligned, s: str) -> Counterexample:
    """A buffer of 2·n elements per stage (n: the ranks of ``s``), 2 per rank's shard; the tied
    embedding's element E[0] at offset 0 on the first stage (owned by rank 0 of ``s``) and at
    offset 2n−2 on the last (owned by rank n−1). Its gradient on rank d: d+1 on the first stage,
    10·(d+1) on the last. The reduce-scatter over ``s`` runs, then the tie's all-reduce over the
    stages adds what rank 0 of ``s`` holds on each."""
    step, n, pp = ctx.step, sizes[s], m.axis
    first = [Fraction(d + 1) for d in range(n)]
    last = [Fraction(10 * (d + 1)) for d in range(n)]
    reduced_first = sum(first)  # offset 0 is rank 0's shard on the first stage
    local_last = last[0]  # offset 2n-2 is rank n-1's shard on the last stage: rank 0 keeps its own value
    got, want = reduced_first + local_last, sum(first) + sum(last)
    d0 = {a: 0 for a in step.axes}
    d1 = dict(d0, **{pp: sizes[pp] - 1})
    a_txt, b_txt = coords_text(step.axes, d0.values()), coords_text(step.axes, d1.values())
    eq = (f"{m.group} E[0] on {a_txt} (the rank whose shard holds it on the first stage) after the reduce-scatter "
          f"over {s} and the tie's all-reduce over {pp} = {_frac(reduced_first)} + {_frac(local_last)} = "
          f"{_frac(got)} but the sum over both stages and the {n} {s} ranks = {_frac(want)}")
    diag = (f"the tied {m.group} gradient sits at different offsets of the flat buffer on the first and the last {pp} "
            f"stage (override at line {m.span.line}) and is reduce-scattered over {s} before its all-reduce over {pp}: "
            f"on the last stage E[0] falls in the shard of {s} rank {n - 1}, so the {s} rank that owns it on the first "
            "stage adds its unreduced copy; all-reduce the tied gradient over the stages before the reduce-scatter "
            "(or lay the embedding out at the same offset on both)",)
    values = (("E[0] offset on the first stage", "0"), ("E[0] offset on the last stage", str(2 * n - 2)),
              (f"E[0] grads on the first stage, {s} ranks 0..{n - 1}", _vec(first)),
              (f"E[0] grads on the last stage, {s} ranks 0..{n - 1}", _vec(last)))
    return Counterexample(ctx.sizes_tuple(sizes), (("first stage", a_txt), ("last stage", b_txt)), values, eq, diag,
                          ctx.command(sizes))


def _vec(xs) -> str:
    return "[" + ", ".join(_frac(x) for x in xs) + "]"
