"""The obligations of ``check.rankupdate``: ``SC update[g]`` for a clip or a divisor applied on rank 0
of an axis only, ``SC loss_scale`` for a loss scale updated from each rank's own found-inf flag, and
the epsilon on each rank's squared norm added to ``SC clip_norm``; each with its z3 negation and the
concrete replay of a witness.

Input: the obligations so far, the step model, the replay context and the plan. Output: the
obligations with these added (only where the plan states them) and ``SC clip_norm`` wrapped.
"""

from __future__ import annotations

import zlib
from fractions import Fraction
from math import prod

import z3

from ..solver.session import value_of
from . import encode_rankclips as rc
from . import encode_rankproduct as rp
from . import rankset
from . import rankupdate as ru
from .replay import _frac, coords_text
from .report import Counterexample
from .rules import STATE_CONSISTENCY
from .subgroups import LAST_ONLY, SUBSET_VERBS, where
from .values import fold, resolver

SCALE = 65536  # the loss scale before the replayed step (PyTorch's and DeepSpeed's default initial scale, 2**16)


def extend(obs: list, step, ctx, plan, obligation) -> list:
    if plan is None:
        return obs
    obs = _wrap_eps(obs, step, ctx, plan)
    from . import encode_normeps  # the norm's epsilon on some ranks

    obs = encode_normeps.wrap(obs, step, ctx, plan)
    for g in step.groups:
        stated = ru.rank0_stated(plan, g.group)
        if stated:
            obs.append(obligation(
                f"SC update[{g.group}]", STATE_CONSISTENCY, stated[0].span,
                f"every rank applies the same clip coefficient and the same divisor to the {g.group} gradient, so the "
                f"replicas of {g.group} receive the same update and each shard the one single-device training applies",
                lambda env, g=g, st=stated: _update_negation(env, g, st),
                lambda w, g=g, st=stated: replay_update(ctx, w, g, st)))
    o = ru.scale_override(plan)
    if o is not None:
        reduced = ru.overflow_axes(plan, step.groups)
        pend = ru.scale_pending(step.groups, reduced, tuple(o.axes or ()))
        obs.append(obligation(
            "SC loss_scale", STATE_CONSISTENCY, o.span,
            "every rank holds the same dynamic loss scale after the step, the one single-device training reaches: it "
            "is halved or grown from the found-inf flag reduced over every rank whose gradients differ",
            lambda env, pend=pend: _scale_negation(env, pend),
            lambda w, pend=pend: replay_scale(ctx, w, o, reduced)))
    return obs


# --------------------------------------------------------------------------- a clip or a divisor on rank 0 only


def _update_negation(env, g, stated):
    """Two ranks of a named axis (two or more ranks) apply different coefficients: a clip whose
    coefficient is below 1 (the norm above max_norm), or a divisor that is not 1."""
    key = f"{zlib.crc32(g.group.encode()):08x}"
    cons, arms, alone = [], [], []
    divs = rp.combined(stated)  # two or more divisors: the product on each rank (encode_rankproduct)
    if divs:
        arm, ranks = rp.product_arm(env, divs, key)
        arms.append(("product", arm))
    clips = rc.combined(stated)  # two or more clips: a device clips once per statement naming it
    if clips:
        arm, side, device = rc.count_arm(env, clips, key)
        cons += side
        arms.append(("clips", arm))
    for i, o in enumerate(stated):
        if o in divs or o in clips:
            continue
        two = rank_set_splits(env, o) if o.verb in rankset.VERBS else z3.Or([env.size(a) >= 2 for a in o.axes])
        if o.verb in ru.CLIPS:
            norm, cap = env.sess.real(f"ru_norm_{key}"), env.sess.real(f"ru_max_{key}")
            cons += [cap > 0]
            arm = z3.And(two, norm > cap)
        else:
            arm = z3.And(two, env.value(o.by) != 1)
            pinned = all(z3.is_int_value(env.size(a)) for a in o.axes)
            if not pinned or (o.verb != LAST_ONLY and o.verb in SUBSET_VERBS):
                pass  # free sizes: two ranks apart at some size (the arm above); every rank but the last: none at one
            else:  # pinned sizes: rank 0, the last rank or a named rank divides beyond the step's normalisation
                exists = rank_set_some(env, o) if o.verb in rankset.VERBS else z3.BoolVal(True, env.sess.ctx)
                alone.append((f"alone:{i}", z3.And(exists, env.value(o.by) != 1)))
        arms.append((i, arm))
    arms += alone  # after the arms where two ranks differ: a divisor some rank applies (alike on all of them too)
    every = rp.uniform_arm(env, divs, key) if divs else None
    if every is not None:  # last: a product every rank applies alike (encode_rankproduct)
        arms.append(("uniform", every[0]))
    cons.append(z3.Or([a for _, a in arms]))

    def extract(model):
        i = next(i for i, a in arms if value_of(model, a))
        out = {"kind": "rank0_update", "sizes": env.size_values(model), "which": i}
        if i == "uniform":
            return {**out, "rank": every[1](model)}
        if i == "clips":
            return {**out, "rank": device(model)}
        return {**out, "ranks": ranks(model)} if i == "product" else out

    return cons, extract


