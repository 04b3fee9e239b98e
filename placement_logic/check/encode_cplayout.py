"""The layout of context parallelism's sequence blocks (``override layout[ITEM]: zigzag | contiguous``)
and what must follow it.

On the context group (the context axes, mesh order, c ranks) a sequence is cut into 2c chunks. In the
contiguous layout rank i holds chunks 2i and 2i + 1 (one block of the sequence); in the load-balanced
zigzag layout (Megatron-LM / Transformer Engine, ring-flash-attention's zigzag, torch's round robin) rank
i holds chunks i and 2c − 1 − i, so every rank has as much causal work as the others. The layout of the
input tokens is the plan's (``layout[inputs]``, or ``layout`` with no group; contiguous when not stated).
Every per-token tensor the step reads beside them, the labels, the loss mask and the position ids, and the
positions the attention's causal mask compares, must be laid out as the inputs are: a correct system
permutes them alike (the derived step), a statement ``layout[ITEM]: ...`` says what a real system does.

Input: an ``ir.Plan``. Output: ``model(plan)``, the layout of every item and the statements that give
them (None where the plan states no layout), and ``obligations``: one per item that follows the inputs,
``GI layout[ITEM]``: on every context rank r and slot j the item holds the element of the token the
inputs hold there, π_ITEM(r, j) = π_inputs(r, j). The z3 negation: a group of c ≥ 2 ranks, a rank
0 ≤ r < c and a slot j ∈ {0, 1} where they differ (π_zigzag(r, 0) = r, π_zigzag(r, 1) = 2c − 1 − r,
π_contiguous(r, j) = 2r + j). The concrete replay runs one sample of 2c positions (chunk size 1) on the
c ranks. No collective moves: the permutation is a local index select of each rank's batch before the
step, so the costs are the derived ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import z3

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import LAYOUT_ITEMS, OverrideTarget, OverrideVerb
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


def chunk(layout: str, r, j, c):
    """The chunk (of 2c) rank r of c holds in slot j; z3 terms or integers alike."""
    if layout != OverrideVerb.ZIGZAG:
        return 2 * r + j
    if isinstance(j, int):
        return r if j == 0 else 2 * c - 1 - r
    return z3.If(j == 0, r, 2 * c - 1 - r)


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
    cons = [c >= 2, r >= 0, r < c, z3.Or(j == 0, j == 1),
            chunk(lm.of(item), r, j, c) != chunk(lm.of(INPUTS), r, j, c)]

    def extract(model) -> dict:
        return {"kind": "layout", "item": item, "sizes": env.size_values(model)}

    return cons, extract


# --------------------------------------------------------------------------- concrete replay


def single_device(n: int):
    """One sample of n positions: q_p = p + 2, k_p v_p = 2^p (every set of keys has its own sum), label
    p + 1/3 (never an output), loss mask 1 but for the last position (no next token), position id p.
    y_p = (p + 1) · q_p · Σ_{p' ≤ p} k_p' v_p', loss_p = mask_p · (y_p − label_p)."""
    q = [Fraction(p + 2) for p in range(n)]
    kv = [Fraction(2) ** p for p in range(n)]
    label = [p + Fraction(1, 3) for p in range(n)]
    mask = [Fraction(0) if p == n - 1 else Fraction(1) for p in range(n)]
    return q, kv, label, mask


def run(lays: dict[str, str], c: int):
    """Every (rank, slot) of c context ranks: (token, y, loss) as the ranks compute them under ``lays``."""
    q, kv, label, mask = single_device(2 * c)
    slots = [(r, j) for r in range(c) for j in (0, 1)]
    at = {item: {s: chunk(lay, s[0], s[1], c) for s in slots} for item, lay in lays.items()}
    out = {}
    for s in slots:
        g = at[INPUTS][s]
        seen = sum((kv[at[INPUTS][t]] for t in slots if at["causal_mask"][t] <= at["causal_mask"][s]), Fraction(0))
        y = (at["position_ids"][s] + 1) * q[g] * seen
        out[s] = (g, y, mask[at["loss_mask"][s]] * (y - label[at["labels"][s]]))
    return out


def replay(ctx, lm: LayoutModel, item: str, w: dict) -> Counterexample | None:
    sizes = w["sizes"]
    c = 1
    for a in lm.context:
        c *= sizes[a]
    lays = {i: lm.of(INPUTS) for i in LAYOUT_ITEMS}
    lays[item] = lm.of(item)
    got = run(lays, c)
    want = run({i: lm.of(INPUTS) for i in LAYOUT_ITEMS}, c)
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
    values = (("sequence", f"{2 * c} positions, chunks of 1: rank i holds chunks "
               + ("i and 2c−1−i" if lm.of(INPUTS) == OverrideVerb.ZIGZAG else "2i and 2i+1")),
              ("q", "p + 2"), ("k·v", "2^p"), ("label", "p + 1/3"), ("loss mask", "1, 0 at the last position"),
              ("y", "(position id + 1) · q · Σ k·v over the keys the causal mask lets in"))
    devices = ((f"rank {r}", ", ".join(f"{a}={x}" for a, x in _coords(lm.context, sizes, r))),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))


def _coords(axes: tuple[str, ...], sizes: dict, r: int) -> list[tuple[str, int]]:
    out = []
    for a in reversed(axes):
        out.append((a, r % sizes[a]))
        r //= sizes[a]
    return list(reversed(out))
