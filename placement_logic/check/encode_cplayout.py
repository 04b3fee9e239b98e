"""The layout of context parallelism's sequence blocks (``override layout[ITEM]: zigzag | contiguous``)
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

Input: an ``ir.Plan``. Output: ``model(plan)``, the layout of every item and the statements that give
them (None where the plan states no layout), and ``obligations``: one per item that follows the inputs,
``GI layout[ITEM]``: on every context rank r and slot j the item holds the element of the token the
inputs hold there, π_ITEM(r, j) = π_inputs(r, j). A sequence of D documents of 2c units each, slot j of
2D on each rank: π_contiguous(r, j) = 2Dr + j; π_zigzag(r, j) = Dr + j for j < D, D(2c − 1 − r) + j − D
after; π_zigzag_per_document(r, 2d + e) = 2cd + r for e = 0, 2cd + 2c − 1 − r for e = 1. The z3
negation: a group of c ≥ 2 ranks, D ∈ {1, 2}, a rank 0 ≤ r < c and a slot 0 ≤ j < 2D where they differ.
D ≤ 2 decides every D: two items of one layout agree at every D, and two different layouts already
differ at D = 2 for every c ≥ 2 (zigzag and contiguous at D = 1). The concrete replay runs one sample
of D documents of 2c positions (chunk size 1) on the c ranks. No collective moves: the permutation is a local index select of each rank's batch before the
step, so the costs are the derived ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import z3

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import LAYOUT_ITEMS, OverrideTarget, OverrideVerb
from ..solver.session import value_of
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
    stated = [o for o in plan.overrides if o.target == OverrideTarget.LAYOUT]
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


def chunk(layout: str, r, j, c, docs=1):
    """The unit (of 2c per document, ``docs`` documents) rank r of c holds in slot j (of 2·docs); z3 terms or
    integers alike (a z3 ``docs`` is 1 or 2)."""
    if isinstance(j, int) and isinstance(docs, int):
        if layout == OverrideVerb.ZIGZAG_PER_DOCUMENT:
            d, e = divmod(j, 2)
            return 2 * c * d + (r if e == 0 else 2 * c - 1 - r)
        if layout == OverrideVerb.ZIGZAG:
            return docs * r + j if j < docs else docs * (2 * c - 1 - r) + j - docs
        return 2 * docs * r + j
    times = (lambda x: z3.If(docs == 1, x, 2 * x)) if not isinstance(docs, int) else (lambda x: docs * x)
    if layout == OverrideVerb.ZIGZAG_PER_DOCUMENT:
        d = z3.If(j >= 2, 1, 0)
        return z3.If(d == 1, 2 * c, 0) + z3.If(j - 2 * d == 0, r, 2 * c - 1 - r)
    if layout == OverrideVerb.ZIGZAG:
        return z3.If(j < docs, times(r) + j, times(2 * c - 1 - r) + j - docs)
    return times(2 * r) + j


def obligations(lm: LayoutModel | None, ctx, plan_span: Span, obligation) -> list:
    if lm is None:
        return []
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


def negation(env, lm: LayoutModel, item: str):
    """Some group of c ≥ 2 context ranks, rank r and slot j where the item's chunk is not the inputs'."""
    ctx = env.sess.ctx
    c = z3.IntVal(1, ctx)
    for a in lm.context:
        c = c * env.size(a)
    r, j = env.sess.int(f"layout_{item}_rank"), env.sess.int(f"layout_{item}_slot")
    docs = env.sess.int(f"layout_{item}_documents")
    cons = [c >= 2, r >= 0, r < c, z3.Or(docs == 1, docs == 2), j >= 0, j < 2 * docs,
            chunk(lm.of(item), r, j, c, docs) != chunk(lm.of(INPUTS), r, j, c, docs)]

    def extract(model) -> dict:
        return {"kind": "layout", "item": item, "sizes": env.size_values(model),
                "documents": value_of(model, docs)}

    return cons, extract


# --------------------------------------------------------------------------- concrete replay


def single_device(n: int, span: int | None = None):
    """One sample of n positions in documents of ``span`` positions (one document when None): q_p = p + 2,
    k_p v_p = 2^p (every set of keys has its own sum), label p + 1/3 (never an output), loss mask 1 but
    for each document's last position (no next token), position id p. y_p = (p + 1) · q_p · Σ k_p' v_p'
    over the positions p' ≤ p of p's document, loss_p = mask_p · (y_p − label_p)."""
    span = span or n
    q = [Fraction(p + 2) for p in range(n)]
    kv = [Fraction(2) ** p for p in range(n)]
    label = [p + Fraction(1, 3) for p in range(n)]
    mask = [Fraction(0) if p % span == span - 1 else Fraction(1) for p in range(n)]
    return q, kv, label, mask


def run(lays: dict[str, str], c: int, docs: int = 1):
    """Every (rank, slot) of c context ranks: (token, y, loss) as the ranks compute them under ``lays``, the
    sequence ``docs`` documents of 2c positions each."""
    q, kv, label, mask = single_device(2 * c * docs, 2 * c)
    slots = [(r, j) for r in range(c) for j in range(2 * docs)]
    at = {item: {s: chunk(lay, s[0], s[1], c, docs) for s in slots} for item, lay in lays.items()}
    out = {}
    for s in slots:
        g = at[INPUTS][s]
        cm = at["causal_mask"][s]
        seen = sum((kv[at[INPUTS][t]] for t in slots
                    if at["causal_mask"][t] <= cm and at["causal_mask"][t] // (2 * c) == cm // (2 * c)), Fraction(0))
        y = (at["position_ids"][s] + 1) * q[g] * seen
        out[s] = (g, y, mask[at["loss_mask"][s]] * (y - label[at["labels"][s]]))
    return out


def replay(ctx, lm: LayoutModel, item: str, w: dict) -> Counterexample | None:
    sizes = w["sizes"]
    c = 1
    for a in lm.context:
        c *= sizes[a]
    docs = w.get("documents", 1)
    lays = {i: lm.of(INPUTS) for i in LAYOUT_ITEMS}
    lays[item] = lm.of(item)
    got = run(lays, c, docs)
    want = run({i: lm.of(INPUTS) for i in LAYOUT_ITEMS}, c, docs)
    k = 1 if READS[item] == "output" else 2
    bad = next((s for s in got if got[s][k] != want[s][k]), None)
    if bad is None or c < 2:
        return None
    r, j = bad
    g = got[bad][0]
    name = "attention output y" if k == 1 else "loss term mask·(y − label)"
    eq = (f"{name} of token {g} (rank {r}, slot {j}) = {got[bad][k]}, single-device = {want[bad][k]}")
    holds = chunk(lm.of(item), r, j, c)
    line = lm.span(item).line
    stmt = (f"override layout[{item}]: {lm.of(item)} at line {line}" if line else f"{item} not stated")
    inputs_line = lm.span(INPUTS).line
    diag = (f"rank {r} of the context group ({', '.join(lm.context)}) holds in slot {j} the token at position {g} "
            f"(the inputs {lm.of(INPUTS)}{f', line {inputs_line}' if inputs_line else ', as derived'}) but "
            f"{WHAT[item]} of position {holds}; the root cause is {WHAT[item]} laid out {lm.of(item)} ({stmt}), not "
            f"permuted like the inputs",
            "the loss, and so every gradient of the step, is computed from it" if k == 2 else
            "every layer after the attention, the loss and so every gradient of the step are computed from it")
    values = (("sequence", (f"{2 * c} positions" if docs == 1 else
                            f"{docs} packed documents of {2 * c} positions (attention within a document)")
               + ", chunks of 1: the inputs' rank i holds " + HOLDS[str(lm.of(INPUTS))]),
              ("q", "p + 2"), ("k·v", "2^p"), ("label", "p + 1/3"), ("loss mask", "1, 0 at the last position"),
              ("y", "(position id + 1) · q · Σ k·v over the keys the causal mask lets in"))
    devices = ((f"rank {r}", ", ".join(f"{a}={x}" for a, x in _coords(lm.context, sizes, r))),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))


HOLDS = {OverrideVerb.ZIGZAG: "chunks i and 2c−1−i of the sequence", OverrideVerb.CONTIGUOUS: "chunks 2i and 2i+1",
         OverrideVerb.ZIGZAG_PER_DOCUMENT: "chunks i and 2c−1−i of every document"}


def _coords(axes: tuple[str, ...], sizes: dict, r: int) -> list[tuple[str, int]]:
    out = []
    for a in reversed(axes):
        out.append((a, r % sizes[a]))
        r //= sizes[a]
    return list(reversed(out))