def replay_update(ctx, w, g, stated):
    """Rank 0 and rank 1 of the first named axis with two or more ranks; per-element gradient 1,
    learning rate 1: rank 0 applies the coefficient (a norm of 2 against max_norm 1: 1/2; or 1/X),
    rank 1 applies 1, single-device training applies the coefficient to every element."""
    if w.get("which") == "product":
        return rp.replay_product(ctx, w, g, rp.combined(stated))
    if w.get("which") == "uniform":
        return rp.replay_uniform(ctx, w, g, rp.combined(stated))
    if w.get("which") == "clips":
        return rc.replay_clips(ctx, w, g, rc.combined(stated))
    if str(w.get("which", "")).startswith("alone:"):
        return replay_alone(ctx, w, g, stated[int(w["which"].split(":")[1])])
    sizes = w["sizes"]
    o = stated[w.get("which", 0)]
    if o.verb == rankset.CLIP:
        nowhere = replay_nowhere(ctx, w, g, o)
        if nowhere is not None:
            return nowhere
    axis = next((a for a in o.axes if sizes.get(a, 1) >= 2), None)
    if axis is None:
        return None
    if o.verb in ru.CLIPS:
        coef, what = Fraction(1, 2), "the clip coefficient max_norm / ‖grad‖ = 1 / 2 (global norm 2, max_norm 1)"
    else:
        x = Fraction(fold(o.by, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})))
        if x in (0, 1):
            return None
        coef, what = 1 / x, f"the division by {_frac(x)}"
    names = ctx.step.axes
    two = (rankset_ranks(ctx, o, names, sizes, axis) if o.verb in rankset.VERBS else
           _two_ranks(o, names, sizes, axis))
    if two is None:
        return None
    r0, r1 = (coords_text(names, c) for c in two)
    if o.verb in rankset.VERBS:  # the axis the two ranks differ on (one sharding g there, if any)
        apart = [a for a in o.axes if two[0][names.index(a)] != two[1][names.index(a)]]
        axis = next((a for a in apart if a in g.shard_axes), apart[0])
    sharded = axis in g.shard_axes
    if o.verb in ru.CLIPS:
        eq = (f"the {g.group} update on {r1} is -1 per element, on {r0} -{_frac(coef)}; single-device training clips "
              f"every element alike, by -{_frac(coef)}")
        whom = "the other ranks step with the unclipped gradient"
    else:
        eq = (f"the {g.group} update on {r1} is -1 per element, on {r0} -{_frac(coef)}: two ranks of {axis} step "
              f"{g.group} by different coefficients, where single-device training applies one to every element")
        whom = "a division the other ranks skip, or one too many there"
    on = rankset.where(o) if o.verb in rankset.VERBS else f"{where(o.verb)} of ({', '.join(o.axes)})"
    diag = (f"{what} is applied to the {g.group} gradient on {on} only (override {o.verb} at line {o.span.line}), "
            f"{whom}: "
            + (f"{g.group} is sharded over {axis}, so its shards are scaled unlike one another" if sharded else
               f"{g.group} is replicated over {axis}, so its replicas drift apart from this step on"),)
    labels = (("rank 0" if o.verb not in SUBSET_VERBS else "rank A", "rank B") if o.verb not in rankset.VERBS else
              _set_labels(o, names, sizes, two))
    return Counterexample(ctx.sizes_tuple(sizes), ((labels[0], r0), (labels[1], r1)),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("coefficient applied", f"{_frac(coef)} on {r0}, 1 on {r1}")),
                          eq, diag, ctx.command(sizes))


