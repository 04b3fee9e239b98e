"""The z3 arms and the replay of a loss term's operations on some ranks (``check.termranks``): they replace
the negations of ``GI loss[T]`` and ``GI loss[T] grads[g]`` (check.losses) where the plan states them.

Input: the term's obligations, its statements (at most one ``on_ranks``, at most one ``divide_on_ranks``),
its views and the replay context. Output: the obligations with their negation the disjunction of four
arms, which together cover every size where the term's weights are wrong:

- ``dropped``: a device (a coordinate per axis the statements name, each in [0, n)) that ``on_ranks``
  does not name: it weights its own contributions 0;
- ``apart``: a device ``divide_on_ranks`` names and one it does not, with X ≠ 1: two devices weight theirs
  1/X and 1;
- ``base``: ``on_ranks`` names every rank (or is absent) and ``divide_on_ranks`` names none, or X = 1:
  every weight is 1, and the path's own normalisation is wrong (``encode.gi_negation``);
- ``scaled``: both name every rank and X ≠ 1: the path's divisor times X is wrong.

"Names every rank" is a count: the distinct named ranks that are whole numbers in [0, n) number n. The
replay recomputes the weights by hand at the witness's sizes (``dropped``, ``apart``) or runs the term's
step with the divisor the sizes give (``base``, ``scaled``: ``losses.replay_term``).
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from fractions import Fraction

import z3

from .. import ir
from ..solver.session import value_of
from . import encode as en
from . import steps
from . import termranks as tr
from .replay import _frac, coords_text
from .report import Counterexample
from .values import resolver

KIND = "term_ranks"


def _const(env, v):
    return v if z3.is_expr(v) else z3.RealVal(str(v), env.sess.ctx)


def _index(env, o, c: dict):
    k = c[o.axes[0]]
    for a in o.axes[1:]:
        k = k * env.size(a) + c[a]
    return z3.ToReal(k)


def _member(env, o, c: dict):
    k = _index(env, o, c)
    return z3.Or([k == _const(env, env.value(r)) for r in o.ranks or ()])


def _size(env, o):
    n = z3.IntVal(1, env.sess.ctx)
    for a in o.axes:
        n = n * env.size(a)
    return z3.ToReal(n)


def _named(env, o):
    """(some named rank is a rank of the group, the named ranks are every rank of it): counts of the distinct
    whole numbers in [0, n) among them."""
    n = _size(env, o)
    rs = [_const(env, env.value(r)) for r in o.ranks or ()]
    valid = [z3.And(z3.IsInt(r), r >= 0, r < n) for r in rs]
    one, zero = z3.RealVal(1, env.sess.ctx), z3.RealVal(0, env.sess.ctx)
    fresh = [z3.And(valid[i], *[r != rs[j] for j in range(i)]) for i, r in enumerate(rs)]
    count = z3.Sum([z3.If(f, one, zero) for f in fresh])
    return z3.Or(valid), count == n


def _device(env, o, key: str) -> dict:
    return {a: env.sess.int(f"tr_{key}_{a}") for a in o.axes}


def _inside(env, c: dict) -> list:
    return [z3.And(x >= 0, x < env.size(a)) for a, x in c.items()]


def _scaled_group(g: steps.GroupModel, by: ir.Value) -> steps.GroupModel:
    base = g.divisor_value
    if base is None:
        base = ir.const(1)
        for a in g.divisor_axes:
            base = ir.Op("*", (base, ir.Sym(a)))
    return replace(g, divisor_value=ir.Op("*", (base, by)))


def arms(env, stmts: list, view, key: str):
    """The four arms for one view (a group the term reaches): [(constraints, extract)]."""
    on = next((o for o in stmts if o.verb == tr.ON), None)
    div = next((o for o in stmts if o.verb == tr.DIVIDE), None)
    ctx = env.sess.ctx
    true = z3.BoolVal(True, ctx)
    out = []
    on_full = _named(env, on)[1] if on is not None else true
    if on is not None:
        c = _device(env, on, f"{key}_drop")
        out.append((_inside(env, c) + [z3.Not(_member(env, on, c))], _hand(env, view, "dropped", c)))
    base_ok, scaled = [on_full], None
    if div is not None:
        x = _const(env, env.value(div.by))
        some, full = _named(env, div)
        c1, c2 = _device(env, div, f"{key}_in"), _device(env, div, f"{key}_out")
        out.append((_inside(env, c1) + _inside(env, c2) + [on_full, x != 0, x != 1, _member(env, div, c1),
                                                             z3.Not(_member(env, div, c2))],
                    _hand(env, view, "apart", c1, c2)))
        base_ok.append(z3.Or(z3.Not(some), x == 1))
        scaled = [on_full, full, x != 0, x != 1]
    cons, extract = en.gi_negation(env, view.group, f"trb_{key}")
    out.append((base_ok + cons, extract))
    if scaled is not None:
        cons, extract = en.gi_negation(env, _scaled_group(view.group, div.by), f"trs_{key}")
        out.append((scaled + cons, lambda m, extract=extract: {**extract(m), "scaled": True}))
    return out


def _hand(env, view, which: str, *devices):
    def extract(model) -> dict:
        return {"kind": KIND, "which": which, "group": view.group.group, "sizes": env.size_values(model),
                "devices": [{a: value_of(model, x) for a, x in c.items()} for c in devices]}
    return extract


def negation(env, stmts: list, views: list, name: str):
    key = f"{zlib.crc32(name.encode()):08x}"
    parts = [a for i, v in enumerate(views) for a in arms(env, stmts, v, f"{key}_{i}")]
    return en.any_negation(env, parts, f"tr_{key}")


def extend(obs: list, plan, views, ctx, replay_term) -> list:
    """The term obligations with the rank arms in place of their negation where the term has statements on
    sets of ranks (``replay_term``: check.losses's replay of the term's step)."""
    for term in dict.fromkeys(v.term for v in views):
        stmts = tr.stated(plan, term)
        if not stmts:
            continue
        mine = {v.group.group: v for v in views if v.term == term}
        for ob in obs:
            if ob.name == f"GI loss[{term}]":
                chosen = list(mine.values())
            elif ob.name.startswith(f"GI loss[{term}] grads["):
                chosen = [mine[ob.name[len(f"GI loss[{term}] grads["):-1]]]
            else:
                continue
            ob.encode = lambda env, chosen=chosen, name=ob.name, stmts=stmts: negation(env, stmts, chosen, name)
            ob.replay = lambda w, stmts=stmts, mine=mine: replay(ctx, w, stmts, mine, replay_term)
            ob.span = stmts[0].span
    return obs


def replay(ctx, w, stmts, views, replay_term):
    v = views[w["group"]]
    if w.get("kind") == KIND:
        return replay_ranks(ctx, w, stmts, v)
    sizes = w["sizes"]
    leaf = _leaf(ctx, sizes)
    weights = _weights(stmts, sizes, leaf)
    if weights is None or len(set(weights.values())) != 1:
        return None  # the weights differ between the devices: the by-hand arms say so
    phi = next(iter(weights.values()))
    div = next((o for o in stmts if o.verb == tr.DIVIDE), None)
    if phi == 0 or (phi != 1) != bool(w.get("scaled")) or (phi != 1 and div is None):
        return None
    if phi == 1:
        cex = replay_term(ctx, w, v)
        note = f"every device weights the {v.term} term's contributions 1 at these sizes ({_stated(stmts)})"
    else:
        cex = replay_term(ctx, w, replace(v, group=_scaled_group(v.group, div.by)))
        note = (f"every device divides the {v.term} term's contributions by {ir.show(div.by)} at these sizes "
                f"({_stated(stmts)}, naming every rank there): the path's divisor times {ir.show(div.by)}")
    return None if cex is None else replace(cex, diagnosis=cex.diagnosis + (note,))


def _leaf(ctx, sizes: dict):
    """The witness's sizes, the model's microbatch symbol among them (as the encoding reads it), then the lets."""
    known = {k: Fraction(x) for k, x in sizes.items()}
    for alias, name in ctx.step.size_aliases().items():
        if name in known:
            known.setdefault(alias, known[name])
    return resolver(ctx.bindings, known)


def _stated(stmts) -> str:
    return "; ".join(tr.text(o) for o in stmts)


def _weights(stmts, sizes, leaf) -> dict | None:
    axes = tr.axes_of(stmts)
    if not all(a in sizes for a in axes):
        return None
    return {k: tr.factor(stmts, dict(zip(axes, k)), sizes, leaf) for k in _grid(axes, sizes)}


def replay_ranks(ctx, w, stmts, v) -> Counterexample | None:
    """Every contribution of the term 0 but the witness devices' own, 1 each (on element 0 of the group): their
    weights recomputed by hand; single-device training weights every device's alike, by 1 after the path's
    normalisation. A device of a tied group's middle stage holds none of it: no counterexample there."""
    sizes, devs = w["sizes"], w["devices"]
    axes = tr.axes_of(stmts)
    if not all(0 <= x < sizes[a] for c in devs for a, x in c.items()):
        return None
    tied = [d.axis for d in v.group.dims if d.tie and d.axis in axes]
    if any(0 < c.get(a, 0) < sizes[a] - 1 for c in devs for a in tied):
        return None
    leaf = _leaf(ctx, sizes)
    fs = [tr.factor(stmts, {a: c.get(a, 0) for a in axes}, sizes, leaf) for c in devs]
    if not (fs[0] == 0 or (len(fs) == 2 and fs[0] != fs[1])):
        return None
    names = ctx.step.axes
    shown = [coords_text(names, [c.get(a, 0) for a in names]) for c in devs]
    term, group = v.term, v.group.group
    where = ", ".join(f"{a} = {sizes[a]}" for a in axes)
    weights = ", ".join(f"{_frac(f)} on {d}" for f, d in zip(fs, shown))
    eq = (f"the {term} part of grad[{group}] from the contributions of {' and '.join(shown)} is weighted {weights}; "
          "single-device training weights every device's contribution 1 (after the path's normalisation)")
    diag = [f"the {term} loss term is {_stated(stmts)}: at {where}, " + (
        f"{shown[0]} is not named, so its {term} contributions are dropped (the term is not computed there)"
        if fs[0] == 0 else f"{shown[0]} weights its {term} contributions {_frac(fs[0])} and {shown[1]} "
        f"{_frac(fs[1])}, where the objective weights every device's alike")]
    total = sum((f for f in _weights(stmts, sizes, leaf).values()), Fraction(0))
    n = len(_grid(axes, sizes))
    sharded = [d.axis for d in v.group.dims if d.kind == steps.SHARDED and d.axis in axes]
    if sharded:
        diag.append(f"{group} is sharded over ({', '.join(sharded)}): each rank there holds {group} parameters of its "
                    "own (its layers), and " + (f"those of {shown[0]} receive none of the {term} term's gradient"
                                                if fs[0] == 0 else f"those of the two devices are trained with "
                                                f"{term} weights {_frac(fs[0])} and {_frac(fs[1])}"))
    elif total != n:
        diag.append(f"summed over the {n} ranks of ({', '.join(axes)}), the {term} term's weights total "
                    f"{_frac(total)} where single-device training's total {n}: for equal contributions on every rank "
                    + (f"its gradient is multiplied by {_frac(total / n)}" if total else "it is dropped altogether"))
    return Counterexample(ctx.sizes_tuple(sizes), tuple((f"device {i + 1}", d) for i, d in enumerate(shown)),
                          ((f"{term} contributions", f"1 (normalised) from {' and '.join(shown)} to element "
                                                     f"{group}[0], 0 from every other device"),
                           ("weights applied", f"{weights}; 1 on every device by single-device training")),
                          eq, tuple(diag), ctx.command(sizes))


def _grid(axes, sizes):
    out = [()]
    for a in axes:
        out = [t + (i,) for t in out for i in range(sizes[a])]
    return out
