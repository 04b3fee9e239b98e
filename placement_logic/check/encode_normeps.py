"""The z3 arm and the replay of the grad norm's epsilon on some ranks (``check.normeps``): added to
``SC clip_norm`` where the plan states ``override clip_norm: eps_on_ranks over (AXES) ranks (R1, ...) by EPS``.

Input: the obligations, the step, the replay context and the plan. Output: ``SC clip_norm`` with its negation
widened by one arm, sizes where a device's norm holds ε a number of times other than once (the distinct named
ranks that are whole numbers in [0, n), a sum of 0/1 terms, times the sizes of the other reductions), with
ε ≠ 0, and the concrete replay of its witness: every squared norm 0 but one rank's, 1, and ε on each named
rank, summed over the norm's reduction by hand.
"""

from __future__ import annotations

from fractions import Fraction

import z3

from . import encode as en
from . import normeps, rankset
from .replay import _frac, coords_text
from .report import Counterexample
from .values import fold, resolver


def wrap(obs: list, step, ctx, plan) -> list:
    o = normeps.stated(plan)
    if o is None:
        return obs
    axes = normeps.norm_axes(plan, step.groups)
    for ob in obs:
        if ob.name == "SC clip_norm":
            ob.encode = _widened(ob.encode, o, axes)
            ob.replay = _replayed(ob.replay, ctx, o, axes)
            ob.span = o.span
    return obs


def _const(env, v):
    return v if z3.is_expr(v) else z3.RealVal(str(v), env.sess.ctx)


def count_term(env, o, axes):
    """z3: how many times a device's norm holds ε."""
    n = z3.IntVal(1, env.sess.ctx)
    for a in o.axes:
        n = n * env.size(a)
    n = z3.ToReal(n)
    rs = [_const(env, env.value(r)) for r in o.ranks or ()]
    one, zero = z3.RealVal(1, env.sess.ctx), z3.RealVal(0, env.sess.ctx)
    fresh = [z3.And(z3.IsInt(r), r >= 0, r < n, *[r != rs[j] for j in range(i)]) for i, r in enumerate(rs)]
    c = z3.Sum([z3.If(f, one, zero) for f in fresh])
    for a in normeps.multipliers(o, axes):
        c = c * z3.ToReal(env.size(a))
    return c


def _widened(orig, o, axes):
    """The original negation, or a device's norm holding ε other than once (a choice between the two)."""
    def encode(env):
        arm = [count_term(env, o, axes) != 1, _const(env, env.value(o.by)) != 0]
        return en.any_negation(env, [orig(env), (arm, lambda m: {"kind": "clip_eps_on_ranks",
                                                                 "sizes": env.size_values(m)})], "clip_eps_on_ranks")
    return encode


def _replayed(orig, ctx, o, axes):
    def replay(w):
        if w.get("kind") != "clip_eps_on_ranks":
            return orig(w)
        return replay_eps(ctx, w, o, axes)
    return replay


def replay_eps(ctx, w, o, axes) -> Counterexample | None:
    """Device 0's squared norm 1, every other 0; ε added on each named rank of the group over AXES (every
    coordinate on the other axes), then summed over the norm's reductions in order: the norm device 0 reads."""
    sizes = w["sizes"]
    known = {k: Fraction(v) for k, v in sizes.items()}
    for alias, name in ctx.step.size_aliases().items():
        if name in known:
            known.setdefault(alias, known[name])
    leaf = resolver(ctx.bindings, known)
    eps = Fraction(fold(o.by, leaf))
    named = rankset.applied(o, rankset.group_size(o, sizes), leaf)
    c = normeps.count(o, axes, sizes, leaf)
    if eps == 0 or c == 1:
        return None
    reduced, right = 1 + c * eps, 1 + eps
    names = ctx.step.axes
    r0 = coords_text(names, [0] * len(names))
    shown = ", ".join(coords_text(o.axes, [rankset.coords(o, k, sizes)[a] for a in o.axes]) for k in named[:4])
    group = f"({', '.join(o.axes)})"
    others = normeps.multipliers(o, axes)
    why = (f"{len(named)} named rank{'s' if len(named) != 1 else ''} of {group} at "
           + ", ".join(f"{a} = {sizes[a]}" for a in o.axes)
           + (f", each repeated over ({', '.join(others)}), which the reduction also sums" if others else ""))
    eq = (f"grad-norm² on {r0} = S + {c}·ε = {_frac(reduced)}, but single-device training's is S + ε = "
          f"{_frac(right)}")
    diag = (f"ε = {_frac(eps)} is added on {rankset.where(o)} only (override clip_norm: eps_on_ranks at line "
            f"{o.span.line}) before the norm is summed over ({', '.join(axes)}): {why}, so every rank's norm holds "
            f"ε {c} times where single-device training adds it once"
            + (" (no rank adds it at these sizes)" if c == 0 else ""),)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0),),
                          (("squared norms s", f"1 on {r0}, 0 on every other rank"), ("ε", _frac(eps)),
                           ("ranks adding ε", shown + (", ..." if len(named) > 4 else "") if named else "none")),
                          eq, diag, ctx.command(sizes))
