"""The grad norm's reduction in the process groups of rank sets over several axes:
``override clip_norm: reduce_sets over (A, B) ranks ([..], ..)``, added to ``SC clip_norm``.

Input: the statement, the step model (each group's shard axes, norm reduction and duplicate filter) and the axes'
sizes on the mesh (``check.subgroups.set_sizes``). Output: PL269 where the norm's reduction of some group is one
this reading does not describe (``refuse``), the arm of ``SC clip_norm`` (``wrap``: its z3 condition, every witness
at the mesh's sizes) and the concrete replay of a witness (``replay``).

The sets list group ranks of the product of the named axes flattened row-major (the first axis most significant,
as torch's DeviceMesh flattens: ``ir.ranksets.coords``). Each set is one ``new_group``: every rank's squared-norm
contribution is summed over the devices of its set (the other axes' coordinates kept), and the rank clips by the
root of that partial sum. A device d's contribution of group g along the named axes is g's piece there (its
coordinates on the named axes g is sharded over) where d counts g: everywhere, except on a named axis of g's norm
reduction where g is replicated and counted once (the duplicate filter, ``rank0_only``): rank 0 there only. The
derived reduction sums over the named axes of g's norm reduction, the others' coordinates kept. The statement
leaves every rank's norm as derived iff, for every group g, device B and piece p, B's set holds as many devices
counting p as B's derived group does; the negation is a group and two group ranks A (the piece) and B (the
observer) where the counts differ. One piece's squared norm 1, every other 0, then shows the difference on B.
"""

from __future__ import annotations

import zlib

import z3

from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import ranksets
from ..solver.session import value_of
from . import kvjoint
from .encode_ranksets import _flat_coord, _set_index
from .report import Counterexample, coords_text
from .subgroups import head, sets_of

SHARD, ZERO, COPY = "shard", "zero", "copy"


def _axes(step, g) -> tuple[str, ...]:
    return g.clip_axes if g.clip_axes is not None else step.clip_axes


def roles(step, g, o) -> tuple[str, ...]:
    """Per named axis, how g's contribution varies along it: its piece (sharded), counted on rank 0 only
    (replicated, filtered or ``rank0_only`` on a summed axis), or the same copy on every rank."""
    out = []
    for a in o.axes:
        if a in g.shard_axes:
            out.append(SHARD)
        elif a in _axes(step, g) and (a in g.clip_filter or a in g.clip_rank0):
            out.append(ZERO)
        else:
            out.append(COPY)
    return tuple(out)


def refuse(step, o) -> None:
    """PL269 where a group's norm reduction over the named axes is one the sets' reading leaves out: an average, a
    max or roots taken before it, copies counted on named ranks, kv heads' copies or a joint head index there."""
    for g in step.groups:
        named = set(o.axes) & set(_axes(step, g))
        why = ("its squared norms are averaged or maxed" if g.clip_agg != "sum" else
               "each rank's root is taken before the reduction" if g.clip_sqrt else
               "its copies are counted on named ranks (count_on_ranks)" if any(x[0] in named for x in g.clip_ranks)
               else "its copied kv heads are each counted" if named & (set(g.clip_copies) | kvjoint.folded(g))
               else None)
        if why is not None and named:
            raise DiagnosticError([Diagnostic(
                Code.RANK_SETS_AXIS, f"{head(o)}: the grad norm's rank sets over several axes are read for a plain "
                f"sum of each rank's squared norm, but for the {g.group} gradient {why}; state its groups over one "
                "axis", o.span)])


def _counts(rl, reduced, sizes, sets, ia: int, ib: int) -> tuple[int, int]:
    """How many devices counting A's piece B's set holds, and B's derived group holds (walked by hand)."""
    n = ranksets.prod(sizes)
    ca, cb = ranksets.coords(ia, sizes), ranksets.coords(ib, sizes)
    mine = next(s for s in sets if ib in s)

    def counts(d: int) -> bool:
        c = ranksets.coords(d, sizes)
        return all(c[k] == ca[k] for k, r in enumerate(rl) if r == SHARD) and \
            all(c[k] == 0 for k, r in enumerate(rl) if r == ZERO)
    got = sum(1 for d in mine if counts(d))
    want = sum(1 for d in range(n) if counts(d) and all(ranksets.coords(d, sizes)[k] == cb[k]
                                                        for k, red in enumerate(reduced) if not red))
    return got, want


def _ranks(env, o):
    tag = f"normsets_{zlib.crc32(head(o).encode()):08x}"
    return env.sess.int(f"{tag}_a"), env.sess.int(f"{tag}_b")