def _set_labels(o, names, sizes, two) -> tuple[str, str]:
    """The named rank and the one not named, by their index in the statement's process group."""
    if len(o.axes) == 1:
        i = names.index(o.axes[0])
        return f"{o.axes[0]} rank {two[0][i]} (named)", f"{o.axes[0]} rank {two[1][i]} (not named)"
    group = f"({', '.join(o.axes)})"
    k0, k1 = (rankset.index_of(o, dict(zip(names, c)), sizes) for c in two)
    return f"rank {k0} of {group} (named)", f"rank {k1} of {group} (not named)"


def _two_ranks(o, names, sizes, axis) -> tuple[list[int], list[int]]:
    """A rank the operation is applied on and one it is not (check.subgroups.applies): rank 0 and rank 1
    of ``axis``; for the last rank, that rank of every named axis and rank 0 of ``axis``."""
    if o.verb not in SUBSET_VERBS:
        return [0] * len(names), [1 if a == axis else 0 for a in names]
    last = [sizes[a] - 1 if a in o.axes else 0 for a in names]
    first = [0 if a == axis else c for a, c in zip(names, last)]
    return (last, first) if o.verb == LAST_ONLY else (first, last)


def rankset_ranks(ctx, o, names, sizes, axis) -> tuple[list[int], list[int]] | None:
    """The first rank of ``axis`` the statement names and the first it does not (check.rankset.applied),
    every other axis at rank 0; None where the named ranks are none or all of the axis at these sizes."""
    n = rankset.group_size(o, sizes)
    on = rankset.applied(o, n, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()}))
    off = next((k for k in range(n) if k not in on), None)
    if not on or off is None:
        return None
    c_on, c_off = rankset.coords(o, on[0], sizes), rankset.coords(o, off, sizes)
    return ([c_on.get(a, 0) for a in names], [c_off.get(a, 0) for a in names])


def replay_nowhere(ctx, w, g, o):
    """A clip named on no rank of the axis at the witness's sizes: every rank steps unclipped."""
    sizes, axis = w["sizes"], o.axes[0] if len(o.axes) == 1 else f"({', '.join(o.axes)})"
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    n = rankset.group_size(o, sizes)
    if rankset.applied(o, n, leaf):
        return None
    names = ctx.step.axes
    r0 = coords_text(names, [0] * len(names))
    eq = (f"the {g.group} update on every rank is -1 per element (none of {axis}'s {n} ranks is named); "
          "single-device training clips every element, by -1/2")
    diag = (f"the clip coefficient max_norm / ‖grad‖ = 1 / 2 (global norm 2, max_norm 1) is applied to the {g.group} "
            f"gradient on {rankset.where(o)} only (override {o.verb} at line {o.span.line}), and at "
            f"{', '.join(f'{a} = {sizes[a]}' for a in o.axes)} none of them is a rank of {axis}: no rank clips",)
    return Counterexample(ctx.sizes_tuple(sizes), ((f"{axis} rank 0 (not named)", r0),),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("coefficient applied", "1 on every rank, 1/2 by single-device training")),
                          eq, diag, ctx.command(sizes))


