"""The layouts of context parallelism's blocks as functions of a pack of documents (check.encode_cplayout).

A pack is D documents; document d is padded to 2c·u_d positions (a multiple of 2c: Transformer Engine's
``cu_seqlens_padded``, the padding between documents) and holds 2c·a_d real tokens (1 ≤ a_d ≤ u_d, the
real ones first: ``cu_seqlens``); u_d and a_d are the pack's *units* (chunk sizes). A pad position has loss
mask 0 and no query attends to it. N = 2c·Σu_d positions, N/c = 2·Σu_d slots per rank. A layout gives the
position rank r of c holds in slot j:

* ``contiguous``: r·N/c + j (the pack cut in 2c chunks of N/2c, rank r chunks 2r and 2r + 1);
* ``zigzag``: chunks r and 2c − 1 − r of the pack cut as one sequence (chunk N/2c);
* ``zigzag_per_document``: each document cut into 2c chunks of u_d, rank r holding chunks r and 2c − 1 − r
  of every document, rank-major (Transformer Engine's ``thd_get_partitioned_indices`` on the padded
  boundaries; PyTorch's ``_PerDocumentHeadTailLoadBalancer`` since pytorch/pytorch#189902);
* ``zigzag_document_major``: the same chunks listed document by document (every rank's head and tail chunk
  of document 0, then of document 1, ...) and that list cut into c contiguous shards (PyTorch's balancer
  before pytorch/pytorch#189902): rank r holds list entries r·N/c ... (r + 1)·N/c − 1;
* ``zigzag_per_document_unpadded``: the per-document cut at the real boundaries (``cu_seqlens``), the
  padding taken as one dummy sequence after the last document: segments of 2c·a_d and 2c·Σ(u_d − a_d),
  each cut into 2c chunks, rank-major, the indices read as positions of the padded pack (equal to
  ``zigzag_per_document`` exactly when no document is padded);
* ``ptrr``: the order PyTorch's processing-time round-robin balancer computes from the pack's mask
  (check.cplayout_ptrr): for z3 terms only on a pack of one unpadded document.

Every function takes ints or z3 terms for r and c and an int slot j, so the concrete replay and the z3
negation read the same definition (the independent oracle is tests/simulator_cp.py). ``PACKS``: the packs the
obligation quantifies over, simplest first: D ≤ 2, u_d ≤ 2 (unequal lengths), a_d ≤ u_d (padding).
"""

from __future__ import annotations

from itertools import product

import z3

from ..ir.overrides import OverrideVerb
from . import cplayout_ptrr

Pack = tuple[tuple[int, int], ...]  # per document: (padded units u, real units a)


def _packs() -> tuple[Pack, ...]:
    docs = [(1, 1), (2, 2), (2, 1)]
    out = [((1, 1),), ((1, 1), (1, 1))]
    out += [p for p in [((1, 1), (2, 2)), ((2, 2), (1, 1)), ((2, 2),), ((2, 2), (2, 2))] if p not in out]
    out += [((2, 1),)] + [p for p in product(docs, repeat=2) if p not in out]
    return tuple(out)


PACKS: tuple[Pack, ...] = _packs()


def _ite(cond, a, b):
    return (a if cond else b) if isinstance(cond, bool) else z3.If(cond, a, b)


def _div(x, k: int):
    return x // k if isinstance(x, int) else x / k


def _mod(x, k: int):
    return x % k if isinstance(x, int) else x % k


def units(pack: Pack) -> int:
    return sum(u for u, _ in pack)


def _rank_major(segments: list[int], c, r, j: int):
    """Segments of 2c·v positions each cut into 2c chunks of v, rank r holding chunks r and 2c − 1 − r of
    every segment in order."""
    first, base = 0, 0
    for v in segments:
        if j < first + 2 * v:
            k = j - first
            return base + (r * v + k if k < v else (2 * c - 1 - r) * v + k - v)
        first, base = first + 2 * v, base + 2 * c * v
    raise ValueError(f"slot {j} past the rank's {first} slots")


def _document_major(pack: Pack, c, r, j: int):
    i = r * 2 * units(pack) + j  # the entry of the document-major list rank r's shard holds in slot j
    base, parts = 0, []
    for u, _ in pack:
        rel = i - base
        owner, rem = _div(rel, 2 * u), _mod(rel, 2 * u)
        parts.append((i < base + 2 * c * u, base + _ite(rem < u, owner * u + rem, (2 * c - 1 - owner) * u + rem - u)))
        base = base + 2 * c * u
    out = parts[-1][1]
    for cond, pos in reversed(parts[:-1]):
        out = _ite(cond, pos, out)
    return out


def position(layout: str, pack: Pack, c, r, j: int):
    """The position of the padded pack rank r of c holds in slot j (0 ≤ j < 2·Σu) under ``layout``."""
    n_slots = 2 * units(pack)
    if layout == OverrideVerb.CONTIGUOUS:
        return r * n_slots + j
    if layout == OverrideVerb.ZIGZAG:
        h = units(pack)
        return r * h + j if j < h else (2 * c - 1 - r) * h + j - h
    if layout == OverrideVerb.ZIGZAG_PER_DOCUMENT:
        return _rank_major([u for u, _ in pack], c, r, j)
    if layout == OverrideVerb.ZIGZAG_PER_DOCUMENT_UNPADDED:
        pad = sum(u - a for u, a in pack)
        return _rank_major([a for _, a in pack] + ([pad] if pad else []), c, r, j)
    if layout == OverrideVerb.ZIGZAG_DOCUMENT_MAJOR:
        return _document_major(pack, c, r, j)
    if layout == OverrideVerb.PTRR:
        return cplayout_ptrr.position(pack, c, r, j)
    raise ValueError(f"unknown layout {layout!r}")


def _facts(pack: Pack, c, p):
    """(document index, real, loss mask) of position p: the mask is 1 on a real token that has a next
    token in its document (0 on its last real token and on padding)."""
    base, doc, real, mask = 0, None, None, None
    facts = []
    for d, (u, a) in enumerate(pack):
        rel = p - base
        facts.append((p < base + 2 * c * u, d, rel < 2 * c * a, rel < 2 * c * a - 1))
        base = base + 2 * c * u
    _, doc, real, mask = facts[-1]
    for cond, d, re, m in reversed(facts[:-1]):
        doc, real, mask = _ite(cond, d, doc), _ite(cond, re, real), _ite(cond, m, mask)
    return doc, real, mask


def doc_of(pack: Pack, c, p):
    return _facts(pack, c, p)[0]


def is_real(pack: Pack, c, p):
    return _facts(pack, c, p)[1]


def loss_mask(pack: Pack, c, p):
    return _facts(pack, c, p)[2]


def visible(pack: Pack, c, q, k):
    """Whether a query at position q attends to the key at position k (document-causal, no padding)."""
    same = doc_of(pack, c, q) == doc_of(pack, c, k)
    real = is_real(pack, c, k)
    if isinstance(q, int) and isinstance(k, int) and isinstance(c, int):
        return same and k <= q and real
    return z3.And(same, k <= q, real)


def describe(pack: Pack, c: int) -> str:
    """The pack in words: its documents' real and padded lengths."""
    parts = []
    for u, a in pack:
        parts.append(f"{2 * c * a}" + (f" (+{2 * c * (u - a)} padding)" if u > a else ""))
    if len(pack) == 1:
        return f"one document of {parts[0]} positions"
    return f"{len(pack)} packed documents of {' and '.join(parts)} positions (attention within a document)"
