"""A concrete simulator of context parallelism over documents whose real length L is not a multiple of 2c,
written from docs/semantics.md ("The layout of context parallelism's blocks", documents of any length) and the
systems' own code (Transformer Engine's ``cu_seqlens_padded`` cut, its ``cu_seqlens // cp_size`` valid lengths,
a cut of the unpadded tokens into 2c chunks of ``L // (2c)``, the rest on the last), without the checker's code.

Every item (inputs, labels, loss mask, position ids, causal mask) gives each rank a list of (position, taken as
real): ``pad_to_chunks`` / ``zigzag_per_document`` the document padded to 2c·a (a = ⌈L/2c⌉) and cut into 2c equal
chunks, rank r chunks r and 2c − 1 − r, a position real when < L; ``truncate_to_chunks`` the same positions, the
first L // c of them taken as real; ``cut_unequal`` the L real tokens cut into chunks of L // (2c), the last
chunk the rest, rank r chunks r and 2c − 1 − r back to back. A rank's lists are read side by side (a list that
ends early gives nothing there). One device: q_p = 3 + p, k·v = 2^p, label p + 1/3, the loss mask 1 on every
real position but the last, y_p = (p + 1)·q_p·Σ k·v over the real keys at or before p. On the ranks every
query's y reads its position id and the keys the causal mask lets in (a key taken as real at a mask position at
or before the query's; a query the mask takes as padding gives 0); its loss term the loss mask's value (taken as
real and before L − 1) and the label's position. ``violations``: "output" where a real token's y differs,
"loss" where a token's loss term does, over every real length 1 ≤ L ≤ 6c.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import zip_longest

ITEMS = ("inputs", "labels", "loss_mask", "position_ids", "causal_mask")
SHORT = ("pad_to_chunks", "truncate_to_chunks", "cut_unequal")


def layouts(plan) -> dict[str, str]:
    own: dict[str, str] = {}
    for o in plan.overrides:
        if o.target == "layout" and not o.verb.startswith(("window_", "chunk_")):  # the window's and the
            # chunk's masks: tests/simulator_cpwindow.py
            own[o.group or "inputs"] = o.verb
    base = own.get("inputs", "contiguous")
    return {item: own.get(item, base) for item in ITEMS}


def uses(plan) -> bool:
    return any(v in SHORT for v in layouts(plan).values())


def held(layout: str, length: int, c: int, r: int) -> list[tuple[int, bool]]:
    if layout == "cut_unequal":
        tokens = list(range(length))
        h = length // (2 * c)
        chunks = [tokens[i * h:(i + 1) * h] for i in range(2 * c - 1)] + [tokens[(2 * c - 1) * h:]]
        return [(p, True) for p in chunks[r] + chunks[2 * c - 1 - r]]
    a = -(-length // (2 * c))
    mine = list(range(r * a, (r + 1) * a)) + list(range((2 * c - 1 - r) * a, (2 * c - r) * a))
    if layout == "truncate_to_chunks":
        valid = length // c  # cu_seqlens // cp_size
        return [(p, k < valid) for k, p in enumerate(mine)]
    if layout in ("pad_to_chunks", "zigzag_per_document"):
        return [(p, p < length) for p in mine]
    raise ValueError(layout)


def run(lays: dict[str, str], length: int, c: int) -> set:
    kv = [2 ** p for p in range(2 * c * (length // (2 * c) + 2))]

    def y1(p: int) -> int:
        return (p + 1) * (3 + p) * sum(kv[k] for k in range(min(p + 1, length)))

    def loss1(p: int):
        return (y1(p) - (p + Fraction(1, 3))) if p < length - 1 else 0

    ranks = [list(zip_longest(*(held(lays[i], length, c, r) for i in ITEMS), fillvalue=None)) for r in range(c)]
    keys = [(row[0][0], row[4]) for rank in ranks for row in rank if row[0] is not None]
    found = set()
    for rank in ranks:
        for tok, lab, msk, pos, cm in rank:
            if tok is None:
                continue
            t = tok[0]
            if cm is None or not cm[1]:
                y = 0
            else:
                seen = sum(kv[k] for k, kc in keys if kc is not None and kc[1] and kc[0] <= cm[0])
                y = ((pos[0] if pos else 0) + 1) * (3 + t) * seen
            m = 1 if msk is not None and msk[1] and msk[0] < length - 1 else 0
            loss = m * (y - ((lab[0] + Fraction(1, 3)) if lab else 0))
            if t < length and y != y1(t):
                found.add("output")
            if loss != loss1(t):
                found.add("loss")
    return found


def violations(plan, sizes: dict[str, int]) -> set:
    lay = layouts(plan)
    c = 1
    for a in plan.mesh.names:
        if plan.role(a).name == "CONTEXT":
            c *= sizes[a]
    if c < 2:
        return set()
    found: set = set()
    for length in range(1, 6 * c + 1):
        found |= run(lay, length, c)
    return found
