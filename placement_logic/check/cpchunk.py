"""Chunked (local) attention under context parallelism (``attention { chunk = C }``, Llama 4's
``attention_chunk_size``; ``override layout[causal_mask]: chunk_dropped | chunk_local | chunk_on_diagonal``).

Single-device semantics: the sequence of N positions is cut into chunks of C positions (the last one shorter when
C does not divide N); query p attends exactly the keys k of its own chunk at or before it, ⌊k/C⌋ = ⌊p/C⌋ and
k ≤ p. On the context group of c ranks the sequence is cut into 2c blocks of h = N/2c laid out as the inputs are
(``contiguous`` or ``zigzag``, check.cpwindow.place); a rank's *slot* of a position is its index in the rank's
local buffer. The derived step compares the chunks of the global positions. A statement says what a real
system does instead:

* ``chunk_dropped``: causal attention without the chunks, k ≤ p (the chunked mask replaced by ``is_causal``:
  huggingface/accelerate#4177);
* ``chunk_local``: the chunks cut on the local slots, k ≤ p and ⌊slot(k)/C⌋ = ⌊slot(p)/C⌋ (the chunked mask built
  for the rank's buffer as if it began at position 0: nod-ai/amd-shark-ai#1452, the class of
  huggingface/transformers#40324's missing chunk offset);
* ``chunk_on_diagonal``: the chunk boundary applied on the rank's own block only, every other rank's keys at or
  before p let in whole (the chunked kernel called on the local block only, the ring's received blocks given the
  plain causal logic: NVIDIA/TransformerEngine#1887 chunkifies only without context parallelism).

The decision (``difference``) is exact at the declared sizes (c, C and N = the model's ``seq``): for each query p
and each of the 2c blocks the keys every condition lets in form one interval of positions (the causal bound, the
chunk of p, the slots of p's local chunk each cut the block at one point), so comparing the intervals query by
query visits every (query, key) pair: 2c·N interval comparisons, no pair enumerated. No z3 here
(check.encode_cpchunk states the obligation); the independent oracle is tests/simulator_cpwindow.py's ring, which
compares every pair of small sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnostics import Code, Span
from ..ir.overrides import OverrideVerb
from . import cpwindow

VERBS = (OverrideVerb.CHUNK_DROPPED.value, OverrideVerb.CHUNK_LOCAL.value, OverrideVerb.CHUNK_ON_DIAGONAL.value)
DOES = {None: "the chunks cut on the global positions (as derived)",
        "chunk_dropped": "causal attention without the chunks",
        "chunk_local": "the chunks cut on the positions of the ranks' local buffers",
        "chunk_on_diagonal": "the chunk boundary applied on the rank's own block only, the other ranks' keys let in "
                             "whole"}


@dataclass(frozen=True)
class ChunkModel:
    context: tuple[str, ...]  # the context axes, mesh order
    chunk: object  # ir.Value: C
    chunk_span: Span
    verb: str | None  # None: derived
    span: Span  # the statement (NO_SPAN: derived)
    layout: str  # the inputs' layout (check.encode_cplayout)
    windowed: bool  # whether the model states a sliding window beside the chunks


def model(plan, context: tuple[str, ...]) -> ChunkModel | None:
    """The chunk the model states and what the plan says the ranks do with it; None when the model states no
    chunk or the plan has no context axis (a statement then changes nothing: PL506). PL295: a chunk behaviour for
    another tensor than the causal mask."""
    got = cpwindow.statements(plan, context, VERBS, plan.model.attention_chunk, Code.CHUNK_GROUP,
                              "a chunked-attention", "the model states no attention chunk (attention { chunk = C })")
    if got is None:
        return None
    return ChunkModel(context, *plan.model.attention_chunk, *got, plan.model.attention_window is not None)


def _keys(verb: str | None, p: int, sp: int, lo: int, hi: int, ob: int, same: bool, size: int) -> tuple[int, int]:
    """The interval [a, b] of keys of the block [lo, hi] (its first slot ob) query p (slot sp) lets in."""
    hi = min(hi, p)
    if verb == OverrideVerb.CHUNK_DROPPED or (verb == OverrideVerb.CHUNK_ON_DIAGONAL and not same):
        return lo, hi
    if verb == OverrideVerb.CHUNK_LOCAL:
        first = (sp // size) * size  # the first slot of p's local chunk
        return max(lo, lo + first - ob), min(hi, lo + first + size - 1 - ob)
    return max(lo, (p // size) * size), hi


def _first(one: tuple[int, int], other: tuple[int, int]) -> int | None:
    """The first key in exactly one of two intervals (empty where a > b)."""
    def has(iv, k):
        return iv[0] <= k <= iv[1]
    for k in sorted({one[0], other[0], one[1] + 1, other[1] + 1}):
        if has(one, k) != has(other, k):
            return k
    return None


def difference(verb: str | None, layout: str, c: int, n: int, size: int) -> dict | None:
    """The first (query, key) pair, in query order, whose key the ranks let in otherwise than one device does; None
    when every pair agrees (exact, see the module's docstring)."""
    if verb is None or size >= n:
        return None  # the derived mask is the single-device one; one chunk holding every position and slot is causal
    h = n // (2 * c)
    blocks = [(b * h, b * h + h - 1) + cpwindow.place(layout, c, h, b) for b in range(2 * c)]
    for a in range(2 * c):
        ra, oa = cpwindow.place(layout, c, h, a)
        for i in range(h):
            p, sp = a * h + i, oa + i
            found = []
            for lo, hi, rb, ob in blocks:
                if lo > p:
                    continue
                got = _keys(verb, p, sp, lo, hi, ob, rb == ra, size)
                k = _first(got, _keys(None, p, sp, lo, hi, ob, rb == ra, size))
                if k is not None:
                    found.append((k, rb, ob + k - lo, got[0] <= k <= got[1]))
            if found:
                k, rk, sk, yes = min(found)
                return cpwindow.pair(p, k, (ra, sp), (rk, sk), yes)
    return None
