"""A group's squared norm counted on a rank set over several axes at once:
``override clip_norm[g]: count_on_ranks over (A, B, ...) ranks (R1, R2, ...)``.

Input: the plan's overrides and the step's ``GroupModel`` records (``check_statement``, ``apply_one``, called by
``check.rankcount``); the obligations so far, the step model, the replay context and the plan (``extend``).
Output: the located errors of a statement the step cannot read, the records with the statement's replicated
axes counted once (``clip_rank0``: the baseline the rest of ``SC clip_norm`` is read with), and ``SC clip_norm``
wrapped with the set's own condition, its z3 negation and its concrete replay.

Each Ri names a rank of the process group over A, B, ... (its coordinates read as one number, the first axis
the most significant: rank a·|B| + b, as a device mesh flattened over ("A", "B") numbers them; n = |A|·|B|·...);
a value that is not a whole number in [0, n) names no rank. g's squared norm enters the norm's all-reduce
over those axes from the named ranks only. Each piece of g over the axes of the set (its coordinates on the
axes it is sharded over; one piece where it is replicated over all of them) must be counted once: the
obligation holds iff, at every size, every piece is held by exactly one named rank. Its negation asks for
sizes and a piece whose count c differs from 1 (each named rank's coordinates a mixed-radix decomposition of
its value, an integer per axis); the replay recomputes the named ranks' coordinates at the witness's sizes by
hand and sums a squared norm of 1 on that piece over them: c on every rank, against 1.

Errors (raised through ``check.rankcount``): PL506 (an axis named twice), PL170 (an axis the group's norm is not
summed over), PL260 (rank0_only over one of the axes for the group too), PL129 (an average, a max, roots before
the reduction, or copied kv heads on one of the axes).
"""

from __future__ import annotations

import zlib
from fractions import Fraction

import z3

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..solver.session import value_of
from . import rankset
from .report import Counterexample, coords_text
from .values import fold, resolver


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def check_statement(o: ir.Override, summed: list, copy_axes) -> None:
    """The errors of a statement over several axes for the groups ``summed`` it reaches."""
    twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
    if twice is not None:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{rankset.head(o)} changes nothing the second time it names {twice}: "
                   "a process group over several axes names each once", o)
    for g in summed:
        missing = next((a for a in o.axes if a not in (g.clip_axes or ())), None)
        if missing is not None:
            raise _err(Code.RANK0_UNREDUCED_AXIS, f"{rankset.head(o)}: the squared norm of {g.group} is not summed "
                       f"over {missing}, so each rank of {missing} counts only its own value there; a count on some "
                       "ranks applies to axes the norm is all-reduced over", o)
        both = next((a for a in o.axes if a in g.clip_rank0), None)
        if both is not None:
            raise _err(Code.NORM_RANK_SETS_TWICE, f"{rankset.head(o)}: the {g.group} norm is counted on rank 0 of "
                       f"{both} only by another statement (override clip_norm: rank0_only at line "
                       f"{g.clip_rank0_span.line}); state one rank set per axis (rank0_only is ranks (0))", o)
        if g.clip_agg != "sum" or g.clip_sqrt or any(a in g.clip_copies or a in copy_axes(g) for a in o.axes):
            raise _err(Code.NOT_MODELLED, f"{rankset.head(o)}: a count on some ranks of the {g.group} norm is "
                       "modelled for a plain sum of squared norms over axes that split or replicate the group (not "
                       "with an average, a max, roots taken before the reduction or copied kv heads)", o)


def apply_one(g, o: ir.Override):
    """The record read with every piece counted once over the statement's axes: its copies on a replicated axis
    counted on one rank (the set's own counts are ``extend``'s condition)."""
    from dataclasses import replace

    if not all(a in (g.clip_axes or ()) for a in o.axes):
        return g
    rep = tuple(a for a in o.axes if a not in g.shard_axes)
    return replace(g, clip_rank0=tuple(dict.fromkeys(g.clip_rank0 + rep)), clip_rank0_span=o.span)


def stated(plan: ir.Plan, group: str) -> ir.Override | None:
    o = rankset.counts_stated(plan.overrides, group)
    return o if o is not None and len(o.axes or ()) >= 2 else None


# --------------------------------------------------------------------------- the obligation


def _tag(o: ir.Override, group: str) -> str:
    return f"cnt_{zlib.crc32((rankset.head(o) + group).encode()):08x}"


def _piece_axes(g, o: ir.Override) -> tuple[str, ...]:
    return tuple(a for a in o.axes if a in g.shard_axes)


