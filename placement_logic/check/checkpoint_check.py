"""The checkpoint obligations: after `save; load` (same or new mesh) every state equals its value
before the save, on every rank.

Input: a step model with a ``checkpoint.CheckpointModel`` and the replay context. Output: one
``Obligation`` per condition, each with the z3 encoder of its negation and a concrete replay
that writes and reads a small checkpoint element by element: checkpoint completeness (every
element of every state written by exactly one rank), post-load consistency (replicated params
re-gathered from the loaded master shards of a sharded optimizer), load completeness on a new
mesh (every rank reads back exactly its elements) and the per-rank RNG state.
"""

from __future__ import annotations

from fractions import Fraction
from math import lcm

from ..diagnostics import NO_SPAN, Span
from . import encode as en
from .checkpoint import CheckpointModel, Layout
from .obligation import Obligation
from .replay import Context, _frac
from .report import Counterexample
from .rules import STATE_CONSISTENCY

SAVE, REGATHER, RESHARD, RNG = ("SC checkpoint save", "SC checkpoint load re-gather", "SC checkpoint reshard",
                                "SC checkpoint rng")


def _first(*spans: Span) -> Span:
    return next((s for s in spans if s != NO_SPAN), NO_SPAN)


def obligations(step, ctx: Context) -> list:

    ck: CheckpointModel | None = step.checkpoint
    if ck is None:
        return []
    faults = ck.save_faults()
    save_span = _first(*(lay.span for lay in faults), *(sp for _, sp in ck.skipped), ck.span)
    re_faults = ck.reshard_faults()
    flat_spans = tuple(ck.flat_span(lay.group, lay.axis) for lay, _ in ck.flat_faults())
    obs = [
        Obligation(SAVE, STATE_CONSISTENCY, save_span,
                   "checkpoint completeness: every element of every group's params and optimizer state is written by "
                   "exactly one rank (a sharded state by every rank its shard, a replicated one by one replica)",
                   lambda env: _save_negation(env, ck), lambda w: replay_save(ctx, w), _bytes_notes(ck)),
        Obligation(REGATHER, STATE_CONSISTENCY, _first(ck.regather_span, ck.span),
                   "post-load consistency: after a load, params replicated over an axis where the optimizer is "
                   "sharded are all-gathered from the loaded master shards, so every replica equals the master copy",
                   lambda env: _axes(env, "ckpt_regather", () if ck.regather_after_load else ck.regather_needed),
                   lambda w: replay_regather(ctx, w),
                   () if ck.regather_needed else ("vacuous: no axis with replicated params and a sharded optimizer",)),
        Obligation(RESHARD, STATE_CONSISTENCY, _first(*(ck.by_rank_span(lay.group, lay.axis) for lay in re_faults),
                                                      *flat_spans, ck.reshard_span, ck.span),
                   "load completeness on a new mesh: every shard is remapped by its global offset (block by block "
                   "where a state is laid out in blocks: fused components, virtual stages), so every rank reads "
                   "back exactly its elements of every state, none lost and none read twice",
                   lambda env: _reshard_negation(env, ck), lambda w: replay_reshard(ctx, w),
                   _block_notes(ck) if ck.reshard_axes else ("vacuous: resumed on the same mesh",)),
        Obligation(RNG, STATE_CONSISTENCY, _first(ck.rng_span, ck.span),
                   "every rank restores its own RNG state: ranks whose dropout seeds differ keep differing after a "
                   "load, every stream resumes at its saved offset on the same mesh, and on a new size every rank has a stream", lambda env: _rng_negation(env, ck),
                   lambda w: replay_rng(ctx, w),
                   () if ck.rng_vary or ck.rng_not_restored else ("vacuous: the dropout seed varies over no axis",)),
    ]
    if ck.undecided:  # never proved, never refuted: the negation is left satisfiable
        for ob in obs[0], obs[2]:
            ob.unknown = ck.undecided
            ob.encode = lambda env: ([env.sess.true()], lambda model: {})
    elif ck.keys_undecided:
        obs[2].unknown = ck.keys_undecided
        obs[2].encode = lambda env: ([env.sess.true()], lambda model: {})
    return obs


