"""Sliding-window attention under context parallelism (``attention { window = W }`` and
``override layout[causal_mask]: window_dropped | window_local | window_on_diagonal``).

Single-device semantics: the sequence of N positions, each query p attends exactly the keys k with
0 ≤ p − k < W (its last W positions, itself included). On the context group of c ranks the sequence is cut
into 2c chunks of h = N/2c, laid out as the inputs are (check.encode_cplayout: ``contiguous``, rank r holding
chunks 2r and 2r + 1, or ``zigzag``, chunks r and 2c − 1 − r); a rank's *slot* of a position is its index in
the rank's local buffer. Every rank computes, for each query it holds, the set of keys the ring (or the
all-gather) lets in; the derived step lets in the single-device set (the window compared on global positions).
A statement says what a real system does instead:

* ``window_dropped``: causal attention without the window, 0 ≤ p − k (the mask replaced by ``is_causal``:
  huggingface/accelerate#4177; the window not forwarded on the ring or all-to-all path: PrimeIntellect-ai/prime-rl#2828,
  NVIDIA/TransformerEngine#3527);
* ``window_local``: the window compared between the slots, 0 ≤ p − k and slot(p) − slot(k) < W (each KV block
  given the kernel's window without its offset, as if it began where the rank's queries begin:
  open-lm-engine/lm-engine#447);
* ``window_on_diagonal``: the window applied on the rank's own block only, every other rank's keys before p let
  in whole, 0 ≤ p − k and (k on another rank or p − k < W) (the ring's causal block logic: Transformer
  Engine's p2p ring before sliding-window support, NVIDIA/Megatron-LM#1160).

The decision (``difference``) is exact at the declared sizes (c, W and N = the model's ``seq``): for a query
chunk A and a key chunk B every condition above compares t = i − i' (the offsets inside the chunks, |t| < h)
with a threshold, so each condition is constant between consecutive thresholds and evaluating it at the
thresholds (and at −(h − 1)) visits every piece: 4c² chunk pairs, a handful of points each, whatever N.
No z3 here (check.encode_cpwindow states the obligation); the independent oracle is tests/simulator_cpwindow.py,
which compares every (query, key) pair of small sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import OverrideTarget, OverrideVerb
from .values import fold, resolver

VERBS = (OverrideVerb.WINDOW_DROPPED.value, OverrideVerb.WINDOW_LOCAL.value, OverrideVerb.WINDOW_ON_DIAGONAL.value)
LAYOUTS = (OverrideVerb.CONTIGUOUS.value, OverrideVerb.ZIGZAG.value)
# the window's behaviours, over packed documents too (check.cpwindow_packs: the document mask dropped)
WINDOW_VERBS = VERBS + (OverrideVerb.WINDOW_ACROSS_DOCUMENTS.value,)
# every behaviour of the attention's mask (the window's and check.cpchunk's): not a layout of the blocks
MASK_VERBS = WINDOW_VERBS + (OverrideVerb.CHUNK_DROPPED.value, OverrideVerb.CHUNK_LOCAL.value,
                      OverrideVerb.CHUNK_ON_DIAGONAL.value)
MAX_CONTEXT = 256  # the largest context group decided (a larger one: not decided, never a hang)
DOES = {None: "the window compared on the global positions (as derived)",
        "window_dropped": "causal attention without the window",
        "window_local": "the window compared between the positions of the ranks' local buffers",
        "window_on_diagonal": "the window applied on the rank's own block only, the other ranks' keys let in whole",
        "window_across_documents": "the window applied on the packed positions without the document mask, across "
                                   "the documents' boundaries"}


@dataclass(frozen=True)
class WindowModel:
    context: tuple[str, ...]  # the context axes, mesh order
    window: object  # ir.Value: W
    window_span: Span
    verb: str | None  # None: derived
    span: Span  # the statement (NO_SPAN: derived)
    layout: str  # the inputs' layout (check.encode_cplayout)


def model(plan, context: tuple[str, ...]) -> WindowModel | None:
    """The window the model states and what the plan says the ranks do with it; None when the model states no
    window or the plan has no context axis (a statement then changes nothing: PL506). PL282: a window behaviour
    for another tensor than the causal mask."""
    got = statements(plan, context, WINDOW_VERBS, plan.model.attention_window, Code.WINDOW_GROUP, "a sliding-window",
                     "the model states no sliding window (attention { window = W })")
    return None if got is None else WindowModel(context, *plan.model.attention_window, *got)


def statements(plan, context: tuple[str, ...], verbs: tuple[str, ...], stated_value, code: Code, kind: str,
               missing: str) -> tuple[str | None, Span, str] | None:
    """(the statement's verb, its span, the inputs' layout) of a mask behaviour among ``verbs`` (None, NO_SPAN:
    derived); None where the model states no ``stated_value`` or the plan has no context axis. ``code``: a
    behaviour for another tensor than the causal mask; PL506: a statement without the model's value
    (``missing``) or a context axis."""
    stated = [o for o in plan.overrides if o.target == OverrideTarget.LAYOUT and o.verb in verbs]
    for o in stated:
        if o.group != "causal_mask":
            raise DiagnosticError([Diagnostic(
                code, f"override layout{f'[{o.group}]' if o.group else ''}: {o.verb}: {kind} behaviour is the "
                f"attention's: state it for the causal mask, override layout[causal_mask]: {o.verb}", o.span)])
    if stated and (stated_value is None or not context):
        o = stated[0]
        why = missing if stated_value is None else "the plan has no context-parallel axis, so every rank holds the " \
                                                   "whole sequence"
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"override layout[causal_mask]: {o.verb} changes "
                                          f"nothing: {why}", o.span)])
    if stated_value is None or not context:
        return None
    lays = [o for o in plan.overrides if o.target == OverrideTarget.LAYOUT and o.verb not in MASK_VERBS
            and (o.group or "inputs") == "inputs"]
    layout = str(lays[-1].verb) if lays else OverrideVerb.CONTIGUOUS.value
    verb, span = (str(stated[-1].verb), stated[-1].span) if stated else (None, NO_SPAN)
    return verb, span, layout


def ulysses(plan, context: tuple[str, ...], verb: str | None) -> str | None:
    """Why a stated mask behaviour is not decided under Ulysses (``activations[context]: all_to_all`` over a
    context axis): the behaviours are those of the ring's blocks (each rank's slots, its own block and the others'),
    while the all-to-all gives every rank the whole sequence of its heads, in the layout's order. None where the
    plan states no such all-to-all or no behaviour (the derived mask, the global positions', is right either way)."""
    if verb is None:
        return None
    for o in plan.overrides:
        if (o.target == OverrideTarget.ACTIVATIONS and o.group == "context" and o.verb == OverrideVerb.ALL_TO_ALL
                and set(o.axes or ()) & set(context)):
            return (f"{verb} is decided on the ring's blocks, and the Ulysses all-to-all (line {o.span.line}) gives every "
                    "rank the whole sequence of its heads instead")
    return None


def group(sizes: dict, axes: tuple[str, ...], n: int) -> int | None:
    """The context group's size c at ``sizes``, or None where c < 2 or N is not cut into 2c chunks."""
    c = 1
    for a in axes:
        c *= sizes[a]
    return None if c < 2 or n % (2 * c) else c


def declared(plan, wm, bindings: dict, pinned: dict, length=None, what: str = "the window") -> tuple[dict, int, int] | str:
    """(the context axes' sizes, W, N) at the declared sizes (a pinned size first), or why they are not numbers;
    ``length`` another length than the window (check.cpchunk's C, named ``what``)."""
    sizes: dict = {}
    for a in plan.mesh.names:
        v = pinned.get(a)
        sizes[a] = v if v is not None else _int(plan.mesh.axis(a).size, bindings, {})
    if any(sizes[a] is None for a in wm.context):
        return "the context axes' sizes are not numbers"
    known = {a: Fraction(v) for a, v in sizes.items() if v is not None}
    w = _int(wm.window if length is None else length, bindings, known)
    n = _int(plan.model.seq, bindings, known) if plan.model.seq is not None else None
    if w is None or n is None:
        return f"{what} or the sequence length (the model's seq) is not a number"
    c = 1
    for a in wm.context:
        c *= sizes[a]
    if c > MAX_CONTEXT:  # ``difference`` visits 4c² chunk pairs
        return f"the context group of {c} ranks is more than the {MAX_CONTEXT} the window is decided on (4c² chunk pairs)"
    if n % (2 * c):
        return f"the sequence of {n} positions is not cut into 2c = {2 * c} chunks"
    return {a: sizes[a] for a in wm.context}, w, n


def _int(v, bindings: dict, sizes: dict) -> int | None:
    try:
        x = Fraction(fold(v, resolver(bindings, sizes)))
    except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
        return None
    return int(x) if x.denominator == 1 and x >= 1 else None


def place(layout: str, c: int, h: int, chunk: int) -> tuple[int, int]:
    """(rank, first slot) of a chunk of 2c under the layout."""
    if layout == OverrideVerb.ZIGZAG:
        return (chunk, 0) if chunk < c else (2 * c - 1 - chunk, h)
    return chunk // 2, (chunk % 2) * h


def allowed(verb: str | None, d: int, e: int, same: bool, w: int) -> bool:
    """Whether a query lets in a key d = p − k positions before it, e = slot(p) − slot(k) slots before it in the
    ranks' buffers, on its own rank (``same``) or another, under the verb (None: the single-device window)."""
    if d < 0:
        return False
    if verb == OverrideVerb.WINDOW_DROPPED:
        return True
    if verb == OverrideVerb.WINDOW_LOCAL:
        return e < w
    if verb == OverrideVerb.WINDOW_ON_DIAGONAL:
        return not same or d < w
    return d < w


def difference(verb: str | None, layout: str, c: int, n: int, w: int) -> dict | None:
    """The first (query, key) pair, in query order, whose key the ranks let in otherwise than one device does; None
    when every pair agrees (exact, see the module's docstring)."""
    h = n // (2 * c)
    found = []
    for a in range(2 * c):
        ra, oa = place(layout, c, h, a)
        for b in range(2 * c):
            rb, ob = place(layout, c, h, b)
            da, ea = (a - b) * h, oa - ob
            points = {-(h - 1), -da, w - da, w - ea}
            for t in sorted(x for x in points if -(h - 1) <= x <= h - 1):
                got = allowed(verb, da + t, ea + t, ra == rb, w)
                if got != allowed(None, da + t, ea + t, ra == rb, w):
                    i = max(t, 0)
                    found.append((a * h + i, b * h + i - t, got))
                    break
    if not found:
        return None
    p, k, got = min(found)
    rp, op = place(layout, c, h, p // h)
    rk, ok = place(layout, c, h, k // h)
    return pair(p, k, (rp, op + p % h), (rk, ok + k % h), got)


def pair(p: int, k: int, q_at: tuple[int, int], k_at: tuple[int, int], computed: bool, **more) -> dict:
    """The record of a pair the ranks let in otherwise than one device (check.cpwindow, check.cpchunk,
    check.cpwindow_packs): query p and key k, each one's (rank, slot), whether the ranks let the key in."""
    return {"query": p, "key": k, "q_rank": q_at[0], "q_slot": q_at[1], "k_rank": k_at[0], "k_slot": k_at[1],
            "computed": computed, **more}
