"""Every size assignment of a space that honours divisibility, grouped by structure."""

from __future__ import annotations

import itertools

from .. import hardware as hw
from .. import ir
from .space import COLLAPSED, INTER_NODE, KV_COPIES, ONE_CHUNK, Space, Structure, inter_node, kv_copied

# --------------------------------------------------------------------------- enumeration


def _int(v) -> int | None:
    return int(v.value) if isinstance(v, ir.Const) and v.value.denominator == 1 else None


_AXES = ("tp", "pp", "cp", "ep")


def _values(pattern: tuple[bool, ...], allowed: dict) -> tuple[tuple[str, ...], dict] | None:
    """The axes present in the pattern and the sizes each axis takes; None where the pattern is no structure."""
    present = tuple(a for a, on in zip(_AXES, pattern) if on)
    # tensor and expert axes keep their closed forms at size one (ring factors (n - 1)/n
    # vanish, divisions by one), so one structure holds every size of them; a pipeline or
    # context axis of one device sends nothing point to point, so it is a structure apart
    if any(a in COLLAPSED and on != any(v > 1 for v in allowed[a]) for a, on in zip(_AXES, pattern)):
        return None
    values = {a: (list(allowed[a]) if a in COLLAPSED else [v for v in allowed[a] if v > 1]) if a in present
              else ([1] if 1 in allowed[a] else []) for a in allowed}
    if any(not v for v in values.values()):
        return None
    return present, values