def _arm(env, o, rl, reduced, sets, sizes, ra, rb):
    """B's set and B's derived group count A's piece of a group of roles ``rl`` differently often."""
    n = ranksets.prod(sizes)
    mine = _set_index(sets, rb)
    got, want = [], []
    for d in range(n):
        c = ranksets.coords(d, sizes)
        if any(c[k] != 0 for k, r in enumerate(rl) if r == ZERO):
            continue  # d does not count the group
        piece = z3.And([z3.BoolVal(True, env.sess.ctx)] + [_flat_coord(ra, sizes, k) == c[k]
                                                             for k, r in enumerate(rl) if r == SHARD])
        j = ranksets.group_of(sets, d)
        got.append(z3.If(z3.And(mine == j, piece), 1, 0))
        same = [_flat_coord(rb, sizes, k) == c[k] for k, red in enumerate(reduced) if not red]
        want.append(z3.If(z3.And([piece] + same), 1, 0))
    zero = z3.IntVal(0, env.sess.ctx)
    return z3.Sum(got + [zero]) != z3.Sum(want + [zero])


def _plan_of(step, o):
    return [(g, roles(step, g, o), tuple(a in _axes(step, g) for a in o.axes)) for g in step.groups]


def wrap(orig, o, step, sizes: tuple[int, ...], name: str, kind: str):
    """The original negation, or a group whose piece the sets count differently from the derived reduction."""
    sets = sets_of(o)

    def encode(env):
        cons, extract = orig(env)
        flag = env.sess.bool(name)
        ra, rb = _ranks(env, o)
        n = ranksets.prod(sizes)
        arms = [(g, _arm(env, o, rl, red, sets, sizes, ra, rb)) for g, rl, red in _plan_of(step, o)]
        fixed = [env.size(a) == k for a, k in zip(o.axes, sizes)]
        out = [z3.Implies(z3.Not(flag), z3.And(cons)),
               z3.Implies(flag, z3.And([ra >= 0, ra < n, rb >= 0, rb < n, z3.Or([c for _, c in arms])]))] + fixed

        def ex(model):
            if value_of(model, flag):
                g = next(g for g, c in arms if value_of(model, c))
                return {"kind": kind, "sizes": env.size_values(model), "group": g.group,
                        "ranks": (value_of(model, ra), value_of(model, rb))}
            return extract(model)

        return out, ex
    return encode


def _times(k: int) -> str:
    return {0: "0 times", 1: "once", 2: "twice"}.get(k, f"{k} times")


def _device(names, axes, sizes, r) -> tuple[int, ...]:
    c = dict(zip(axes, ranksets.coords(r, sizes)))
    return tuple(c.get(a, 0) for a in names)


def replay(ctx, w, o, step, sizes: tuple[int, ...]):
    """Group g's squared norm 1 on the piece device A holds, 0 on every other: B's partial norm (its set's sum)
    against its derived group's; a counterexample where they differ, None where the witness is not one."""
    if any(w["sizes"].get(a) != n for a, n in zip(o.axes, sizes)) or "ranks" not in w:
        return None
    ia, ib = w["ranks"]
    g = step.group(w["group"])
    rl, reduced = roles(step, g, o), tuple(a in _axes(step, g) for a in o.axes)
    if not (0 <= ia < ranksets.prod(sizes) and 0 <= ib < ranksets.prod(sizes)):
        return None
    sets = sets_of(o)
    got, want = _counts(rl, reduced, sizes, sets, ia, ib)
    if got == want:
        return None
    names = ctx.step.axes
    ra, rb = (coords_text(names, _device(names, o.axes, sizes, r)) for r in (ia, ib))
    mine = next(s for s in sets if ib in s)
    over = ", ".join(a for a, red in zip(o.axes, reduced) if red)
    kept = [a for a, red in zip(o.axes, reduced) if not red]
    eq = (f"the {g.group} grad-norm² on {rb} is {got} (the sum over its set [{', '.join(map(str, mine))}] of "
          f"({', '.join(o.axes)}) flattened), but the derived reduction over ({over}) gives {want}: {rb} clips by "
          f"a norm that counts the piece {ra} holds {_times(got)}, not {_times(want)}")
    what = "; ".join(f"{a}: {r}" for a, r in zip(o.axes, rl))
    diag = (f"the grad norm is reduced within the process groups of the rank sets {ranksets.text(sets)} over "
            f"({', '.join(o.axes)}) flattened row-major (override {o.verb} at line {o.span.line}), but the "
            f"{g.group} gradient's squared norm is summed over ({over})"
            + (f" with the coordinates on ({', '.join(kept)}) kept" if kept else "")
            + f" (how its squared norm varies per axis: {what}): the set [{', '.join(map(str, mine))}] counts the "
            f"piece of {ra} {_times(got)} where {rb}'s derived group counts it {_times(want)}, so "
            + ("it misses a shard" if got < want else "it adds copies of a piece, or pieces the reduction keeps "
               "apart"),)
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("rank A", ra), ("rank B", rb)),
                          (("squared norms s", f"1 on the {g.group} piece of {ra}, 0 on every other piece"),
                           ("rank sets", ranksets.text(sets))), eq, diag, ctx.command(w["sizes"]))
