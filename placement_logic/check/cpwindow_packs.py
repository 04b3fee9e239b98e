"""Sliding-window attention over packed documents under context parallelism (check.cpwindow): the window under
the per-document layouts (``zigzag_per_document``, ``zigzag_document_major``, ``zigzag_per_document_unpadded``,
check.encode_cplayout_packs), under ``ptrr`` and across document boundaries (``window_across_documents``).

A pack of N = 2c·H positions is a list of documents, document d padded to 2c·u_d positions and holding 2c·a_d real
tokens first (1 ≤ a_d ≤ u_d, Σu_d = H). One device lets query p attend key k when both lie in one document, k is
real and 0 ≤ p − k < W. The ranks keep the document mask under ``window_dropped``, ``window_local`` and
``window_on_diagonal`` (only the window changes, check.cpwindow) and drop it under ``window_across_documents``:
0 ≤ p − k < W on the packed positions, whatever document k lies in, padding included (the window applied where the
document mask should have been: the document mask dropped when the window is applied). Under ``ptrr`` the balancer
reads the windowed mask: a real token at offset i of its document takes min(i + 1, W) keys.

``decide`` quantifies over every pack at the declared sizes (c, W, N):

* ``window_across_documents``: a pair differs exactly when two documents fit (H ≥ 2) and the window reaches the
  previous position (W ≥ 2): the first position of the second document and the last of the first (any layout);
* ``window_dropped``: the layout plays no part; a pair differs exactly when a document is longer than W, the
  one document of N positions where N > W: query W, key 0;
* ``window_local`` / ``window_on_diagonal`` under ``zigzag_per_document``: a pair of one document (u units) lies in
  the slots and ranks of the zigzag cut of 2c·u positions, whatever the other documents are (each rank holds its
  2u slots of every earlier document before them) and whatever the padding (the cut is by u, the real pairs are
  some of the unpadded document's): some pack differs exactly when the zigzag cut of 2c·u positions differs for
  some u ≤ H (check.cpwindow.difference, exact), the witness that document first;
* the same verbs under the other packed layouts: a witness is looked for on the packs where the cut is known in
  closed form (under ``zigzag_per_document_unpadded`` the unpadded packs, where it is the rank-major cut; under
  ``zigzag_document_major`` and ``ptrr`` the one document of N positions, under ``ptrr`` on the windowed
  balancer's order, each rank's positions sorted, compared query by query on intervals of each rank's keys);
  without one the other packs are left undecided.

No z3 here (check.encode_cpwindow states the obligation); the independent oracle is tests/simulator_cpwindow.py's
packed ring, which compares every pair of every pack of small sizes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from ..ir.overrides import OverrideVerb
from . import cplayout_ptrr as ptrr
from . import cpwindow
from . import encode_cplayout_packs as packs

ACROSS = OverrideVerb.WINDOW_ACROSS_DOCUMENTS.value
PACKED = (OverrideVerb.ZIGZAG_PER_DOCUMENT.value, OverrideVerb.ZIGZAG_DOCUMENT_MAJOR.value,
          OverrideVerb.ZIGZAG_PER_DOCUMENT_UNPADDED.value, OverrideVerb.PTRR.value)


def ptrr_ranks(pack: packs.Pack, c: int, w: int) -> tuple[tuple[int, ...], ...]:
    """The balancer's ranks of an unpadded pack, read from the windowed mask (a token at offset i: min(i + 1, W))."""
    return ptrr.deal(tuple(min(i + 1, w) for u, _ in pack for i in range(2 * c * u)), c)


def where(layout: str, pack: packs.Pack, c: int, w: int) -> dict[int, tuple[int, int]]:
    """Every position's (rank, slot) under the layout."""
    if layout == OverrideVerb.PTRR:
        ranks = ptrr_ranks(pack, c, w)
        return {x: (r, j) for r, xs in enumerate(ranks) for j, x in enumerate(xs)}
    slots = 2 * packs.units(pack)
    return {packs.position(layout, pack, c, r, j): (r, j) for r in range(c) for j in range(slots)}


def _pair(layout: str, pack: packs.Pack, c: int, w: int, p: int, k: int, computed: bool) -> dict:
    at = where(layout, pack, c, w)
    return cpwindow.pair(p, k, at[p], at[k], computed, pack=pack)


def _sorted_lists(verb: str, ranks, w: int) -> tuple[int, int, bool] | None:
    """The first (query, key, computed) of one unpadded document whose ranks hold sorted positions (slot = index)."""
    at = {x: (r, j) for r, xs in enumerate(ranks) for j, x in enumerate(xs)}
    for p in range(len(at)):
        r, sp = at[p]
        found = []
        for r2, ks in enumerate(ranks):
            hi = bisect_right(ks, p)
            want = (bisect_left(ks, p - w + 1), hi)
            got = ((max(0, sp - w + 1), hi) if verb == OverrideVerb.WINDOW_LOCAL else
                   want if verb == OverrideVerb.WINDOW_ON_DIAGONAL and r2 == r else (0, hi))
            for i in sorted({want[0], got[0], want[1], got[1]}):
                if i < len(ks) and (want[0] <= i < want[1]) != (got[0] <= i < got[1]):
                    found.append((ks[i], got[0] <= i < got[1]))
                    break
        if found:
            k, yes = min(found)
            return p, k, yes
    return None


def decide(verb: str | None, layout: str, c: int, n: int, w: int) -> tuple[dict | None, str | None]:
    """(the first differing pair of a pack, with its ``pack``, None), (None, None) where no pack differs, or
    (None, why) where the packs without a witness are not decided."""
    h = n // (2 * c)
    if verb is None:
        return None, None  # the derived mask is the single-device one, pair by pair, on every pack
    if verb == ACROSS:
        if h < 2 or w < 2:
            return None, None
        return _pair(layout, ((1, 1), (h - 1, h - 1)), c, w, 2 * c, 2 * c - 1, True), None
    if verb == OverrideVerb.WINDOW_DROPPED:
        return (_pair(layout, ((h, h),), c, w, w, 0, True), None) if n > w else (None, None)
    if layout == OverrideVerb.PTRR:
        got = _sorted_lists(verb, ptrr_ranks(((h, h),), c, w), w)
        return ((_pair(layout, ((h, h),), c, w, *got), None) if got else
                (None, "no pack of one document differs under the windowed balancer; packs of several or padded "
                       "documents are not decided"))
    if layout == OverrideVerb.ZIGZAG_DOCUMENT_MAJOR:
        d = cpwindow.difference(verb, OverrideVerb.ZIGZAG, c, n, w)  # one document: the zigzag cut
        return ((_pair(layout, ((h, h),), c, w, d["query"], d["key"], d["computed"]), None) if d else
                (None, "no pack of one document differs; packs of several documents cut document-major are not "
                       "decided"))
    for u in range(h, w // (2 * c), -1):  # rank-major: a document of u units first (2cu ≤ W: no pair is W apart)
        d = cpwindow.difference(verb, OverrideVerb.ZIGZAG, c, 2 * c * u, w)
        if d is not None:
            pack = ((u, u),) + (((h - u, h - u),) if h > u else ())
            return _pair(layout, pack, c, w, d["query"], d["key"], d["computed"]), None
    if layout == OverrideVerb.ZIGZAG_PER_DOCUMENT_UNPADDED:
        return None, "no unpadded pack differs; padded packs cut at the unpadded boundaries are not decided"
    return None, None
