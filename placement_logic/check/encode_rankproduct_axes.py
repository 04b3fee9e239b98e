"""Two or more divisors on sets of ranks of different axes for one group: each device applies the product of
the divisors whose rank sets hold it, read from its coordinate along each statement's axes.

Input: the query's ``Env`` (or a replay ``Context`` and a witness) and the group's divisor statements
(``divide_rank0_only``, ``divide_except_last``, ``divide_last_only`` over their axes: rank 0 of every axis, the
last rank of every axis, every rank but that one; ``divide_on_ranks ... ranks (R1, ...)``: the named ranks of
the process group over its axes, the first axis the most significant). Output, as ``check.encode_rankproduct``'s
for one common axis: the z3 condition that two devices apply different products (``product_arm``, a device a
coordinate per axis the statements name, each in [0, n)), that some device's product is not 1
(``uniform_arm``), and the concrete replays of a witness (``replay_product``, ``replay_uniform``), which
recompute each device's product by hand at the witness's sizes.
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..ir.overrides import OverrideVerb
from ..solver.session import value_of
from . import rankset
from . import subgroups as sg
from .replay import _frac, coords_text
from .report import Counterexample
from .values import fold, resolver

ON = OverrideVerb.DIVIDE_ON_RANKS


def spread(divs: list) -> bool:
    """Whether the statements are not all over one common axis (the case ``check.encode_rankproduct`` reads)."""
    axes = {tuple(o.axes or ()) for o in divs}
    return len(axes) > 1 or any(len(a) != 1 for a in axes)


def axes_of(divs: list) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for o in divs for a in o.axes or ()))


def _device(env, divs, name: str) -> dict:
    return {a: env.sess.int(f"rpx_{name}_{a}") for a in axes_of(divs)}


def _in_range(env, c: dict) -> list:
    return [z3.And(x >= 0, x < env.size(a)) for a, x in c.items()]


def _member(env, o, c: dict):
    ns = {a: env.size(a) for a in o.axes}
    if o.verb == OverrideVerb.DIVIDE_RANK0_ONLY:
        return z3.And([c[a] == 0 for a in o.axes])
    last = z3.And([c[a] == ns[a] - 1 for a in o.axes])
    if o.verb == OverrideVerb.DIVIDE_LAST_ONLY:
        return last
    if o.verb == OverrideVerb.DIVIDE_EXCEPT_LAST:
        return z3.Not(last)
    k = c[o.axes[0]]
    for a in o.axes[1:]:
        k = k * ns[a] + c[a]
    rs = [env.value(r) for r in o.ranks or ()]
    return z3.Or([z3.ToReal(k) == (r if z3.is_expr(r) else z3.RealVal(str(r), env.sess.ctx)) for r in rs])


def _product(env, divs, c: dict):
    one = z3.RealVal(1, env.sess.ctx)
    out = one
    for o in divs:
        x = env.value(o.by)
        x = x if z3.is_expr(x) else z3.RealVal(str(x), env.sess.ctx)
        out = out * z3.If(_member(env, o, c), x, one)
    return out


def _read(model, c: dict) -> dict:
    return {a: value_of(model, x) for a, x in c.items()}


def product_arm(env, divs, key: str):
    """z3: two devices apply different products of the divisors; and a reader of their coordinates."""
    c1, c2 = _device(env, divs, f"a_{key}"), _device(env, divs, f"b_{key}")
    arm = z3.And(*_in_range(env, c1), *_in_range(env, c2), _product(env, divs, c1) != _product(env, divs, c2))
    return arm, lambda model: (_read(model, c1), _read(model, c2))


def uniform_arm(env, divs, key: str):
    """z3: some device applies a product other than 1 (a division beyond the step's own normalisation)."""
    c = _device(env, divs, f"u_{key}")
    return z3.And(*_in_range(env, c), _product(env, divs, c) != 1), lambda model: _read(model, c)


def _applies(o, c: dict, sizes: dict, leaf) -> bool:
    """Whether the statement's rank set holds the device of coordinates ``c`` (counted by hand)."""
    if o.verb != ON:
        return sg.applies(o.verb, tuple(c[a] for a in o.axes), tuple(sizes[a] for a in o.axes))
    return rankset.index_of(o, c, sizes) in rankset.applied(o, rankset.group_size(o, sizes), leaf)


def _prod(divs, c, sizes, leaf) -> tuple[Fraction, list]:
    on = [o for o in divs if _applies(o, c, sizes, leaf)]
    p = Fraction(1)
    for o in on:
        p *= Fraction(fold(o.by, leaf))
    return p, on


def _dev(ctx, c: dict) -> str:
    names = ctx.step.axes
    return coords_text(names, [c.get(a, 0) for a in names])


def _stated(divs, leaf) -> str:
    return "; ".join(f"{o.verb} by {_frac(Fraction(fold(o.by, leaf)))} on {_where(o)} at line {o.span.line}"
                     for o in divs)


def _where(o) -> str:
    return rankset.where(o) if o.verb == ON else f"{sg.where(o.verb)} of ({', '.join(o.axes)})"


def _ok(c: dict, sizes: dict) -> bool:
    return all(0 <= v < sizes[a] for a, v in c.items())


def replay_product(ctx, w, g, divs):
    """Two devices (every axis the statements do not name at 0), per-element gradient 1, learning rate 1: each
    applies 1 / (the product of the divisors whose rank sets hold it); single-device training applies one."""
    sizes, (c1, c2) = w["sizes"], w["ranks"]
    if not (_ok(c1, sizes) and _ok(c2, sizes)):
        return None
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    (p1, on1), (p2, on2) = _prod(divs, c1, sizes, leaf), _prod(divs, c2, sizes, leaf)
    if p1 == p2:
        return None
    d1, d2 = _dev(ctx, c1), _dev(ctx, c2)
    apart = [a for a in axes_of(divs) if c1[a] != c2[a]]
    axis = next((a for a in apart if a in g.shard_axes), apart[0])

    def applied(on) -> str:
        return ", ".join(f"{o.verb} at line {o.span.line}" for o in on) or "no divisor"

    eq = (f"the {g.group} update on {d1} is -{_frac(1 / p1)} per element, on {d2} -{_frac(1 / p2)}: two devices "
          f"step {g.group} by different coefficients, where single-device training applies one to every element")
    diag = (f"the divisors on sets of ranks of different axes ({_stated(divs, leaf)}) multiply to {_frac(p1)} on "
            f"{d1} ({applied(on1)}) and to {_frac(p2)} on {d2} ({applied(on2)}) at "
            f"{', '.join(f'{a} = {sizes[a]}' for a in axes_of(divs))}: "
            + (f"{g.group} is sharded over {axis}, so its shards are scaled unlike one another" if axis in g.shard_axes
               else f"{g.group} is replicated over {axis}, so its replicas drift apart from this step on"),)
    return Counterexample(ctx.sizes_tuple(sizes), (("device A", d1), ("device B", d2)),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("divisor product", f"{_frac(p1)} on {d1}, {_frac(p2)} on {d2}")),
                          eq, diag, ctx.command(sizes))


def replay_uniform(ctx, w, g, divs):
    """One device, per-element gradient 1, learning rate 1: it applies 1 / (its product); single-device training
    applies 1."""
    sizes, c = w["sizes"], w["rank"]
    if not _ok(c, sizes):
        return None
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    p, on = _prod(divs, c, sizes, leaf)
    if p == 1:
        return None
    d = _dev(ctx, c)
    eq = (f"the {g.group} update on {d} is -{_frac(1 / p)} per element; single-device training's is -1 "
          "(gradient 1, learning rate 1)")
    diag = (f"the divisors on sets of ranks of different axes ({_stated(divs, leaf)}) divide the {g.group} gradient "
            f"by {_frac(p)} on {d} ({', '.join(o.verb for o in on)}), a division beyond the step's own "
            "normalisation",)
    return Counterexample(ctx.sizes_tuple(sizes), (("device", d),),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("divisor product", f"{_frac(p)} on {d}")), eq, diag, ctx.command(sizes))
