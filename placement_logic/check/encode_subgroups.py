"""The obligations of ``check.subgroups``: ``GI grads[g] blocks`` for a gradient reduction run within
groups over part of an axis (blocks, strided groups, the first K ranks, consecutive groups of unequal sizes,
the process groups of a list of rank sets: a group index per rank, read from the runs or the sets), and the groups of the grad
norm's reduction added to ``SC clip_norm``;
each with its z3 negation and the concrete replay of a witness. (A divisor on every rank but the
last, or on the last only, is ``SC update[g]``: ``check.encode_rankupdate``.)

Input: the obligations so far, the step model, the replay context and the plan. Output: the
obligations with these added (only where the plan states them) and ``SC clip_norm`` wrapped; PL250 where
consecutive groups of unequal sizes meet an axis pinned at another size than their sum.
"""

from __future__ import annotations

import zlib
from fractions import Fraction

import z3

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import ranksets, unequal
from ..solver.session import value_of
from . import encode_normsets, encode_ranksets, fixedsizes, normsets_replaced
from . import subgroups as sg
from .replay import _frac, coords_text
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY
from .values import fold, resolver


def extend(obs: list, step, ctx, plan, obligation) -> list:
    if plan is None:
        return obs
    for g in step.groups:
        stated = sg.grad_partitions(plan, g.group)  # over different axes: each axis cut by its own statement
        if not stated:
            continue
        key = f"{zlib.crc32(g.group.encode()):08x}"
        infos = [_info(plan, g, o) for o in stated]
        for i, o in enumerate(stated):
            kind = "blocks" if i == 0 else f"blocks:{i}"
            for ob in obs:  # the whole-plan obligation holds only if the blocks hold the axis too
                if ob.name == f"GI grads[{g.group}]":
                    ob.encode = _wrap(ob.encode, o, f"grad_blocks_{key}" + (f"_{i}" if i else ""), kind, infos[i])
                    ob.replay = _described(_wrap_replay(ob.replay, kind, lambda w, g=g, o=o, f=infos[i]: _replay(
                        ctx, w, g.group, o, f)), o)
        texts = "; ".join(f"{sg.groups_text(o)} over ({', '.join(o.axes or ())})" for o in stated)
        obs.append(obligation(
            f"GI grads[{g.group}] blocks", GRADIENT_INTEGRITY, stated[0].span,
            f"the {g.group} gradient is reduced over the whole of every axis its reduction runs in {texts}: one "
            "group holds the axis, so every rank holds the sum of every rank's contribution",
            lambda env, st=stated, f=infos: _all_negation(env, st, "blocks", f),
            _described(lambda w, g=g, st=stated, f=infos: _replay(ctx, w, g.group, st[w.get("stmt", 0)],
                                                                  f[w.get("stmt", 0)]), *stated),
            aspect_of=g.group))
    for i, o in enumerate(sg.norm_partitions(plan)):
        kind = "norm_blocks" if i == 0 else f"norm_blocks:{i}"
        if sg.multi_sets(o):  # rank sets over several axes (check.encode_normsets)
            _norm_sets(obs, step, ctx, plan, o, i, kind)
            continue
        for ob in obs:
            if ob.name == "SC clip_norm":
                ob.encode = _wrap(ob.encode, o, "clip_norm_blocks" + (f"_{i}" if i else ""), kind)
                ob.replay = _described(_wrap_replay(ob.replay, kind, lambda w, o=o: replay_norm_blocks(ctx, w, o)), o)
                ob.span = o.span
    return _pinned_elsewhere(obs, step, ctx, plan)


def _norm_sets(obs, step, ctx, plan, o, i, kind) -> None:
    encode_normsets.refuse(step, o)
    normsets_replaced.check(plan, o)  # a norm reduction over the sets' axes they replace: PL506
    sizes = sg.set_sizes(o, plan)
    for ob in obs:
        if ob.name == "SC clip_norm":
            ob.encode = encode_normsets.wrap(ob.encode, o, step, sizes, "clip_norm_sets" + (f"_{i}" if i else ""),
                                             kind)
            ob.replay = _wrap_replay(ob.replay, kind, lambda w: encode_normsets.replay(ctx, w, o, step, sizes))
            ob.span = o.span