def _bytes_notes(ck: CheckpointModel) -> tuple[str, ...]:
    """Who writes what: the shard of each state a rank writes (cost: bytes written per rank)."""
    out = []
    for state in ("params", "optimizer"):
        lays = [lay for lay in ck.layouts if lay.state == state and lay.writes_all]
        axes = tuple(dict.fromkeys(lay.axis for lay in lays))
        if axes:
            out.append(f"{state} written by every rank of ({', '.join(axes)}), by rank 0 of the other axes")
        else:
            out.append(f"{state} written by rank 0 of every axis (one whole copy)")
    return tuple(out)


def _block_notes(ck: CheckpointModel) -> tuple[str, ...]:
    """The states laid out in blocks over a resharded axis, and how they are keyed."""
    keyed = {(g, a) for g, a, _ in ck.flat}
    out = {}
    for lay in ck.layouts:
        c = ck.block_count(lay.group, lay.axis)
        if lay.sharded and lay.axis in ck.reshard_axes and c >= 2:
            how = "by the rank's flat offset" if (lay.group, lay.axis) in keyed else "block by block (global ids)"
            kind = "virtual stages" if lay.axis == ck.virtual_axis else "fused components"
            out[(lay.group, lay.axis)] = f"{lay.group}: {c} {kind} over {lay.axis}, keyed {how}"
    return tuple(out.values())


def _axes(env: en.Env, kind: str, axes: tuple[str, ...]):
    return en.axes_negation(env, kind, [(a, env.sess.true()) for a in axes])


def _rng_negation(env: en.Env, ck: CheckpointModel):
    """No generator restored: every stream restarts at offset 0 at every size (one rank suffices);
    one rank's state on every rank: wrong once an axis the seed varies over has 2 ranks."""
    if ck.rng_not_restored:
        cons, extract = en.flag_negation(env, "ckpt_rng", True)
        return cons, lambda model: {**extract(model), "fault": "not_restored"}
    if ck.rng_by_coordinates:  # the new size n + 1 of a resharded axis the seed varies over: rank n reads nothing
        axes = ck.rng_resharded()
        cons, extract = en.flag_negation(env, "ckpt_rng", bool(axes))
        return cons, lambda model: {**extract(model), "fault": "by_coordinates", "axis": axes[0],
                                    "new": extract(model)["sizes"][axes[0]] + 1}
    return _axes(env, "ckpt_rng", ck.rng_vary if ck.rng_shared else ())


def _save_negation(env: en.Env, ck: CheckpointModel):
    """A skipped optimizer state is lost at every size; a layout fault shows once its axis has 2 ranks."""
    if ck.skipped:
        cons, extract = en.flag_negation(env, "ckpt_save", True)
        return cons, lambda model: {**extract(model), "fault": ("skip", ck.skipped[0][0])}
    faults = [lay.axis for lay in ck.save_faults()]
    return _axes(env, "ckpt_save", tuple(dict.fromkeys(faults)))


def _reshard_negation(env: en.Env, ck: CheckpointModel):
    """A shard read by rank index is misplaced for every size n of its axis: the load on n + 1
    ranks (any size other than n) is the witness."""
    faults = [(lay, 1) for lay in ck.reshard_faults()] + list(ck.flat_faults())
    cons, extract = en.flag_negation(env, "ckpt_reshard", bool(faults))

    def witness(model) -> dict:
        w = extract(model)
        lay, blocks = faults[0]
        return {**w, "group": lay.group, "state": lay.state, "axis": lay.axis, "new": w["sizes"][lay.axis] + 1,
                "blocks": blocks, "virtual": lay.axis == ck.virtual_axis}

    return cons, witness


# --------------------------------------------------------------------------- concrete replay


def _write(n: int, sharded: bool, writes_all: bool, skipped: bool = False) -> dict[int, list[int]]:
    """element -> the ranks of an n-rank axis that write it: n elements (one per shard) when the
    state is sharded, each held by its rank; one element held by every rank when replicated."""
    elements = range(n) if sharded else range(1)
    writers: dict[int, list[int]] = {e: [] for e in elements}
    if skipped:
        return writers
    for rank in range(n):
        if not writes_all and rank != 0:
            continue
        for e in ([rank] if sharded else elements):
            writers[e].append(rank)
    return writers


