"""The layout of context parallelism's sequence blocks (``override layout[ITEM]: LAYOUT``)
and what must follow it.

On the context group (the context axes, mesh order, c ranks) a sequence is cut into 2c chunks. In the
contiguous layout rank i holds chunks 2i and 2i + 1 (one block of the sequence); in the load-balanced
zigzag layout (Megatron-LM / Transformer Engine, ring-flash-attention's zigzag, torch's round robin) rank
i holds chunks i and 2c − 1 − i, so every rank has as much causal work as the others. A packed sequence
of D documents (attention within a document only, Transformer Engine's THD format) may instead be cut
document by document: in ``zigzag_per_document`` each document is cut into 2c chunks and rank i holds
chunks i and 2c − 1 − i of every document (``thd_get_partitioned_indices``), while the two whole-sequence
layouts cut the packed sequence as one (for D = 1 the three are the two above). The layout of the
input tokens is the plan's (``layout[inputs]``, or ``layout`` with no group; contiguous when not stated).
Every per-token tensor the step reads beside them, the labels, the loss mask and the position ids, and the
positions the attention's causal mask compares, must be laid out as the inputs are: a correct system
permutes them alike (the derived step), a statement ``layout[ITEM]: ...`` says what a real system does.

Packs of documents of unequal lengths, padded or not, and the layouts of PyTorch's per-document head-tail
balancer (rank-major since pytorch/pytorch#189902: ``zigzag_per_document``; document-major before it:
``zigzag_document_major``) and of a per-document cut at the unpadded boundaries
(``zigzag_per_document_unpadded``) are defined in check.encode_cplayout_packs; the order PyTorch's
processing-time round-robin balancer computes from the mask (``ptrr``) in check.cplayout_ptrr: linear in c
and r only on one unpadded document, so a comparison with it is decided concretely on the other packs at
each c of ``SMALL`` and left open (for the replay) at a larger group (``_mask_computed_cases``).

Input: an ``ir.Plan``. Output: ``model(plan)``, the layout of every item and the statements that give
them (None where the plan states no layout), and ``obligations``: one per item that follows the inputs,
``GI layout[ITEM]``: on every context rank r and slot j of every pack the item changes nothing the step
computes from the token the inputs hold there: the labels and position ids of a token that reads them are
its own (π_ITEM(r, j) = π_inputs(r, j)), its loss mask value is its own, and the causal mask lets in exactly
the real keys of its document at or before it. The z3 negation: a group of c ≥ 2 ranks, a pack of
``encode_cplayout_packs.PACKS`` (at most two documents, each padded to 2c or 4c positions and holding 2c or 4c real
tokens), a rank r, a slot j (and for the causal mask a key's rank and slot) where the item changes a loss
term or a real token's attention output. Two items of one layout agree on every pack (proved); every two
different layouts already differ on one of these packs for every c ≥ 2 (tests/test_check_cplayout.py). The
concrete replay runs the simplest pack where the item changes an observed value, chunk sizes u_d.
No collective moves: the permutation is a local index select of each rank's batch before the step, so the
costs are the derived ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import z3

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import LAYOUT_ITEMS, OverrideTarget, OverrideVerb
from ..solver.session import value_of
from . import cplayout_ptrr as ptrr
from . import cpwindow
from . import encode_cplayout_packs as packs
from . import encode_cpshort as cpshort
from .report import Counterexample

INPUTS = LAYOUT_ITEMS[0]
FOLLOWERS = LAYOUT_ITEMS[1:]
WHAT = {"labels": "the labels (each token's next token)", "loss_mask": "the loss mask",
        "position_ids": "the position ids (rotary embedding)", "causal_mask": "the attention's causal mask"}
READS = {"labels": "loss", "loss_mask": "loss", "position_ids": "output", "causal_mask": "output"}


@dataclass(frozen=True)
class LayoutModel:
    context: tuple[str, ...]  # the context axes, mesh order
    layout: tuple[tuple[str, str], ...]  # item -> zigzag | contiguous
    spans: tuple[tuple[str, Span], ...]  # item -> the statement that gives it (NO_SPAN: follows the inputs)

    def of(self, item: str) -> str:
        return dict(self.layout)[item]

    def span(self, item: str) -> Span:
        return dict(self.spans)[item]

    def wrong(self, item: str) -> bool:
        return self.of(item) != self.of(INPUTS)


def model(plan, context: tuple[str, ...]) -> LayoutModel | None:
    """The layouts the plan states (the last statement of an item wins); None when it states none. A
    statement without a context axis changes nothing (PL506)."""
    stated = [o for o in plan.overrides if o.target == OverrideTarget.LAYOUT and o.verb not in cpwindow.MASK_VERBS]
    if not stated:
        return None
    if not context:
        o = stated[0]
        raise DiagnosticError([Diagnostic(
            Code.OVERRIDE_NO_EFFECT, f"override layout{f'[{o.group}]' if o.group else ''}: {o.verb} changes nothing: the "
            "plan has no context-parallel axis, so every rank holds the whole sequence in its own order", o.span)])
    own: dict[str, tuple[str, Span]] = {}
    for o in stated:
        own[o.group or INPUTS] = (o.verb, o.span)
    inputs = own.get(INPUTS, (OverrideVerb.CONTIGUOUS.value, NO_SPAN))
    layout = {INPUTS: str(inputs[0])}
    spans = {INPUTS: inputs[1]}
    for item in FOLLOWERS:
        verb, span = own.get(item, (inputs[0], NO_SPAN))
        layout[item], spans[item] = str(verb), span
    return LayoutModel(context, tuple(layout.items()), tuple(spans.items()))


def obligations(lm: LayoutModel | None, ctx, plan_span: Span, obligation) -> list:
    if lm is None:
        return []
    if cpshort.applies(lm):  # documents whose real length is not a multiple of 2c
        return cpshort.obligations(lm, ctx, plan_span, obligation)
    from .rules import GRADIENT_INTEGRITY

    out = []
    for item in FOLLOWERS:
        span = lm.span(item) if lm.wrong(item) and lm.span(item) != NO_SPAN else lm.span(INPUTS)
        what = (f"{WHAT[item]} laid out as the input tokens over the context group ({', '.join(lm.context)}): on every "
                f"rank and slot it holds the element of the token the inputs hold there (the inputs: {lm.of(INPUTS)})")
        out.append(obligation(f"GI layout[{item}]", GRADIENT_INTEGRITY, span if span != NO_SPAN else plan_span, what,
                              lambda env, item=item: negation(env, lm, item),
                              lambda w, item=item: replay(ctx, lm, item, w)))
    return out


def _differs(item: str, pack, c, at, to):
    """Whether the item laid out as it is (``at``: its position in the slot) changes what the step computes
    for the token the inputs hold there (``to``). Exact for the labels (distinct per position), the loss mask
    (0/1) and the position ids (a real token sees at least itself); for the causal mask a real query whose mask
    position is not its own: where none is, every real token's mask position is its own and so every pad's a
    pad, and every query sees its keys (sound); where one is, the replay shows the query whose keys differ
    (the mask relabels a whole document as another of its real length only by coincidence, then no replay)."""
    if item == "labels":
        return _and(packs.loss_mask(pack, c, to), at != to)
    if item == "loss_mask":
        return packs.loss_mask(pack, c, at) != packs.loss_mask(pack, c, to)
    return _and(packs.is_real(pack, c, to), at != to)


def _and(a, b):
    if isinstance(a, bool) and isinstance(b, bool):
        return a and b
    return z3.And(a, b)


def negation(env, lm: LayoutModel, item: str):
    """Some group of c ≥ 2 context ranks, some pack (``encode_cplayout_packs.PACKS``: up to two documents of unequal
    lengths, padded or not), a rank r and slot j where the item laid out as stated changes the token's loss
    term or attention output: for the labels a masked-in token reading another position's label, for the loss
    mask another mask value, for the position ids and the causal mask another position of a real token."""
    ctx = env.sess.ctx
    group = z3.IntVal(1, ctx)
    for a in lm.context:
        group = group * env.size(a)
    c = env.sess.int(f"layout_{item}_group")  # one name for the product: every position below is linear in it
    r = env.sess.int(f"layout_{item}_rank")
    sel = env.sess.int(f"layout_{item}_pack")
    mine, base = lm.of(item), lm.of(INPUTS)
    cases = []
    if mine != base and OverrideVerb.PTRR in (mine, base):
        cases = _mask_computed_cases(item, mine, base, c, r, sel)
    elif mine != base:
        for k, pack in enumerate(packs.PACKS):
            n = 2 * packs.units(pack)
            slots = [_differs(item, pack, c, packs.position(mine, pack, c, r, j), packs.position(base, pack, c, r, j))
                     for j in range(n)]
            cases.append(z3.And(sel == k, z3.Or(*slots)))
    cons = [c == group, c >= 2, r >= 0, r < c, z3.Or(*cases) if cases else z3.BoolVal(False, ctx)]

    def extract(model) -> dict:
        return {"kind": "layout", "item": item, "sizes": env.size_values(model), "pack": value_of(model, sel)}

    return cons, extract


# the largest context group a witness of the order computed from the mask is replayed at (each pack's positions
# scheduled, each against every key)
MAX_REPLAY_GROUP = 256
# the group sizes at which the order a balancer computes from the mask is decided concretely on every pack
SMALL = tuple(range(2, 7))


def _mask_computed_cases(item: str, mine: str, base: str, c, r, sel) -> list:
    """Where one of the two layouts is computed from the mask (``ptrr``, check.cplayout_ptrr): its order is linear
    in c and r only on a pack of one unpadded document, so those packs are encoded for every c, every other pack
    concretely at each size of ``SMALL``, and a larger group at which rank 0 shows no difference on the single
    documents is left open (sat: the concrete replay at that size decides; never proved)."""
    cases, rank0 = [], []
    for k, pack in enumerate(packs.PACKS):
        n = 2 * packs.units(pack)
        if ptrr.closed(pack):
            cases.append(z3.And(sel == k, z3.Or(*[_differs(item, pack, c, packs.position(mine, pack, c, r, j),
                                                           packs.position(base, pack, c, r, j)) for j in range(n)])))
            rank0 += [_differs(item, pack, c, packs.position(mine, pack, c, 0, j), packs.position(base, pack, c, 0, j))
                      for j in range(n)]
            continue
        for size in SMALL:
            for rr in range(size):
                if any(_differs(item, pack, size, packs.position(mine, pack, size, rr, j),
                                packs.position(base, pack, size, rr, j)) for j in range(n)):
                    cases.append(z3.And(c == size, sel == k, r == rr))
    cases.append(z3.And(c > SMALL[-1], z3.Not(z3.Or(*rank0))))
    return cases


# --------------------------------------------------------------------------- concrete replay


def single_device(pack, c: int):
    """The pack's values on one device: q_p = p + 2, k_p v_p = 2^p (every set of keys has its own sum), label
    p + 1/3 (never an output), the loss mask (``encode_cplayout_packs.loss_mask``), position id p, and each position's
    document and whether it is real. A query attends to the real keys at or before it in its document:
    y_p = (p + 1) · q_p · Σ k·v, loss_p = mask_p · (y_p − label_p)."""
    n = 2 * c * packs.units(pack)
    q = [Fraction(p + 2) for p in range(n)]
    kv = [Fraction(2) ** p for p in range(n)]
    label = [p + Fraction(1, 3) for p in range(n)]
    mask = [Fraction(1) if packs.loss_mask(pack, c, p) else Fraction(0) for p in range(n)]
    doc = [packs.doc_of(pack, c, p) for p in range(n)]
    real = [packs.is_real(pack, c, p) for p in range(n)]
    return q, kv, label, mask, doc, real


def run(lays: dict[str, str], pack, c: int):
    """Every (rank, slot) of c context ranks in order: (slot, token, y, loss, real) as the ranks compute them
    under ``lays`` (lazily); the causal mask compares the positions its own layout gives the queries and the
    keys the ranks hold."""
    q, kv, label, mask, doc, real = single_device(pack, c)
    slots = [(r, j) for r in range(c) for j in range(2 * packs.units(pack))]
    at = {item: [packs.position(lay, pack, c, s[0], s[1]) for s in slots] for item, lay in lays.items()}
    keys = list(zip(at["causal_mask"], at[INPUTS]))
    for i, s in enumerate(slots):
        g, cm = at[INPUTS][i], at["causal_mask"][i]
        seen = sum((kv[t] for m, t in keys if doc[m] == doc[cm] and m <= cm and real[m]), Fraction(0))
        y = (at["position_ids"][i] + 1) * q[g] * seen
        yield s, g, y, mask[at["loss_mask"][i]] * (y - label[at["labels"][i]]), real[g]


def _first_difference(lm: LayoutModel, item: str, c: int):
    """The simplest pack and the first slot where the item's layout changes an observed value (a real token's
    attention output, or any token's loss term): (pack, slot, token, got, single-device value, which)."""
    k = 2 if READS[item] == "output" else 3
    for pack in packs.PACKS:
        n = 2 * packs.units(pack)
        if all(packs.position(lm.of(item), pack, c, r, j) == packs.position(lm.of(INPUTS), pack, c, r, j)
               for r in range(c) for j in range(n)):
            continue  # the same order on this pack: nothing to run
        want = run({i: lm.of(INPUTS) for i in LAYOUT_ITEMS}, pack, c)
        for got, ref in zip(run({i: lm.of(item if i == item else INPUTS) for i in LAYOUT_ITEMS}, pack, c), want):
            if got[k] != ref[k] and (k == 3 or got[4]):
                return pack, got[0], got[1], got[k], ref[k], k
    return None