def _info(plan, g, o):
    """Rank sets over several axes: (the sets, the axes' sizes on the mesh, which of them g's gradient is reduced
    over); None for any other statement."""
    if not sg.multi_sets(o):
        return None
    return sg.sets_of(o), sg.set_sizes(o, plan), tuple(a in sg.reduced_axes(g) for a in o.axes)


def _replay(ctx, w, group, o, info):
    if info is not None:
        return encode_ranksets.replay(ctx, w, group, o, *info)
    return replay_grad_blocks(ctx, w, group, o)


def _all_negation(env, stated, kind, infos=None):
    """Some statement cuts one of its axes into two groups or more (the arms of every statement)."""
    cons, arms = [], []
    for i, o in enumerate(stated):
        info = infos[i] if infos else None
        side, mine = _cond(env, o, info)
        cons += side + fixed_size(env, o, info)
        arms += [(i, o, a, c) for a, c in mine]
    cons.append(z3.Or([c for *_, c in arms]))

    def extract(model):
        i, o, a, _ = next(x for x in arms if value_of(model, x[3]))
        return {**_witness(env, model, o, kind, a, infos[i] if infos else None), "stmt": i}

    return cons, extract


def _pinned_elsewhere(obs: list, step, ctx, plan) -> list:
    """PL250 where the axis of consecutive groups of the sizes S1, S2, ... is pinned at another size than their
    sum: the statement describes the axis at S1 + S2 + ... only, so the sizes cannot partition the axis there."""
    stated = [o for g in step.groups for o in sg.grad_partitions(plan, g.group)] + sg.norm_partitions(plan)
    for o in stated:
        if o is not None and sg.multi_sets(o):
            _sets_pinned_axes(o, ctx.pinned, plan)
        elif o is not None and o.verb == sg.SETS and o.axes[0] in ctx.pinned:
            _sets_pinned(o, ctx.pinned[o.axes[0]])
        if o is None or o.verb != sg.GROUPS or o.axes[0] not in ctx.pinned:
            continue
        total, n = sum(sg.sizes_of(o)), ctx.pinned[o.axes[0]]
        if n != total:
            parts = " + ".join(map(str, sg.sizes_of(o)))
            raise DiagnosticError([Diagnostic(
                Code.GROUP_SIZES, f"{sg.head(o)}: the groups hold {total} ranks ({parts}), but {o.axes[0]} is pinned "
                f"at {n}; the sizes of consecutive groups add up to the axis's size (pin {o.axes[0]}={total}, or "
                "none)", o.span)])
    fixedsizes.check(plan, [o for o in stated if o is not None], ctx.pinned, ctx.bindings)  # sizes the model takes
    return obs


def _sets_pinned(o, n: int) -> None:
    """PL268 where the axis of rank sets is pinned at another size than the number of ranks they hold."""
    held = ranksets.held(sg.sets_of(o))
    if n != held:
        raise DiagnosticError([Diagnostic(
            Code.RANK_SETS_COVER, f"{sg.head(o)}: the sets hold {held} ranks, but {o.axes[0]} is pinned at {n}; the "
            f"sets of one reduction partition the axis's ranks (pin {o.axes[0]}={held}, or none)", o.span)])


def _sets_pinned_axes(o, pinned: dict, plan) -> None:
    """PL268 where an axis of rank sets over several axes is pinned at another size than the mesh's: the sets
    number the ranks of the product at the mesh's sizes."""
    for a, n in zip(o.axes, sg.set_sizes(o, plan)):
        if a in pinned and pinned[a] != n:
            raise DiagnosticError([Diagnostic(
                Code.RANK_SETS_COVER, f"{sg.head(o)}: the sets number the ranks of ({', '.join(o.axes)}) with {a} = "
                f"{n}, but {a} is pinned at {pinned[a]}; the flattened ranks mean other devices there (pin {a}={n}, "
                "or none)", o.span)])


