"""A concrete simulator of context parallelism's block layouts over packs of documents, written from
docs/semantics.md ("The layout of context parallelism's blocks") and the systems' own index generators
(PyTorch's ``_HeadTailLoadBalancer`` / ``_PerDocumentHeadTailLoadBalancer`` before and after
pytorch/pytorch#189902, Transformer Engine's ``thd_get_partitioned_indices``), without the checker's code.

A pack is a list of documents, each (padded length, real length) in positions: the real tokens first, then
the padding up to a multiple of 2c (padding between documents). Every layout is an order of the pack's
positions, rank 0's share first, cut into c equal contiguous shards (``torch.chunk`` of the rearranged
sequence): contiguous (the identity), zigzag (the pack cut into 2c chunks, rank r's share chunks r and
2c − 1 − r), zigzag_per_document (every document cut into 2c chunks of its own, rank r's share chunks r and
2c − 1 − r of each document in turn: rank-major), zigzag_document_major (the same pairs listed document by
document, every rank's pair of document 0 first), zigzag_per_document_unpadded (the rank-major cut of the
segments ``cu_seqlens`` gives, the real lengths back to back, then the padding as one dummy sequence, the
indices read as positions of the padded pack), ptrr (PyTorch's processing-time round robin read off the pack's
mask written out: ``_ptrr``). The input tokens take the layout ``layout[inputs]`` (or
``layout``) states, contiguous by default; the labels, the loss mask, the position ids and the positions the
causal mask compares take their own statement's layout, else the inputs'.

One sample per non-context coordinate s: q = 3 + p + s, k·v = 2^p, label p + 1/3 + s, the loss mask 1 on a
real token followed by a real token of its document (0 on a document's last real token and on padding),
position id p. Single device: y_p = (p + 1) q_p Σ k·v over the real positions p' ≤ p of p's document,
loss_p = mask_p (y_p − label_p). On the mesh every device computes its tokens' y and loss from what it holds;
the ring brings it every key with the position the causal mask assigns it, and it lets in a key whose
position is real, in the query's document and not after it. ``layout_violations``: "output" when some real
token's y differs, "loss" when some token's loss term does. The packs: one or two documents of 2c·u
positions (u ≤ 3, u ≤ 2 where c > 3) holding 2c·a real tokens, 1 ≤ a ≤ u.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import simulator_cpshort

from placement_logic import ir

ITEMS = ("inputs", "labels", "loss_mask", "position_ids", "causal_mask")


def _layouts(plan: ir.Plan) -> dict[str, str]:
    own: dict[str, str] = {}
    for o in plan.overrides:
        if o.target == "layout" and not o.verb.startswith(("window_", "chunk_")):  # the window's and the
            # chunk's masks: tests/simulator_cpwindow.py
            own[o.group or "inputs"] = o.verb
    base = own.get("inputs", "contiguous")
    return {item: own.get(item, base) for item in ITEMS}


def _head_tail(start: int, length: int, c: int, r: int) -> list[int]:
    """Rank r's head and tail chunk of a segment of ``length`` positions from ``start`` cut into 2c."""
    ch = length // (2 * c)
    return list(range(start + r * ch, start + (r + 1) * ch)) + list(
        range(start + (2 * c - 1 - r) * ch, start + (2 * c - r) * ch))


def _order(layout: str, docs: list[tuple[int, int]], c: int) -> list[int]:
    n = sum(length for length, _ in docs)
    starts = [sum(length for length, _ in docs[:d]) for d in range(len(docs))]
    if layout == "contiguous":
        return list(range(n))
    if layout == "zigzag":
        return [p for r in range(c) for p in _head_tail(0, n, c, r)]
    if layout == "zigzag_document_major":
        return [p for d, (length, _) in enumerate(docs) for r in range(c) for p in _head_tail(starts[d], length, c, r)]
    if layout == "ptrr":
        return _ptrr(docs, c)
    if layout == "zigzag_per_document":
        segments = list(zip(starts, [length for length, _ in docs]))
    elif layout == "zigzag_per_document_unpadded":
        real = [a for _, a in docs]
        segments = [(sum(real[:d]), a) for d, a in enumerate(real)]
        if sum(real) < n:
            segments.append((sum(real), n - sum(real)))
    else:
        raise ValueError(layout)
    return [p for r in range(c) for s, length in segments for p in _head_tail(s, length, c, r)]