def _wrong(env, g, o: ir.Override):
    """Sizes and a piece of g (coordinates on the set's sharded axes) held by a number of named ranks other than
    one: each named rank's value its mixed-radix coordinates over the set's axes."""
    ctx, tag = env.sess.ctx, _tag(o, g.group)
    ns = [env.size(a) for a in o.axes]
    weights = [z3.IntVal(1, ctx)]
    for n in reversed(ns[1:]):
        weights.insert(0, weights[0] * n)
    total = weights[0] * ns[0]
    rs = [env.value(r) for r in o.ranks or ()]
    rs = [r if z3.is_expr(r) else z3.RealVal(str(r), ctx) for r in rs]
    cons, hits = [], []
    piece = {a: env.sess.int(f"{tag}_piece_{a}") for a in _piece_axes(g, o)}
    cons += [z3.And(y >= 0, y < env.size(a)) for a, y in piece.items()]
    for i, r in enumerate(rs):
        valid = z3.And(z3.IsInt(r), r >= 0, r < z3.ToReal(total), *[r != q for q in rs[:i]])
        xs = {a: env.sess.int(f"{tag}_r{i}_{a}") for a in o.axes}
        cons += [z3.And(x >= 0, x < n) for x, n in zip(xs.values(), ns)]
        cons.append(z3.Implies(valid, r == z3.ToReal(z3.Sum([x * w for x, w in zip(xs.values(), weights)]))))
        hits.append(z3.If(z3.And(valid, *[xs[a] == y for a, y in piece.items()]), 1, 0))
    count = z3.Sum(hits) if hits else z3.IntVal(0, ctx)
    return z3.And(*cons, count != 1), piece


def _wrap(orig, cases, env_kind="count_multi"):
    def encode(env):
        cons, extract = orig(env)
        arms = [(g, o, *_wrong(env, g, o)) for g, o in cases]
        flag = env.sess.bool(f"count_multi_{_tag(cases[0][1], cases[0][0].group)}")
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, z3.Or([c for _, _, c, _ in arms]))]

        def ex(model):
            if not value_of(model, flag):
                return extract(model)
            g, o, _, piece = next(a for a in arms if value_of(model, a[2]))
            return {"kind": env_kind, "sizes": env.size_values(model), "group": g.group,
                    "piece": {a: value_of(model, y) for a, y in piece.items()}}

        return out, ex
    return encode


def extend(obs: list, step, ctx, plan) -> list:
    """``SC clip_norm`` wrapped with the condition of every count on a rank set over several axes."""
    if plan is None:
        return obs
    cases = [(g, o) for g in step.groups for o in (stated(plan, g.group),)
             if o is not None and all(a in (g.clip_axes or ()) for a in o.axes)]
    if not cases:
        return obs
    for ob in obs:
        if ob.name == "SC clip_norm":
            ob.encode = _wrap(ob.encode, cases)
            orig = ob.replay
            ob.replay = lambda w, orig=orig: replay(ctx, w, cases) if w.get("kind") == "count_multi" else orig(w)
            ob.span = cases[0][1].span
    return obs


def holders(o: ir.Override, sizes: dict[str, int], leaf) -> list[dict[str, int]]:
    """The coordinates on the statement's axes of each distinct rank it names at these sizes."""
    n, seen, out = rankset.group_size(o, sizes), set(), []
    for r in o.ranks or ():
        v = Fraction(fold(r, leaf))
        if v.denominator == 1 and 0 <= v < n and v not in seen:
            seen.add(v)
            out.append(rankset.coords(o, int(v), sizes))
    return out


def replay(ctx, w, cases):
    """A squared norm of 1 on the witness's piece of the group, 0 on every other: summed over the named ranks that
    hold it (counted by hand from their coordinates), against 1."""
    sizes = w["sizes"]
    g, o = next((g, o) for g, o in cases if g.group == w["group"])
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    piece = w["piece"]
    if any(not 0 <= c < sizes[a] for a, c in piece.items()):
        return None
    held = [h for h in holders(o, sizes, leaf) if all(h[a] == c for a, c in piece.items())]
    if len(held) == 1:
        return None
    names = ctx.step.axes
    at = coords_text(names, [piece.get(a, 0) for a in names])
    whom = ", ".join(coords_text(names, [h.get(a, 0) for a in names]) for h in held) or "no device"
    what = (f"the piece of {g.group} on ({', '.join(f'{a}={c}' for a, c in piece.items())})" if piece
            else f"{g.group} (replicated over {', '.join(o.axes)})")
    eq = (f"grad-norm² = {len(held)} on every rank, but the global value is 1: {what} is counted on "
          f"{len(held)} of the named ranks ({whom})")
    diag = (f"{g.group} is counted in the norm on {rankset.ranks_text(o)} of the process group over "
            f"({', '.join(o.axes)}) only (override at line {o.span.line}): at "
            f"{', '.join(f'{a} = {sizes[a]}' for a in o.axes)} {what} is held by {len(held)} of the named ranks, so "
            f"it is counted {len(held)} times where it is counted once",)
    return Counterexample(ctx.sizes_tuple(sizes), (("piece", at),),
                          (("squared norms s", f"1 on {what}, 0 on every other piece"),
                           ("named ranks", rankset.ranks_text(o))), eq, diag, ctx.command(sizes))