def _cond(env, o, info=None):
    """E a positive whole number and a named axis cut into two groups or more: n > B (blocks), S >= 2 and
    n >= 2 (strided groups: ranks 0 and 1 apart), n > K (the first K ranks); the axis of the size S1 + S2 + ...
    (consecutive groups, two or more: PL506 leaves no list of one)."""
    if info is not None:
        return [], [(o.axes[0], encode_ranksets.arm(env, o, *info))]
    if o.verb in (sg.GROUPS, sg.SETS):
        return [], [(o.axes[0], _two_groups(env, o))]
    b = env.value(o.by)
    side = [b >= 1] + ([z3.IsInt(b)] if z3.is_real(b) else [])
    arms = []
    for a in o.axes or ():
        n = env.real(env.size(a))
        cut = z3.And(b >= 2, n >= 2) if o.verb == sg.STRIDED else n > b
        arms.append((a, z3.And(cut, _whole_blocks(env, o, a))))
    return side, arms


def _described(replay, *stated):
    """``replay``, refusing a witness at sizes a list of sizes or of rank sets does not describe (the shrinking of
    a witness axis by axis keeps only the sizes the statements hold: PL250, PL268 elsewhere)."""
    def out(w):
        sizes = w.get("sizes", {})
        for o in stated:
            if sg.multi_sets(o):  # the axes' sizes on the mesh: encode_ranksets.replay refuses others
                continue
            want = sum(sg.sizes_of(o)) if o.verb == sg.GROUPS else ranksets.held(sg.sets_of(o)) \
                if o.verb == sg.SETS else None
            if want is not None and sizes.get(o.axes[0], want) != want:
                return None
        return replay(w)
    return out


def fixed_size(env, o, info=None) -> list:
    """A list of sizes or of rank sets describes its axis at the number of ranks it holds only: the axis's size
    there, in every witness (another statement's arm, or the obligation it wraps, included)."""
    if info is not None:
        return encode_ranksets.fixed(env, o, info[1])
    if o.verb == sg.GROUPS:
        return [env.fix(o.axes[0], sum(sg.sizes_of(o)))]
    if o.verb == sg.SETS:
        return [env.fix(o.axes[0], ranksets.held(sg.sets_of(o)))]
    return []


def _group_index(sizes: tuple[int, ...], i):
    """The group of rank ``i`` of consecutive groups of ``sizes``: how many of the ends S1, S1 + S2, ... (the
    last, the axis's size, left out) are <= i."""
    ends, at = [], 0
    for s in sizes[:-1]:
        at += s
        ends.append(at)
    return z3.Sum([z3.If(i >= e, 1, 0) for e in ends])


def _set_index(sets: tuple[tuple[int, ...], ...], i):
    """The group of rank ``i`` of the process groups of ``sets``: the index of the set holding it, read from the
    sets (0 for a rank no set holds, which the axis's size ``held`` leaves out)."""
    return z3.Sum([z3.If(z3.Or([i == r for r in s]), j, 0) for j, s in enumerate(sets)])


def _ranks_of(env, o):
    tag = f"groups_{zlib.crc32(sg.head(o).encode()):08x}"
    return env.sess.int(f"{tag}_a"), env.sess.int(f"{tag}_b")


def _two_groups(env, o):
    """The axis of the size S1 + S2 + ... and two of its ranks whose group indices differ (the groups a proper
    partition of the axis)."""
    n = env.size(o.axes[0])
    ra, rb = _ranks_of(env, o)
    if o.verb == sg.SETS:
        sets = sg.sets_of(o)
        return z3.And(n == ranksets.held(sets), ra >= 0, ra < n, rb >= 0, rb < n,
                      _set_index(sets, ra) != _set_index(sets, rb))
    sizes = sg.sizes_of(o)
    return z3.And(n == sum(sizes), ra >= 0, ra < n, rb >= 0, rb < n,
                  _group_index(sizes, ra) != _group_index(sizes, rb))


def _witness(env, model, o, kind, a, info=None) -> dict:
    w = {"kind": kind, "sizes": env.size_values(model), "axis": a}
    if info is not None:
        w["ranks"] = tuple(value_of(model, r) for r in encode_ranksets.ranks_of(env, o))
    elif o.verb in (sg.GROUPS, sg.SETS):  # the two ranks of different groups the solver chose
        w["ranks"] = tuple(value_of(model, r) for r in _ranks_of(env, o))
    return w