def _mask(docs: list[tuple[int, int]]) -> list[list[int]]:
    """The pack's attention mask written out: row q, column k is 1 where a query at q attends to the key at k
    (the same document, k not after q, k a real token)."""
    doc, real = [], []
    for d, (length, a) in enumerate(docs):
        doc += [d] * length
        real += [k < a for k in range(length)]
    n = len(doc)
    return [[1 if doc[k] == doc[q] and k <= q and real[k] else 0 for k in range(n)] for q in range(n)]


def _ptrr(docs: list[tuple[int, int]], c: int) -> list[int]:
    """PyTorch's ``_PTRRLoadBalancer`` with one position per block, as its ``ptrr_scheduling`` does it: the rows'
    key counts sorted descending (stable), cut into rows of c, every odd row reversed, the columns read as the
    groups, each group in sequence order, group r rank r's share."""
    work = [sum(row) for row in _mask(docs)]
    desc = sorted(range(len(work)), key=lambda p: work[p], reverse=True)  # reverse=True keeps ties in order
    rows = [desc[i:i + c] for i in range(0, len(desc), c)]
    rows = [row if i % 2 == 0 else row[::-1] for i, row in enumerate(rows)]
    return [p for g in range(c) for p in sorted(row[g] for row in rows)]


def _holds(layout: str, docs, c: int, r: int) -> list[int]:
    order = _order(layout, docs, c)
    share = len(order) // c
    return order[r * share:(r + 1) * share]


def packs(c: int):
    top = 3 if c <= 3 else 2
    one = [(2 * c * u, 2 * c * a) for u in range(1, top + 1) for a in range(1, u + 1)]
    return [[d] for d in one] + [[d, e] for d in one for e in one]


def layout_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    names = plan.mesh.names
    ctx = [a for a in names if plan.role(a) is ir.Role.CONTEXT]
    if not ctx:
        return set()
    if simulator_cpshort.uses(plan):  # documents whose real length is not a multiple of 2c
        return simulator_cpshort.violations(plan, sizes)
    lay = _layouts(plan)
    c = 1
    for a in ctx:
        c *= sizes[a]
    nsamples = 1
    for a in names:
        if a not in ctx:
            nsamples *= sizes[a]
    found: set = set()
    for docs, s in product(packs(c), range(min(nsamples, 2))):
        found |= _run(lay, docs, c, s)
        if found == {"output", "loss"}:
            break
    return found


def _run(lay: dict[str, str], docs, c: int, s: int) -> set:
    n = sum(length for length, _ in docs)
    doc, real, mask = [], [], []
    for d, (length, a) in enumerate(docs):
        doc += [d] * length
        real += [k < a for k in range(length)]
        mask += [1 if k < a - 1 else 0 for k in range(length)]
    q = [3 + p + s for p in range(n)]
    kv = [2 ** p for p in range(n)]
    label = [Fraction(3 * p + 1 + 3 * s, 3) for p in range(n)]

    def sees(qp: int, kp: int) -> bool:
        return doc[kp] == doc[qp] and kp <= qp and real[kp]

    y1 = [(p + 1) * q[p] * sum(kv[k] for k in range(n) if sees(p, k)) for p in range(n)]
    loss1 = [mask[p] * (y1[p] - label[p]) for p in range(n)]
    held = {item: [_holds(lay[item], docs, c, r) for r in range(c)] for item in ITEMS}
    keys = [(kv[tok], cm) for r in range(c) for tok, cm in zip(held["inputs"][r], held["causal_mask"][r])]
    found = set()
    for r in range(c):
        for tok, lab, msk, pos, cm in zip(*(held[i][r] for i in ITEMS)):
            y = (pos + 1) * q[tok] * sum(x for x, at in keys if sees(cm, at))
            if real[tok] and y != y1[tok]:
                found.add("output")
            if mask[msk] * (y - label[lab]) != loss1[tok]:
                found.add("loss")
    return found
