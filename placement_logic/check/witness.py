"""Small counterexamples from a solver's witness, with the concrete replay as the judge.

Input: the plain witness dict a query's model was read into (``encode``: ``sizes``, and
per kind its token-count blocks, agreement flags, squared-norm blocks or the axis at
fault), the sizes the user pinned, and the obligation's replay. Output: a replayed
``Counterexample`` on a mesh as small as the replay confirms, or None.

The for-all query's witness is tried before any bounded search: a refutation then costs
one solver query and a few replays (each linear in the devices of its mesh), not a
sequence of small-integer searches whose cost grows with the number of axes. The witness
is first replayed as found (when its mesh is small enough), else with every free size
above 2 cut to 2; then every free axis is set to 1 in turn, kept at 1 where the replay
still fails, and last the token counts are made equal (one per shard) if that still
fails. Every step is a candidate that the replay accepts or rejects: nothing here is
trusted, a candidate that does not fail concretely is simply not shown.

Size changes keep the witness's meaning where it is in product form: the token counts
(and squared norms) are block sums over the shards that differ from the observer on a
set of dimensions, so cutting a size to 2 puts every other shard's share on the one other
shard (each block sum unchanged), and setting a size to 1 empties the blocks that differ
on it (no other shard is left).
"""

from __future__ import annotations

from typing import Callable

Replay = Callable[[dict], object]


def devices(w: dict) -> int:
    n = 1
    for v in w.get("sizes", {}).values():
        n *= max(1, v)
    return n


def _dims_of(name: str) -> set[str]:
    """The witness's dimension names that an axis's size sets (a tied pair counts with its axis)."""
    return {name, f"tie:{name}"}


def _protected(w: dict) -> set[str]:
    """Axes the witness names as the place of the defect: their size stays."""
    out = set()
    for key in ("axis", "leak", "dim"):
        v = w.get(key)
        if isinstance(v, str):
            out.add(v.split(":", 1)[1] if v.startswith("tie:") else v)
    return out


def _resize(w: dict, name: str, size: int) -> dict:
    """The witness with size ``size`` (1 or 2, below the witness's own) on axis ``name``."""
    out = dict(w)
    out["sizes"] = {**w["sizes"], name: size}
    if size != 1:
        return out
    gone = _dims_of(name)
    if "counts" in w:
        out["counts"] = {b: v for b, v in w["counts"].items() if not (b & gone)}
    if "agree" in w:
        out["agree"] = {d: (True if d in gone else v) for d, v in w["agree"].items()}
    if isinstance(w.get("blocks"), dict):  # a checkpoint's flat-offset witness counts its blocks (an int)
        out["blocks"] = {(g, b): v for (g, b), v in w["blocks"].items() if name not in b}
    return out


def _equal_counts(w: dict) -> dict | None:
    """The witness with one token on every shard (block sums: the number of shards in the block)."""
    if not w.get("counts"):
        return None
    names = set().union(*w["counts"])
    if not all(n in w["sizes"] for n in names):
        return None
    counts = {}
    for b in w["counts"]:
        v = 1
        for n in b:
            v *= w["sizes"][n] - 1
        counts[b] = v
    if counts == w["counts"]:
        return None
    return {**w, "counts": counts}


def _equal_pattern(w: dict) -> int | None:
    """The per-shard count c where the witness's counts are equal on every shard (each block
    sum c times the number of shards in it), else None."""
    counts = w.get("counts")
    if not counts or frozenset() not in counts:
        return None
    c = counts[frozenset()]
    for b, v in counts.items():
        if not all(n in w["sizes"] for n in b):
            return None
        k = c
        for n in b:
            k *= w["sizes"][n] - 1
        if v != k:
            return None
    return c


def _still_equal(orig: dict, variant: dict) -> dict:
    """A resized variant of a witness whose counts are equal on every shard, with its counts equal
    again (a cut moves the other shards' share onto one shard, which would make them unequal: not
    a run of a plan that states equal token counts)."""
    c = _equal_pattern(orig)
    if c is None or "counts" not in variant:
        return variant
    counts = {}
    for b in variant["counts"]:
        k = c
        for n in b:
            k *= variant["sizes"][n] - 1
        counts[b] = k
    return {**variant, "counts": counts}


def shrink(w: dict, replay: Replay, pinned: dict[str, int], max_devices: int):
    """The smallest failing variant of witness ``w`` found by the steps above, with its
    counterexample; None when neither ``w`` nor its cut variant fails on replay."""
    w = {**w, "sizes": {**w.get("sizes", {}), **pinned}}
    free = [n for n in w["sizes"] if n not in pinned and n not in _protected(w)]
    cut = w
    for n in free:
        if cut["sizes"][n] > 2:
            cut = _still_equal(w, _resize(cut, n, 2))
    cex = None
    if devices(w) <= max_devices:
        cex = replay(w)
    if cex is not None and cut is not w:
        cex_cut = replay(cut)
        if cex_cut is not None:
            w, cex = cut, cex_cut
    elif cex is None:
        if cut is w or devices(cut) > max_devices:
            return None
        cex = replay(cut)
        if cex is None:
            return None
        w = cut
    for n in free:
        if w["sizes"][n] > 1:
            smaller = _still_equal(w, _resize(w, n, 1))
            c = replay(smaller)
            if c is not None:
                w, cex = smaller, c
    equal = _equal_counts(w)
    if equal is not None:
        c = replay(equal)
        if c is not None:
            w, cex = equal, c
    return w, cex