def _whole_blocks(env, o, a):
    """A free size is taken a multiple of a constant B or S (whole blocks, equal strided groups, as a real
    mesh cut into nodes has); a pinned size is the size given, the last block shorter where B does not
    divide it. Either way the refutation does not depend on it. The first K ranks need no such size."""
    if a in env.pinned or o.verb == sg.FIRST or not isinstance(o.by, ir.Const) \
            or Fraction(o.by.value).denominator != 1:
        return z3.BoolVal(True, env.sess.ctx)
    return env.size(a) % int(o.by.value) == 0


def _wrap(orig, o, name, kind, info=None):
    """The original negation, or a block smaller than a named axis (a witness of ``kind``)."""
    def encode(env):
        cons, extract = orig(env)
        flag = env.sess.bool(name)
        side, arms = _cond(env, o, info)
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, z3.And(side + [z3.Or([c for _, c in arms])]))]
        out += fixed_size(env, o, info)  # every witness at the size the statement describes (PL250, PL268 elsewhere)

        def ex(model):
            if value_of(model, flag):
                return _witness(env, model, o, kind, next(a for a, c in arms if value_of(model, c)), info)
            return extract(model)

        return out, ex
    return encode


def _block(ctx, o, sizes) -> Fraction:
    if o.verb == sg.GROUPS:  # the first group's size: its first rank past rank 0's group
        return Fraction(sg.sizes_of(o)[0])
    if o.verb == sg.SETS:  # unused: the sets name their ranks
        return Fraction(len(sg.sets_of(o)[0]))
    return Fraction(fold(o.by, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})))


def _run_of(sizes: tuple[int, ...], i: int) -> int:
    """The consecutive group rank ``i`` is in, counted by hand: the last group starting at or before it."""
    return max(j for j, at in enumerate(unequal.starts(sizes)) if at <= i)


def _pair(o, b, n, w) -> tuple[int, int] | None:
    """Two ranks of the axis in different groups: rank 0 and the first rank of the second block, rank 1 (another
    residue of the stride) or rank K (past the first K); for consecutive groups the two the solver chose (rank 0
    and rank S1 without them), None where they are not in two groups of an axis of ``n`` ranks."""
    if o.verb == sg.SETS:
        sets = sg.sets_of(o)
        ia, ib = w.get("ranks") or (sets[0][0], sets[1][0])
        if not (0 <= ia < n and 0 <= ib < n) or ranksets.group_of(sets, ia) == ranksets.group_of(sets, ib):
            return None
        return ia, ib
    if o.verb != sg.GROUPS:
        return 0, 1 if o.verb == sg.STRIDED else int(b)
    sizes = sg.sizes_of(o)
    ia, ib = w.get("ranks") or (0, sizes[0])
    if not (0 <= ia < n and 0 <= ib < n) or _run_of(sizes, ia) == _run_of(sizes, ib):
        return None
    return ia, ib


def _ranks(ctx, axis, pair):
    """The two ranks of ``pair`` along ``axis`` (0 elsewhere), written out."""
    names = ctx.step.axes
    return tuple(coords_text(names, [i if a == axis else 0 for a in names]) for i in pair)


def _replayed(ctx, w, o) -> tuple | None:
    """(sizes, axis, block, n, the two ranks' indices, the two ranks written out) of a witness whose two ranks lie in
    different groups of ``o``; None where the groups do not cut the axis at its sizes."""
    sizes, axis = w["sizes"], w["axis"]
    b, n = _block(ctx, o, sizes), sizes[axis]
    pair = _pair(o, b, n, w) if _cut(o, b, n) else None
    return None if pair is None else (sizes, axis, b, n, pair, *_ranks(ctx, axis, pair))


def _cut(o, b, n) -> bool:
    """Whether groups of ``o``'s verb and ``b`` cut an axis of ``n`` ranks (the replay's side of ``_cond``)."""
    verb = o.verb
    if verb == sg.GROUPS:
        return n == sum(sg.sizes_of(o)) and len(sg.sizes_of(o)) >= 2
    if verb == sg.SETS:
        return n == ranksets.held(sg.sets_of(o)) and len(sg.sets_of(o)) >= 2
    if b.denominator != 1 or b < 1:
        return False
    return b >= 2 and n >= 2 if verb == sg.STRIDED else b < n