# --------------------------------------------------------------------------- the loss scale's own flag


def _scale_negation(env, pend):
    arms = [((g, a), env.size(a) >= 2) for g, a in pend]
    cons = [z3.Or([c for _, c in arms])] if arms else [z3.BoolVal(False, env.sess.ctx)]

    def extract(model):
        g, a = next(k for k, c in arms if value_of(model, c))
        return {"kind": "loss_scale", "sizes": env.size_values(model), "group": g, "axis": a}

    return cons, extract


def replay_scale(ctx, w, o, reduced):
    """The shard of the group at coordinate 0 of the axis overflows, every other shard is finite;
    each rank halves its scale when the flag it reads is set."""
    sizes, g, a = w["sizes"], w["group"], w["axis"]
    names = ctx.step.axes
    r0 = coords_text(names, [0] * len(names))
    r1 = coords_text(names, [1 if x == a else 0 for x in names])
    read = [x for x in reduced if x not in (o.axes or ())]
    half = SCALE // 2
    eq = (f"the loss scale after the step is {half} on {r0} and {SCALE} on {r1}; single-device training, which sees "
          f"the overflow, halves it to {half}")
    why = (f"the loss scale is updated from each rank's own found-inf flag over ({', '.join(o.axes or ())}) (override "
           f"at line {o.span.line})" if a in (o.axes or ()) else
           f"the found-inf flag the loss scale reads is reduced over ({', '.join(read)}) only, not over {a}")
    diag = (f"{why}: the {g} gradient is sharded over {a}, so only {r0} sees the overflow of its shard and halves its "
            f"scale while {r1} keeps {SCALE}",)
    note = (f"from the next step on, gradients scaled with one rank's scale are unscaled with another's (an all-reduce of "
            f"the ranks' scaled pieces, each rank unscaling the sum by its own: (g0·{half} + g1·{SCALE}) / {half} = g0 + "
            f"2·g1 on {r0}; or a pipeline whose last stage scales the loss)",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                          (("loss scale before the step", str(SCALE)),
                           ("found-inf", f"the {g} shard of {r0} overflows; every other shard is finite")),
                          eq, diag, ctx.command(sizes), note)


# --------------------------------------------------------------------------- ε on each rank's squared norm


def _wrap_eps(obs: list, step, ctx, plan) -> list:
    o = ru.eps_override(plan)
    if o is None:
        return obs
    axes, agg = ru.plan_norm(plan, step.groups)
    for ob in obs:
        if ob.name != "SC clip_norm":
            continue
        ob.encode = _pending_eps(ob.encode, axes if agg == "sum" else (), o.by)
        ob.replay = _replay_eps(ob.replay, ctx, axes, o)
        ob.span = o.span
    return obs


def _pending_eps(orig, axes, eps):
    """The original negation, or ε ≠ 0 summed over an axis of two or more ranks: Σ (s + ε) = S + P·ε."""
    def encode(env):
        cons, extract = orig(env)
        flag = env.sess.bool("clip_eps_before_reduce")
        cond = z3.And(z3.Or([env.size(a) >= 2 for a in axes]), env.value(eps) != 0) if axes else \
            z3.BoolVal(False, env.sess.ctx)
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, cond)]

        def ex(model):
            if value_of(model, flag):
                return {"kind": "clip_eps", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode


def _replay_eps(orig, ctx, axes, o):
    def replay(w):
        if w.get("kind") != "clip_eps":
            return orig(w)
        sizes = w["sizes"]
        eps = Fraction(fold(o.by, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})))
        p = prod(sizes[a] for a in axes)
        reduced, right = 1 + p * eps, 1 + eps  # S = 1: the global squared norm, on rank 0's piece
        if p < 2 or reduced == right:
            return None
        names = ctx.step.axes
        r0 = coords_text(names, [0] * len(names))
        eq = (f"grad-norm² on {r0} = S + {p}·ε = {_frac(reduced)}, but the global value is S + ε = {_frac(right)}: "
              "every rank clips by a larger norm")
        diag = (f"each rank adds ε = {_frac(eps)} to its squared norm (override {o.verb} at line {o.span.line}) before "
                f"the norm is all-reduced over ({', '.join(axes)}): an offset on a partial value, counted once per rank "
                f"({p} times) where single-device training adds it once ((s0 + ε) + (s1 + ε) ≠ s0 + s1 + ε)",)
        return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0),),
                              (("squared norms s", f"1 on {r0}, 0 on each of the other {p - 1} ranks of "
                                                   f"({', '.join(axes)})"), ("ε", _frac(eps))),
                              eq, diag, ctx.command(sizes))
    return replay