def replay_save(ctx: Context, w: dict) -> Counterexample | None:
    ck: CheckpointModel = ctx.step.checkpoint
    sizes = w["sizes"]
    kind, which = w.get("fault") or ("layout", next(i for i, lay in enumerate(ck.layouts)
                                                    if lay.fault and lay.axis == w["axis"]))
    if kind == "skip":
        lay = Layout(which, "optimizer", ctx.step.axes[0], False, True)
        writers = _write(1, False, True, skipped=True)
        span = dict(ck.skipped)[which]
    else:
        lay = ck.layouts[which]
        writers = _write(sizes[lay.axis], lay.sharded, lay.writes_all)
        span = lay.span
    bad = next(((e, r) for e, r in writers.items() if len(r) != 1), None)
    if bad is None:
        return None
    e, ranks = bad
    where = (f"shard {e} of {lay.axis} (held by {lay.axis}={e})" if lay.sharded else "the replicated tensor")
    who = ", ".join(f"{lay.axis}={r}" for r in ranks) or "no rank"
    eq = f"{lay.group} {lay.state}: {where} written by {len(ranks)} ranks ({who}), expected exactly 1"
    if kind == "skip":
        diag = (f"the {lay.group} optimizer state is not written to the checkpoint"
                + (f" (line {span.line})" if span != NO_SPAN else "") + ": after a load its moments restart from zero",)
    elif lay.fault == "lost":
        diag = (f"the {lay.group} {lay.state} is sharded over {lay.axis} but only {lay.axis}=0 writes it: the shards of "
                f"the other {lay.axis} ranks are lost",)
    else:
        diag = (f"the {lay.group} {lay.state} is replicated over {lay.axis} but every {lay.axis} rank writes it: "
                f"{sizes[lay.axis]} writes of one key, which conflict once the replicas differ",)
    values = ((f"{lay.group} {lay.state} over {lay.axis}", "sharded" if lay.sharded else "replicated"),
              ("writers", "none (not written)" if kind == "skip" else
               f"every {lay.axis} rank" if lay.writes_all else f"{lay.axis}=0 only"))
    return Counterexample(ctx.sizes_tuple(sizes), (("writer(s)", who),), values, eq, diag, ctx.command(sizes))


def replay_regather(ctx: Context, w: dict) -> Counterexample | None:
    """The saved master copy: element i (shard i, owned by rank i) = 1 + i/10. A fresh process
    starts with params 0; each rank loads its master shard and copies it into its params."""
    ck: CheckpointModel = ctx.step.checkpoint
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    saved = [1 + Fraction(i, 10) for i in range(n)]
    params = [[Fraction(0)] * n for _ in range(n)]
    for r in range(n):
        params[r][r] = saved[r]
    if ck.regather_after_load:
        params = [list(saved) for _ in range(n)]
    bad = next(((r, i) for r in range(n) for i in range(n) if params[r][i] != saved[i]), None)
    if bad is None:
        return None
    r, i = bad
    eq = (f"after the load, params element {i} on ({axis}={r}) = {_frac(params[r][i])}, the master copy "
          f"(loaded on {axis}={i}) = {_frac(saved[i])}")
    return Counterexample(ctx.sizes_tuple(sizes), (("stale replica", f"({axis}={r})"), ("owner", f"({axis}={i})")),
                          (("saved master copy", ", ".join(_frac(x) for x in saved)), ("params of a fresh process", "0")),
                          eq, (f"params are replicated over {axis} and the optimizer (the master copy) is sharded "
                               f"there; after a load the params are not all-gathered over {axis} from the loaded "
                               "master shards",), ctx.command(sizes))