def _group_of(o, b, n, axis, ib: int = 0) -> str:
    """The group of the second replayed rank ``ib`` (``_pair``), written out."""
    verb, b = o.verb, int(b)
    if verb == sg.SETS:
        s = sg.sets_of(o)[ranksets.group_of(sg.sets_of(o), ib)]
        return f"the sum over ranks {', '.join(map(str, sorted(s)))} of {axis}, its set [{', '.join(map(str, s))}]"
    if verb == sg.GROUPS:
        s = sg.sizes_of(o)
        j = _run_of(s, ib)
        at = unequal.starts(s)[j]
        return f"the sum over ranks {at}..{at + s[j] - 1} of {axis}, its group of {s[j]}"
    if verb == sg.STRIDED:
        ranks = list(range(1, n, b))
        shown = ", ".join(map(str, ranks[:4])) + (" ..." if len(ranks) > 4 else "")
        return f"the sum over ranks {shown} of {axis}, its strided group"
    if verb == sg.FIRST:
        return f"rank {b} of {axis} alone: outside the first {b} ranks it reduces nothing"
    return f"the sum over ranks {b}..{min(2 * b, n) - 1} of {axis}, its block"


def replay_grad_blocks(ctx, w, group, o):
    """Every rank's contribution 0 but rank A's, 1 (rank 0, or the solver's rank of consecutive groups): the sum
    over the axis is 1 on every rank; the sum over the group of rank B, outside rank A's group, is 0."""
    got = _replayed(ctx, w, o)
    if got is None:
        return None
    sizes, axis, b, n, pair, r0, r1 = got
    eq = (f"the reduced {group} gradient on {r1} is 0 ({_group_of(o, b, n, axis, pair[1])}), on "
          f"{r0} 1; summed over all {n} ranks of {axis}, as single-device training sums every token's contribution, "
          "it is 1")
    diag = (f"the {group} gradient is reduced over {axis} within {sg.groups_text(o)} (override {o.verb} at line "
            f"{o.span.line}: a process group over part of the axis), not over the whole axis of {n} ranks: the "
            f"groups hold partial sums of their own, so the replicas of {group} in different groups receive "
            "different gradients, none of them the global one",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                          (("per-rank contribution", f"1 on {r0}, 0 on every other rank"),
                           _stated_row(o, b)), eq, diag, ctx.command(sizes))


_E_NAME = {sg.STRIDED: "stride", sg.FIRST: "ranks in the group"}


def _stated_row(o, b) -> tuple[str, str]:
    if o.verb == sg.GROUPS:
        return ("group sizes", ", ".join(map(str, sg.sizes_of(o))))
    if o.verb == sg.SETS:
        return ("rank sets", ranksets.text(sg.sets_of(o)))
    return (_E_NAME.get(o.verb, "block size"), _frac(b))


def _wrap_replay(orig, kind, mine):
    def replay(w):
        return mine(w) if w.get("kind") == kind else orig(w)
    return replay


def replay_norm_blocks(ctx, w, o):
    """Squared norm 1 on rank 0's shard, 0 on every other: the replayed rank outside rank 0's group
    holds 0."""
    got = _replayed(ctx, w, o)
    if got is None:
        return None
    sizes, axis, b, n, pair, r0, r1 = got
    eq = (f"grad-norm² on {r1} = 0, on {r0} = 1, but the global value is 1: {r1} ("
          f"{_group_of(o, b, n, axis, pair[1])}) clips by a norm that misses the shard of {r0}")
    diag = (f"the grad norm is reduced over {axis} within {sg.groups_text(o)} (override {o.verb} at line "
            f"{o.span.line}: a process group over part of the axis), not over the whole axis of {n} ranks whose "
            "shards it sums: each group's norm counts its own shards only, and the groups clip by different "
            "coefficients",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                          (("squared norms s", f"1 on the shard of {r0}, 0 on every other shard"),
                           _stated_row(o, b)), eq, diag, ctx.command(sizes))