def _valid(np, space: Space, shape: tuple, sched: str | None, tp, pp, cp, ep, mb, nv):
    """The masks of the grid points that honour divisibility, unfolded and folded, the data-parallel
    size and the micro-batches of each. ``shape``: heads, kv heads, MLP width, (padded) vocabulary,
    layers, experts (None where not a number) and whether the model has experts."""
    heads, kv, ffn, vocab, layers, experts, moe = shape
    rest = tp * pp * cp * ep
    ok = space.devices % rest == 0
    dp = np.where(ok, space.devices // rest, 1)  # the data-parallel size
    replicas = dp * ep * mb
    ok &= space.global_batch % replicas == 0
    nmb = np.where(ok, space.global_batch // replicas, 1)
    for size, divides in ((heads, lambda n: n % tp == 0), (kv, lambda n: (n % tp == 0) | (tp % n == 0)),
                          (ffn, lambda n: n % tp == 0), (vocab, lambda n: n % tp == 0)):
        if size:
            ok &= divides(size)
    folded_ok = ok.copy()
    if moe:
        # folded rows need ep > 1: the all-to-all's group spans ep × tp, and a collapsed ep of
        # one device would still price it at the ep link
        folded_ok &= (experts % (ep * tp * cp) == 0) & (ep > 1)
        ok &= experts % ep == 0
    common = space.seq % (cp * tp) == 0
    if layers:
        common &= layers % (pp * nv) == 0
    if sched == "interleaved":
        common &= nmb % pp == 0
    return ok & common, folded_ok & common, dp, nmb


def _data_shard(np, per_node: int, dp, tp, cp):
    """hsdp: shard over the largest power of two of the data size that fits a node beside
    tp x cp, replicate over the rest (both more than one device)."""
    ds = np.ones_like(dp)
    k = 2
    while k <= per_node:
        ds = np.where((dp % k == 0) & (k * tp * cp <= per_node), k, ds)
        k *= 2
    return ds


def enumerate_space(space: Space, t: ir.TransformerShape):
    """Structure -> (sizes, valid): every grid point of the structure's space as an integer
    array (one row each, columns ``SIZE_SYMBOLS``) and a mask of those that honour
    divisibility (heads, kv heads, the MLP width and the (padded) vocabulary over tp, layers over pp × chunks,
    experts over ep, or over ep × tp × cp when folded, the sequence over cp × tp, devices and the global batch over the
    sizes; microbatches a multiple of pp for the interleaved schedule). Built with numpy,
    without a Python loop over candidates."""
    import numpy as np

    heads, kv, ffn, layers, experts = (_int(x) for x in (t.heads, t.kv_heads, t.ffn, t.layers, t.experts))
    vocab, multiple = _int(t.vocab), _int(t.vocab_multiple)
    if vocab and multiple:  # what is split over tp: the vocabulary padded to the multiple
        vocab = -(-vocab // multiple) * multiple
    moe = bool(experts and experts > 1)
    shape = (heads, kv, ffn, vocab, layers, experts, moe)
    per_node = hw.device(space.device).per_node
    allowed = {"tp": space.tp, "pp": space.pp, "cp": space.cp, "ep": space.ep if moe else (1,)}
    out: dict[Structure, tuple] = {}
    for pattern in itertools.product((False, True), repeat=4):
        got = _values(pattern, allowed)
        if got is None:
            continue
        present, values = got
        for sched in (space.schedules if "pp" in present else (None,)):
            chunks = space.chunks if sched == "interleaved" else (1,)
            grid = np.meshgrid(*(np.array(values[a], dtype=np.int64) for a in _AXES),
                               np.array(space.microbatch, dtype=np.int64), np.array(chunks, dtype=np.int64),
                               indexing="ij")
            tp, pp, cp, ep, mb, nv = (g.ravel() for g in grid)
            ok, folded_ok, dp, nmb = _valid(np, space, shape, sched, tp, pp, cp, ep, mb, nv)
            one = np.ones_like(dp)
            sizes = np.stack([dp, tp, pp, cp, ep, one, mb, nmb, nv], axis=1)
            ds = _data_shard(np, per_node, dp, tp, cp)
            hsizes = np.stack([dp // ds, tp, pp, cp, ep, ds, mb, nmb, nv], axis=1)
            # the rows of each part taken once, shared by every strategy's structure of that part
            plain = [(f, rows, sizes[rows]) for f, rows in _facts(per_node, t, present, sched, tp, cp, one, nv)]
            sharded = [(f, rows, hsizes[rows]) for f, rows in _facts(per_node, t, present + ("ds",), sched, tp, cp,
                                                                       ds, nv)]
            hvalid = ok & (ds > 1) & (dp // ds > 1)
            _structures(out, space, present, sched, moe, (ok, folded_ok, hvalid), dp, plain, sharded)
    return out


def _structures(out: dict, space: Space, present: tuple[str, ...], sched: str | None, moe: bool, masks: tuple, dp,
                plain: list, sharded: list) -> None:
    """Every strategy's, recompute's and optimizer's structures of one part of the grid, into ``out``."""
    ok, folded_ok, hvalid = masks
    # one data replica: every data strategy is plain replication (a size-1 axis gathers
    # and reduces nothing, which ddp's closed forms give at size 1; ZeRO's do not), so
    # it is evaluated once, as ddp
    strategies = space.strategies + (() if "ddp" in space.strategies else ("ddp",))
    for strat, rec, opt in itertools.product(strategies, space.recompute, space.optimizers):
        if strat == "hsdp":
            for facts, rows, part in sharded:
                out[Structure(strat, rec, sched, present, optimizer=opt, facts=facts)] = (part, hvalid[rows])
            continue
        for fold in (space.folding if moe and "ep" in present else (False,)):
            if fold and (strat in ("offload", "hsdp") or opt != "adamw"):  # folded Muon: not searched
                continue
            mask = folded_ok if fold else ok
            if strat != "ddp":
                valid = mask & (dp > 1)
            else:
                valid = mask if "ddp" in space.strategies else mask & (dp == 1)
            for facts, rows, part in plain:
                out[Structure(strat, rec, sched, present, fold, opt, facts)] = (part, valid[rows])


def _facts(per_node: int, t: ir.TransformerShape, present: tuple[str, ...], sched: str | None, tp, cp, ds, nv):
    """The rows split by the facts a derivation decides from their values (``space.inter_node``,
    ``space.kv_copied``, one chunk per stage): [(facts, row indices)], every row in exactly one part."""
    import numpy as np

    crossing = inter_node(per_node, tp, cp, ds)
    one_chunk = (nv == 1) if sched == "interleaved" else np.zeros_like(tp, dtype=bool)
    flags = [(ONE_CHUNK, one_chunk)] + [(INTER_NODE[a], crossing[a]) for a in ("tp", "cp", "ds") if a in present]
    copied = kv_copied(_int(t.kv_heads), t.mla, tp) if "tp" in present else np.zeros_like(tp, dtype=bool)
    # one integer per row: a bit per flag, and above them the tensor size where K/V heads are copied
    code = np.where(copied, tp, 0) << len(flags)
    for k, (_, on) in enumerate(flags):
        code |= on.astype(np.int64) << k
    out = []
    for c in np.flatnonzero(np.bincount(code)).tolist():
        facts = tuple(name for k, (name, _) in enumerate(flags) if c >> k & 1)
        if c >> len(flags):
            facts += (f"{KV_COPIES}{c >> len(flags)}",)
        out.append((facts, np.flatnonzero(code == c)))
    return out
