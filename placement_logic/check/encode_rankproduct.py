"""Two or more divisors on sets of one axis's ranks for one group: each rank applies the product of the
divisors whose rank sets hold it (over different axes, or several: check.encode_rankproduct_axes).

Input: the query's ``Env`` (or a replay ``Context`` and a witness) and the group's divisor statements:
``divide_rank0_only`` (rank 0), ``divide_except_last`` (every rank but the last), ``divide_last_only``
(the last rank) and ``divide_on_ranks ... ranks (R1, ...)`` (the named ranks), all over the same axis.
Output: the z3 condition that two ranks of the axis apply different products (``product_arm``) and the
concrete replay of a witness (``replay_product``); and the condition that some rank's product is not 1
(``uniform_arm``, ``replay_uniform``): a product the same on every rank still divides every rank's gradient
beyond the step's own normalisation.
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..ir.overrides import OverrideVerb
from ..solver.session import value_of
from . import encode_rankproduct_axes as rpx
from . import rankset
from .replay import _frac, coords_text
from .report import Counterexample
from .values import fold, resolver

DIVIDES = (OverrideVerb.DIVIDE_RANK0_ONLY, OverrideVerb.DIVIDE_EXCEPT_LAST, OverrideVerb.DIVIDE_LAST_ONLY,
           OverrideVerb.DIVIDE_ON_RANKS)
WHERE = {OverrideVerb.DIVIDE_RANK0_ONLY: "rank 0", OverrideVerb.DIVIDE_EXCEPT_LAST: "every rank but the last",
         OverrideVerb.DIVIDE_LAST_ONLY: "the last rank"}


def combined(stated: list) -> list:
    """The divisor statements of a group, where there are two or more (else none)."""
    divs = [o for o in stated if o.verb in DIVIDES]
    return divs if len(divs) >= 2 else []


def _member(env, o, k, n):
    if o.verb == OverrideVerb.DIVIDE_RANK0_ONLY:
        return k == 0
    if o.verb == OverrideVerb.DIVIDE_EXCEPT_LAST:
        return k != n - 1
    if o.verb == OverrideVerb.DIVIDE_LAST_ONLY:
        return k == n - 1
    rs = [env.value(r) for r in o.ranks or ()]
    kr = z3.ToReal(k)
    return z3.Or([kr == (r if z3.is_expr(r) else z3.RealVal(str(r), env.sess.ctx)) for r in rs])


def _product(env, divs, k, n):
    out = z3.RealVal(1, env.sess.ctx)
    for o in divs:
        x = env.value(o.by)
        x = x if z3.is_expr(x) else z3.RealVal(str(x), env.sess.ctx)
        out = out * z3.If(_member(env, o, k, n), x, z3.RealVal(1, env.sess.ctx))
    return out


def product_arm(env, divs, key: str):
    """z3: two ranks k1, k2 of the common axis apply different products of the divisors. Returns the arm and
    a function reading (k1, k2) from a model. Over different axes: check.encode_rankproduct_axes."""
    if rpx.spread(divs):
        return rpx.product_arm(env, divs, key)
    n = env.size(divs[0].axes[0])
    k1, k2 = env.sess.int(f"rp_k1_{key}"), env.sess.int(f"rp_k2_{key}")
    arm = z3.And(k1 >= 0, k1 < n, k2 >= 0, k2 < n, _product(env, divs, k1, n) != _product(env, divs, k2, n))
    return arm, lambda model: (value_of(model, k1), value_of(model, k2))


def _applies(o, k: int, n: int, leaf) -> bool:
    if o.verb == OverrideVerb.DIVIDE_RANK0_ONLY:
        return k == 0
    if o.verb == OverrideVerb.DIVIDE_EXCEPT_LAST:
        return k != n - 1
    if o.verb == OverrideVerb.DIVIDE_LAST_ONLY:
        return k == n - 1
    return k in rankset.applied(o, n, leaf)


def _where(o) -> str:
    return rankset.where(o) if o.verb == OverrideVerb.DIVIDE_ON_RANKS else f"{WHERE[o.verb]} of {o.axes[0]}"


def replay_product(ctx, w, g, divs):
    """Rank k1 and rank k2 of the axis (every other axis at 0), per-element gradient 1 and learning rate 1:
    each applies 1 / (the product of the divisors naming it); single-device training applies one coefficient."""
    if rpx.spread(divs):
        return rpx.replay_product(ctx, w, g, divs)
    sizes, (k1, k2) = w["sizes"], w["ranks"]
    axis, n = divs[0].axes[0], w["sizes"][divs[0].axes[0]]
    if not (0 <= k1 < n and 0 <= k2 < n):
        return None
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    on = {k: [o for o in divs if _applies(o, k, n, leaf)] for k in (k1, k2)}
    prod = {k: Fraction(1) for k in (k1, k2)}
    for k in (k1, k2):
        for o in on[k]:
            prod[k] *= Fraction(fold(o.by, leaf))
    if prod[k1] == prod[k2]:
        return None
    names = ctx.step.axes
    dev = {k: coords_text(names, [k if a == axis else 0 for a in names]) for k in (k1, k2)}

    def applied(k) -> str:
        if not on[k]:
            return "no divisor"
        return ", ".join(f"{o.verb} by {_frac(Fraction(fold(o.by, leaf)))} at line {o.span.line}" for o in on[k])

    eq = (f"the {g.group} update on {dev[k1]} is -{_frac(1 / prod[k1])} per element, on {dev[k2]} "
          f"-{_frac(1 / prod[k2])}: two ranks of {axis} step {g.group} by different coefficients, where single-device "
          "training applies one to every element")
    diag = (f"the divisors on sets of {axis}'s ranks ({'; '.join(f'{o.verb} on {_where(o)}' for o in divs)}) multiply "
            f"to {_frac(prod[k1])} on {axis} rank {k1} ({applied(k1)}) and to {_frac(prod[k2])} on {axis} rank {k2} "
            f"({applied(k2)}) at {axis} = {n}: "
            + (f"{g.group} is sharded over {axis}, so its shards are scaled unlike one another" if axis in g.shard_axes
               else f"{g.group} is replicated over {axis}, so its replicas drift apart from this step on"),)
    return Counterexample(ctx.sizes_tuple(sizes), ((f"{axis} rank {k1}", dev[k1]), (f"{axis} rank {k2}", dev[k2])),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("divisor product", f"{_frac(prod[k1])} on {dev[k1]}, {_frac(prod[k2])} on {dev[k2]}")),
                          eq, diag, ctx.command(sizes))


# --------------------------------------------------------------------------- a divisor every rank applies


def divisors(stated: list) -> list:
    """The divisor statements on sets of ranks of a group (one or more)."""
    return [o for o in stated if o.verb in DIVIDES]


def uniform_arm(env, divs, key: str):
    """z3: some rank k of the statements' common axis applies a product of the divisors other than 1. The
    arms above catch two ranks that differ; this one also catches a product every rank applies alike (the
    named ranks all of the axis at its size, or an axis of one rank): the gradient divided again on every
    rank, where the derived step's own normalisation already makes single-device training's. Over several
    axes or different ones: check.encode_rankproduct_axes."""
    if rpx.spread(divs):
        return rpx.uniform_arm(env, divs, key)
    axis = divs[0].axes[0] if divs[0].axes else None
    if axis is None or any(tuple(o.axes or ()) != (axis,) for o in divs):
        return None
    n = env.size(axis)
    k = env.sess.int(f"rp_u_{key}")
    return z3.And(k >= 0, k < n, _product(env, divs, k, n) != 1), lambda model: value_of(model, k)


def replay_uniform(ctx, w, g, divs):
    """Rank k of the axis (every other axis at 0), per-element gradient 1 and learning rate 1: it applies
    1 / (the product of the divisors naming it); single-device training applies 1."""
    if rpx.spread(divs):
        return rpx.replay_uniform(ctx, w, g, divs)
    sizes, k = w["sizes"], w["rank"]
    axis = divs[0].axes[0]
    n = sizes[axis]
    if not 0 <= k < n:
        return None
    leaf = resolver(ctx.bindings, {a: Fraction(v) for a, v in sizes.items()})
    prods = []
    for j in range(n):
        p = Fraction(1)
        for o in divs:
            if _applies(o, j, n, leaf):
                p *= Fraction(fold(o.by, leaf))
        prods.append(p)
    if prods[k] == 1:
        return None
    names = ctx.step.axes
    dev = coords_text(names, [k if a == axis else 0 for a in names])
    every = len(set(prods)) == 1
    eq = (f"the {g.group} update on {dev} is -{_frac(1 / prods[k])} per element; single-device training's is -1 "
          f"(gradient 1, learning rate 1)")
    stated = "; ".join(f"{o.verb} by {_frac(Fraction(fold(o.by, leaf)))} on {_where(o)} at line {o.span.line}"
                       for o in divs)
    diag = (f"the divisors on sets of {axis}'s ranks ({stated}) "
            + (f"divide the {g.group} gradient by {_frac(prods[k])} on every rank of {axis} at {axis} = {n}: a "
               "division beyond the step's own normalisation, so every rank steps by a fraction of single-device "
               "training's update (a uniform rescaling is stated as `override grads: divide by X`)" if every else
               f"divide the {g.group} gradient by {_frac(prods[k])} on {axis} rank {k} at {axis} = {n}, a division "
               "beyond the step's own normalisation"),)
    return Counterexample(ctx.sizes_tuple(sizes), ((f"{axis} rank {k}", dev),),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("divisor product", ", ".join(f"{_frac(p)} on {axis} rank {j}" for j, p in enumerate(prods)))),
                          eq, diag, ctx.command(sizes))