def rank_set_some(env, o):
    """z3: at the sizes of ``env`` some named rank is a rank of the statement's process group."""
    n = z3.RealVal(1, env.sess.ctx)
    for a in o.axes:
        n = n * z3.ToReal(env.size(a))
    rs = [env.value(r) for r in o.ranks or ()]
    rs = [r if z3.is_expr(r) else z3.RealVal(str(r), env.sess.ctx) for r in rs]
    return z3.Or([z3.And(z3.IsInt(r), r >= 0, r < n) for r in rs])


def replay_alone(ctx, w, g, o):
    """A rank the divisor applies on (rank 0, the last rank, or the first named rank), per-element gradient 1 and
    learning rate 1: it steps by -1/X, single-device training by -1 (the step's own normalisation is the
    derived one)."""
    sizes = w["sizes"]
    names = ctx.step.axes
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    x = Fraction(fold(o.by, leaf))
    if x in (0, 1):
        return None
    if o.verb in rankset.VERBS:
        on = rankset.applied(o, rankset.group_size(o, sizes), leaf)
        if not on:
            return None
        at = rankset.coords(o, on[0], sizes)
        dev = [at.get(a, 0) for a in names]
    else:
        dev = [sizes[a] - 1 if (o.verb == LAST_ONLY and a in o.axes) else 0 for a in names]
    where_ = rankset.where(o) if o.verb in rankset.VERBS else f"{where(o.verb)} of ({', '.join(o.axes)})"
    text = coords_text(names, dev)
    eq = (f"the {g.group} update on {text} is -{_frac(1 / x)} per element; single-device training's is -1 "
          f"(gradient 1, learning rate 1)")
    diag = (f"the division by {_frac(x)} is applied to the {g.group} gradient on {where_} (override {o.verb} at line "
            f"{o.span.line}), which at these sizes is {text}: a division beyond the step's own normalisation "
            "(every rank of the group that applies it steps by a fraction of single-device training's update)",)
    return Counterexample(ctx.sizes_tuple(sizes), ((f"{where_}", text),),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("coefficient applied", f"{_frac(1 / x)} on {text}")), eq, diag, ctx.command(sizes))


def rank_set_splits(env, o):
    """z3: at the sizes of ``env``, some rank of the axis is not named and (a divisor) some is. The
    named ranks r1..rm are values of the sizes; a rank k in [0, n) is named where some ri = k; among
    0..m one is not named, so "some rank is not named" is a finite disjunction. A clip named on no
    rank at a size is applied nowhere there, where single-device training clips: a violation too."""
    n = z3.RealVal(1, env.sess.ctx)
    for a in o.axes:  # the process group over the named axes: the product of their sizes
        n = n * z3.ToReal(env.size(a))
    rs = [env.value(r) for r in o.ranks or ()]
    rs = [r if z3.is_expr(r) else z3.RealVal(str(r), env.sess.ctx) for r in rs]  # a let folds to a number
    some = z3.Or([z3.And(z3.IsInt(r), r >= 0, r < n) for r in rs])
    missing = z3.Or([z3.And(n > k, *[r != k for r in rs]) for k in range(len(rs) + 1)])
    return missing if o.verb == rankset.CLIP else z3.And(some, missing)