def replay(ctx, lm: LayoutModel, item: str, w: dict) -> Counterexample | None:
    sizes = w["sizes"]
    c = 1
    for a in lm.context:
        c *= sizes[a]
    computed = OverrideVerb.PTRR in (lm.of(item), lm.of(INPUTS))  # a group the negation left open: replayed if small
    found = _first_difference(lm, item, c) if c >= 2 and (c <= MAX_REPLAY_GROUP or not computed) else None
    if found is None:
        return None
    pack, (r, j), g, got, want, k = found
    name = "attention output y" if k == 2 else "loss term mask·(y − label)"
    eq = f"{name} of token {g} (rank {r}, slot {j}) = {got}, single-device = {want}"
    holds = packs.position(lm.of(item), pack, c, r, j)
    line = lm.span(item).line
    stmt = (f"override layout[{item}]: {lm.of(item)} at line {line}" if line else f"{item} not stated")
    inputs_line = lm.span(INPUTS).line
    diag = (f"rank {r} of the context group ({', '.join(lm.context)}) holds in slot {j} the token at position {g} "
            f"(the inputs {lm.of(INPUTS)}{f', line {inputs_line}' if inputs_line else ', as derived'}) but "
            f"{WHAT[item]} of position {holds}; the root cause is {WHAT[item]} laid out {lm.of(item)} ({stmt}), not "
            f"permuted like the inputs",
            "the loss, and so every gradient of the step, is computed from it" if k == 3 else
            "every layer after the attention, the loss and so every gradient of the step are computed from it")
    values = (("sequence", f"{packs.describe(pack, c)}: the inputs' rank i holds {HOLDS[str(lm.of(INPUTS))]}"),
              ("q", "p + 2"), ("k·v", "2^p"), ("label", "p + 1/3"),
              ("loss mask", "1, 0 at each document's last real position and on padding"),
              ("y", "(position id + 1) · q · Σ k·v over the real keys the causal mask lets in"))
    devices = ((f"rank {r}", ", ".join(f"{a}={x}" for a, x in _coords(lm.context, sizes, r))),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))


HOLDS = {OverrideVerb.ZIGZAG: "chunks i and 2c−1−i of the sequence", OverrideVerb.CONTIGUOUS: "chunks 2i and 2i+1",
         OverrideVerb.ZIGZAG_PER_DOCUMENT: "chunks i and 2c−1−i of every document",
         OverrideVerb.ZIGZAG_DOCUMENT_MAJOR: "shard i of every document's head and tail chunks listed document-major",
         OverrideVerb.ZIGZAG_PER_DOCUMENT_UNPADDED: "chunks i and 2c−1−i of every document cut at its real length "
                                                    "and of the padding after the last",
         OverrideVerb.PTRR: "group i of the positions dealt round robin by processing time (the keys its row of the "
                            "mask lets in)"}


def _coords(axes: tuple[str, ...], sizes: dict, r: int) -> list[tuple[str, int]]:
    out = []
    for a in reversed(axes):
        out.append((a, r % sizes[a]))
        r //= sizes[a]
    return list(reversed(out))