def replay_reshard(ctx: Context, w: dict) -> Counterexample | None:
    """L = lcm(n, n') elements saved by n ranks (rank r its contiguous shard, file r); n' ranks
    load: rank r' reads file r' and takes it as its own new shard."""
    sizes, axis, n, m = w["sizes"], w["axis"], w["sizes"][w["axis"]], w["new"]
    if n == m:
        return None
    if w.get("blocks", 1) > 1:
        return replay_flat(ctx, w)
    big = lcm(n, m)
    values = [Fraction(e + 1) for e in range(big)]
    files = {r: values[r * big // n:(r + 1) * big // n] for r in range(n)}
    for r2 in range(m):
        want = values[r2 * big // m:(r2 + 1) * big // m]
        got = files.get(r2, [])
        if got != want:
            lo = r2 * big // m
            eq = (f"{w['group']} {w['state']} on the new ({axis}={r2}) of {m} holds elements {lo}..{lo + len(want) - 1} "
                  f"= {', '.join(_frac(x) for x in want)}; it read file {r2}: "
                  + (", ".join(_frac(x) for x in got) if got else "no such file"))
            wrong = sum(files.get(r, []) != values[r * big // m:(r + 1) * big // m] for r in range(m))
            diag = (f"the {w['group']} {w['state']} is sharded over {axis}; the checkpoint its {n} {axis} rank(s) wrote "
                    f"is loaded on {m} by rank index, not remapped by global offset: {wrong} of the {m} new ranks "
                    "hold the wrong elements",)
            return Counterexample(ctx.sizes_tuple(sizes), (("reading rank", f"({axis}={r2}) of the new mesh"),),
                                  ((f"{axis} on load", str(m)),
                                   ("saved", f"{big} elements, file r holds shard r of {n}")), eq, diag,
                                  ctx.command(sizes))
    return None


DRAWS = 3  # the random draws (dropout masks) of each step: a stream's offset advances by 3 per step
SAVED_AT = 2  # the checkpoint is saved after step 2


def replay_not_restored(ctx: Context, w: dict) -> Counterexample | None:
    """Each rank's stream is (seed, offset); the uninterrupted run draws step 3's masks at offset
    2·3 = 6; the resumed process never restores the saved state, so its stream is (seed, 0)."""
    sizes = w["sizes"]
    rank = ", ".join(f"{a}=0" for a in ctx.step.axes)
    seed = 1000  # rank 0's seed (seed + rank where the seed varies: rank 0 adds 0)
    before = (seed, SAVED_AT * DRAWS)  # the saved state: offset after the saved steps' draws
    after = (seed, 0)  # a fresh process's generator, never set from the file
    if after == before:
        return None
    eq = (f"RNG state on ({rank}) after the load = (seed {after[0]}, offset {after[1]}), before the save = "
          f"(seed {before[0]}, offset {before[1]}); step {SAVED_AT + 1} of the resumed run draws the masks of step 1, "
          f"the uninterrupted run those at offset {before[1]}")
    return Counterexample(ctx.sizes_tuple(sizes), (("rank", f"({rank})"),),
                          (("RNG state saved after step", f"{SAVED_AT}: offset {SAVED_AT} x {DRAWS} draws = "
                            f"{before[1]}"), ("RNG state of the fresh process", f"offset {after[1]}")),
                          eq, ("no generator is restored after the load: every rank's stream restarts at its seed, so "
                               "the resumed run's dropout masks repeat the first steps' and differ from the "
                               "uninterrupted run's",), ctx.command(sizes))


def replay_by_coordinates(ctx: Context, w: dict) -> Counterexample | None:
    """n ranks of the axis save streams keyed by their coordinate (seed 1000 + r, offset 6); on n'
    ranks new rank r' reads the stream saved under coordinate r', if one was."""
    sizes, axis, n, m = w["sizes"], w["axis"], w["sizes"][w["axis"]], w["new"]
    saved = {r: (1000 + r, SAVED_AT * DRAWS) for r in range(n)}
    missing = next((r2 for r2 in range(m) if r2 not in saved), None)
    if missing is None:
        return None
    eq = (f"the new ({axis}={missing}) of {m} reads the RNG stream saved under {axis}={missing}; the {n} saved "
          f"rank(s) wrote streams under {axis}=0..{n - 1}: no such stream")
    diag = (f"the dropout seed varies over {axis}; on a new size of {axis} the RNG states are read by the saved ranks' "
            "coordinates, so a rank the old mesh did not have finds no saved stream (a partial or invalid RNG "
            "payload, or a fresh stream mixed with resumed ones)",)
    return Counterexample(ctx.sizes_tuple(sizes), (("reading rank", f"({axis}={missing}) of the new mesh"),),
                          ((f"{axis} on load", str(m)), ("saved streams", ", ".join(
                              f"{axis}={r}: (seed {s}, offset {o})" for r, (s, o) in saved.items()))),
                          eq, diag, ctx.command(sizes))


def replay_rng(ctx: Context, w: dict) -> Counterexample | None:
    if w.get("fault") == "not_restored":
        return replay_not_restored(ctx, w)
    if w.get("fault") == "by_coordinates":
        return replay_by_coordinates(ctx, w)
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    before = [1000 + r for r in range(n)]
    after = [before[0]] * n
    if n < 2 or after == before:
        return None
    eq = (f"RNG state on ({axis}=1) after the load = {after[1]}, before the save = {before[1]}; ({axis}=0) and "
          f"({axis}=1) now draw the same dropout mask")
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", f"({axis}=0)"), ("rank B", f"({axis}=1)")),
                          (("RNG state before save", ", ".join(f"{axis}={r}: {s}" for r, s in enumerate(before))),),
                          eq, (f"the dropout seed differs over {axis} but one RNG state (rank 0's) is saved and "
                               "restored on every rank",), ctx.command(sizes))


def _piece(big: int, n: int, r: int, p: int) -> int:
    """The global id of local piece p of rank r of n, which holds its run of every block of ``big`` pieces
    in its local order (block by block)."""
    run = big // n
    return (p // run) * big + r * run + p % run


def _flat_first_mismatch(c: int, big: int, n: int, m: int) -> tuple[int, int, int, int] | None:
    """(rank, local piece, wanted id, id read) of the first piece a rank of m reads under another block
    than its own when the shards of n ranks are keyed by flat offset (rank r's local piece p at key
    r·(C·L/n) + p), or None. Each piece is computed in closed form, never the C·L pieces listed: with
    n = m the keys are the saved ones, and with C = 1 every rank's run is its flat range; otherwise rank 0
    reads a wrong piece at p = L/max(n, m) (one key range crosses a block end the other does not), so the
    scan stops within L + 1 pieces of each rank."""
    if n == m or c < 2:
        return None
    saved_len, load_len = c * big // n, c * big // m
    for r2 in range(m):
        for p in range(min(load_len, big + 1)):
            key = r2 * load_len + p
            want, got = _piece(big, m, r2, p), _piece(big, n, key // saved_len, key % saved_len)
            if got != want:
                return r2, p, want, got
    return None


def replay_flat(ctx: Context, w: dict) -> Counterexample | None:
    """C blocks of L = lcm(n, n') pieces each; rank r of n holds its run of every block. A flat
    offset keys local element p of rank r as r·(C·L/n) + p, on save at n and on load at n'."""
    sizes, axis, n, m, c = w["sizes"], w["axis"], w["sizes"][w["axis"]], w["new"], w["blocks"]
    big = lcm(n, m)
    found = _flat_first_mismatch(c, big, n, m)
    if found is None:
        return None
    r2, p, wanted, read = found

    def show(e: int) -> str:  # a piece: L/(C·lcm) elements (layers, columns) of its block
        return f"piece {e % big} of {'layer block' if w.get('virtual') else 'component'} {e // big}"

    eq = (f"{w['group']} {w['state']} on the new ({axis}={r2}) of {m}: its local piece {p} should be "
          f"{show(wanted)}; the flat offset reads {show(read)}")
    what = (f"{c} virtual stages per {axis} rank (each stage holds a run of every one of {c} layer blocks)"
            if w.get("virtual") else f"{c} fused components each split over {axis} (each rank's shard is its "
            "slice of every component)")
    diag = (f"the {w['group']} {w['state']} is {what}; its shards are keyed by the rank's flat offset, not "
            f"block by block: consistent on {n} {axis} ranks, on {m} the blocks' elements are mixed",)
    return Counterexample(ctx.sizes_tuple(sizes), (("reading rank", f"({axis}={r2}) of the new mesh"),),
                          ((f"{axis} on load", str(m)),
                           ("blocks", f"{c} {'layer blocks' if w.get('virtual') else 'components'} of {big} "
                            "equal pieces each")), eq, diag,
                          ctx.command(sizes))
