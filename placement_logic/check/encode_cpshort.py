"""Documents whose real length is not a multiple of 2c under context parallelism (``override layout[ITEM]:
pad_to_chunks | truncate_to_chunks | cut_unequal``): what check.encode_cplayout decides for them.

A document of real length L = 2c·a − e (a ≥ 1, 0 ≤ e < 2c) is cut for c context ranks into 2c chunks. Each rank
has 2a slots per document (the buffer of the document padded to 2c·a positions, the real tokens first):

* ``pad_to_chunks`` (the derivation, Transformer Engine's ``cu_seqlens_padded``): the document padded to 2c·a
  positions, chunks of a, rank r holding chunks r and 2c − 1 − r (``zigzag_per_document`` on the padded
  document); a padded position is masked out of the loss and no query attends to it;
* ``truncate_to_chunks``: the same cut, but each rank takes its first ⌊L/c⌋ slots as the real ones (the valid
  lengths divided by c, ``cu_seqlens // cp_size``): for 0 < e ≤ c one slot of each rank, for e > c two,
  are treated as padding, so real tokens are dropped and padding is counted (NVIDIA/TransformerEngine#1929,
  #1930, #1931, #3331);
* ``cut_unequal``: the unpadded document cut into 2c chunks of h = ⌊L/2c⌋ tokens, the last taking the rest,
  each rank's two chunks back to back: rank 0 holds h + L − (2c − 1)·h tokens, every other rank 2h, and for
  e > 0 slot j of rank r ≥ 1 holds position r·h + j where the padded cut has r·a + j (chunk boundaries
  computed for one length applied to the tokens of another, the class of ISEEKYAN/mbridge#158). (The cut into
  chunks of ⌈L/2c⌉, the last ones short, ``torch.chunk``, puts every real token where the padded cut does: it
  is ``pad_to_chunks``.)

``zigzag_per_document`` beside these is the padded cut (the same positions). Any other layout beside them is
``PL286``. Every item that follows the inputs (labels, loss mask, position ids, causal mask) must, on every rank r
and slot j, leave the token the inputs hold there its own label, loss-mask value, position id and causal mask
position (real where it is real). The z3 negation: c ≥ 2, a ∈ ``UNITS``, 0 ≤ e < 2c, a rank r < c and a slot
j < 2a where the item changes the token's loss term or a real token's attention output (a real key dropped, a
padded key let in, another position read); rank 0's slots past 2a under ``cut_unequal`` are not searched, the
difference of every pair already shows before them. Every two different layouts of these already differ at a = 1 for
every c ≥ 2 (tests/test_check_cpshort.py), so the bound on a only narrows where a difference is looked for: a
proof is for identical cuts, which agree at every a. The replay runs the document of the witness's length and
shows the token whose value differs. No collective moves (a local index select), so the costs are the derived ones.
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError
from ..ir.overrides import LAYOUT_ITEMS, OverrideVerb
from ..solver.session import value_of
from .report import Counterexample

INPUTS = LAYOUT_ITEMS[0]
SHORT = (OverrideVerb.PAD_TO_CHUNKS, OverrideVerb.TRUNCATE_TO_CHUNKS, OverrideVerb.CUT_UNEQUAL)
PADDED = (OverrideVerb.PAD_TO_CHUNKS, OverrideVerb.ZIGZAG_PER_DOCUMENT)
UNITS = (1, 2)
WHAT = {"labels": "the labels (each token's next token)", "loss_mask": "the loss mask",
        "position_ids": "the position ids (rotary embedding)", "causal_mask": "the attention's causal mask"}
HOW = {OverrideVerb.PAD_TO_CHUNKS: "padded to a multiple of 2c and cut into 2c equal chunks",
       OverrideVerb.ZIGZAG_PER_DOCUMENT: "padded to a multiple of 2c and cut into 2c equal chunks",
       OverrideVerb.TRUNCATE_TO_CHUNKS: "cut as padded, each rank taking its first ⌊L/c⌋ slots as the real tokens",
       OverrideVerb.CUT_UNEQUAL: "cut unpadded into 2c chunks of ⌊L/2c⌋, the last taking the rest, each rank's two "
                                 "back to back"}


def applies(lm) -> bool:
    return any(lm.of(item) in SHORT for item in LAYOUT_ITEMS)


def _check_mixed(lm) -> None:
    for item in LAYOUT_ITEMS:
        verb = lm.of(item)
        if verb not in SHORT and verb not in PADDED:
            span = lm.span(item) if lm.span(item) != NO_SPAN else lm.span(INPUTS)
            raise DiagnosticError([Diagnostic(
                Code.LAYOUT_SHORT_MIXED, f"layout[{item}]: {verb} beside a cut of documents whose length is not a "
                "multiple of 2c (pad_to_chunks, truncate_to_chunks, cut_unequal): only zigzag_per_document (the "
                "padded cut) is defined beside them", span)])


def _ite(cond, a, b):
    return (a if cond else b) if isinstance(cond, bool) else z3.If(cond, a, b)


def _and(*xs):
    return all(xs) if all(isinstance(x, bool) for x in xs) else z3.And(*xs)


def _or(*xs):
    return any(xs) if all(isinstance(x, bool) for x in xs) else z3.Or(*xs)


def _not(x):
    return (not x) if isinstance(x, bool) else z3.Not(x)


def _clamp(x, hi: int):
    return _ite(x < 0, 0, _ite(x > hi, hi, x))


def slot(layout: str, a: int, c, e, r, j: int):
    """(holds, position, real) of slot j of rank r of c for a document of 2c·a − e real tokens: whether the slot
    holds a position of the document, which, and whether the item takes it as a real token. The padded cuts
    fill 2a slots per rank; ``cut_unequal`` fills 2h on rank r ≥ 1 and L − (2c − 2)·h on rank 0."""
    length = 2 * c * a - e
    if layout == OverrideVerb.CUT_UNEQUAL:
        h = _ite(e == 0, a, a - 1)  # ⌊L/2c⌋
        last = length - (2 * c - 1) * h  # the last chunk's size: the rest
        second = _ite(r == 0, last, h)
        pos = _ite(j < h, r * h + j, (2 * c - 1 - r) * h + j - h)
        holds = j < h + second
        return holds, pos, holds
    pos = r * a + j if j < a else (2 * c - 1 - r) * a + j - a
    if layout == OverrideVerb.TRUNCATE_TO_CHUNKS:
        return j < 2 * a, pos, _and(j < 2 * a, j < 2 * a - _ite(e == 0, 0, _ite(e <= c, 1, 2)))
    if layout in PADDED:
        return j < 2 * a, pos, _and(j < 2 * a, pos < length)
    raise ValueError(f"unknown layout {layout!r}")


def differs(item: str, base: str, mine: str, a: int, c, e, r, j: int):
    """Whether ``item`` laid out ``mine`` changes the loss term or attention output of the token the inputs
    (``base``) hold in slot j of rank r."""
    length = 2 * c * a - e
    h, p, _ = slot(base, a, c, e, r, j)
    ht, pt, rt = slot(mine, a, c, e, r, j)
    real, masked = _and(h, p < length), _and(h, p < length - 1)
    other = _or(_not(ht), pt != p)
    if item == "labels":
        return _and(masked, other)
    if item == "loss_mask":
        mine_mask = _and(ht, rt, pt < length - 1)
        return mine_mask != masked
    if item == "position_ids":
        return _and(real, other)
    return _or(_and(real, _or(other, _not(rt))), _and(_not(real), ht, rt, pt < length))


def negation(env, lm, item: str):
    ctx = env.sess.ctx
    group = z3.IntVal(1, ctx)
    for ax in lm.context:
        group = group * env.size(ax)
    c = env.sess.int(f"cpshort_{item}_group")
    r = env.sess.int(f"cpshort_{item}_rank")
    e = env.sess.int(f"cpshort_{item}_short")
    sel = env.sess.int(f"cpshort_{item}_units")
    mine, base = lm.of(item), lm.of(INPUTS)
    cases = [z3.And(sel == a, z3.Or(*[differs(item, base, mine, a, c, e, r, j) for j in range(2 * a)]))
             for a in UNITS]
    cons = [c == group, c >= 2, r >= 0, r < c, e >= 0, e < 2 * c,
            z3.Or(*cases) if cases else z3.BoolVal(False, ctx)]

    def extract(model) -> dict:
        return {"kind": "cpshort", "item": item, "sizes": env.size_values(model), "units": value_of(model, sel),
                "short": value_of(model, e)}

    return cons, extract


def obligations(lm, ctx, plan_span, obligation) -> list:
    from .rules import GRADIENT_INTEGRITY

    _check_mixed(lm)
    out = []
    for item in LAYOUT_ITEMS[1:]:
        wrong = lm.of(item) != lm.of(INPUTS)
        span = lm.span(item) if wrong and lm.span(item) != NO_SPAN else lm.span(INPUTS)
        what = (f"{WHAT[item]} laid out as the input tokens over the context group ({', '.join(lm.context)}) for "
                f"documents of any real length (the inputs: {lm.of(INPUTS)}): on every rank and slot it gives the "
                "token the inputs hold there its own value, real where the token is real")
        out.append(obligation(f"GI layout[{item}]", GRADIENT_INTEGRITY, span if span != NO_SPAN else plan_span, what,
                              lambda env, item=item: negation(env, lm, item),
                              lambda w, item=item: replay(ctx, lm, item, w)))
    return out


# --------------------------------------------------------------------------- concrete replay


def run(lays: dict[str, str], a: int, c: int, e: int):
    """Every (rank, slot) of c ranks holding a token: (slot, token, y, loss, real), with q_p = p + 2, k·v = 2^p,
    label p + 1/3, y = (position id + 1)·q·Σ k·v over the keys the causal mask lets in (a real key at or before
    the query's mask position; a query the mask takes as padding gives 0), loss = loss-mask value·(y − label)."""
    length = 2 * c * a - e
    at = {item: {(r, j): slot(lay, a, c, e, r, j) for r in range(c) for j in range(2 * a + 2 * c)}
          for item, lay in lays.items()}
    held = [(s, v[1]) for s, v in at[INPUTS].items() if v[0]]
    keys = [(at["causal_mask"][s], t) for s, t in held]
    for s, t in held:
        ch, cp, cr = at["causal_mask"][s]
        seen = sum((Fraction(2) ** k for (kh, kp, kr), k in keys if kh and kr and kp <= cp), Fraction(0))
        ph, pp, _ = at["position_ids"][s]
        y = (pp + 1 if ph else 1) * (t + 2) * seen if ch and cr else Fraction(0)
        mh, mp, mr = at["loss_mask"][s]
        lh, lp, _ = at["labels"][s]
        mask = 1 if mh and mr and mp < length - 1 else 0
        yield s, t, y, mask * (y - (lp + Fraction(1, 3) if lh else 0)), t < length


def _first_difference(lm, item: str, c: int, w: dict):
    k = 2 if item in ("position_ids", "causal_mask") else 3
    first = (w.get("units") or 1, w.get("short") or 0)
    tries = [first] + [(a, e) for a in UNITS for e in range(2 * c) if (a, e) != first]
    for a, e in tries:
        if a not in UNITS or not 0 <= e < 2 * c:
            continue
        for got in run({i: lm.of(item if i == item else INPUTS) for i in LAYOUT_ITEMS}, a, c, e):
            ref = single_device(got[1], 2 * c * a - e)[k - 2]
            if got[k] != ref and (k == 3 or got[4]):
                return a, e, got[0], got[1], got[k], ref, k
    return None


def single_device(t: int, length: int) -> tuple[Fraction, Fraction]:
    """(y, loss term) of the token at position t on one device: every real key at or before it."""
    y = (t + 1) * (t + 2) * sum((Fraction(2) ** k for k in range(min(t + 1, length))), Fraction(0))
    return y, (1 if t < length - 1 else 0) * (y - (t + Fraction(1, 3)))


def replay(ctx, lm, item: str, w: dict) -> Counterexample | None:
    sizes = w["sizes"]
    c = 1
    for ax in lm.context:
        c *= sizes[ax]
    found = _first_difference(lm, item, c, w) if 2 <= c <= 256 else None
    if found is None:
        return None
    a, e, (r, j), g, got, want, k = found
    length = 2 * c * a - e
    name = "attention output y" if k == 2 else "loss term mask·(y − label)"
    eq = f"{name} of token {g} (rank {r}, slot {j}) = {got}, single-device = {want}"
    h, p, real = slot(lm.of(item), a, c, e, r, j)
    gives = (f"position {p}" + ("" if real or item in ("labels", "position_ids") else ", taken as padding")
             if h else "nothing (its buffer ends before the slot)")
    line = lm.span(item).line
    stmt = f"override layout[{item}]: {lm.of(item)} at line {line}" if line else f"{item} not stated"
    diag = (f"a document of {length} real tokens (2c·{a} − {e}, c = {c}) padded to {2 * c * a} positions: rank {r} "
            f"holds in slot {j} the token at position {g} (the inputs {lm.of(INPUTS)}: {HOW[lm.of(INPUTS)]}) but "
            f"{WHAT[item]} gives it {gives}; the root cause is {WHAT[item]} {HOW[lm.of(item)]} ({stmt}), not cut "
            "as the inputs are",
            "the loss, and so every gradient of the step, is computed from it" if k == 3 else
            "every layer after the attention, the loss and so every gradient of the step are computed from it")
    values = (("sequence", f"one document of {length} real tokens, padded to {2 * c * a}"), ("q", "p + 2"),
              ("k·v", "2^p"), ("label", "p + 1/3"), ("loss mask", "1, 0 at the last real position and on padding"),
              ("y", "(position id + 1) · q · Σ k·v over the real keys the causal mask lets in"))
    devices = ((f"rank {r}", f"context rank {r} of {c}"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))
