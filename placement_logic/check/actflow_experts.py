"""The MoE token dispatch and combine (``ir.actflow`` region ``experts``): their typing per axis and
the concrete replay of a refutation.

Each rank holds its own tokens, laid out in blocks, one per destination coordinate; the rank's local
expert is given by its coordinates on the expert axes E (expert j multiplies by j + 2). An
all-to-all over a group G exchanges, along every axis a of G, the block a rank holds for coordinate
k with the block rank k holds for the rank's own coordinate (a transpose along a). The single-device
layer sends each token to its expert and back: along an expert axis a token's block index is its
expert's coordinate, along every other axis the experts are the same on every rank.

Per axis a with p dispatch passes and q combine passes (the backward: combine's conjugate, then
dispatch's): on an expert axis the token meets its expert exactly when p is odd, and comes back to
its own place exactly when p + q is even, so the layer is right there iff p and q are both odd; on
another axis every rank has the same experts and the token is right iff p + q is even (a dispatch
and a combine over it both: an all-to-all to a replica of the same expert and back), except on two
kinds of axis. A pipeline axis's ranks hold the experts of other layers: there the token meets its
own layer's expert exactly when p is even. A tensor axis without sequence parallelism that splits
the experts too (``ir.actflow.summed_axes``) holds the same tokens on every rank and a shard of each
expert, whose partial products are all-reduced over it: a pass over it leaves each rank a different
token in the same block, so the sum adds shards of different tokens, and the result is right only if
p is even; its sum is the same on every rank, so it comes back to its token only if q is even too.
On both kinds the layer is right iff p and q are both even. Distinct token values make every other
case a wrong value when a has two or more ranks.
"""

from __future__ import annotations

from fractions import Fraction

from ..ir import actflow as af
from ..ir.overrides import OverrideTarget
from .report import Counterexample

TEXT = {"fwd_entry": "the dispatch all-to-all before the expert MLPs",
        "fwd_exit": "the combine all-to-all after them",
        "bwd_exit": "the combine's conjugate all-to-all (the output gradient to the experts)",
        "bwd_entry": "the dispatch's conjugate all-to-all (the input gradient back to its tokens)"}
ORDER = {"forward": ("fwd_entry", "fwd_exit"), "backward": ("bwd_exit", "bwd_entry")}


def passes(slot: af.Slot, axis: str) -> int:
    return sum(1 for s in slot.steps for a in s.axes if a == axis)


def typed(flow: af.Flow, axes: tuple[str, ...], direction: str, Typed):
    """``Typed`` is check.actflow's result class (no import cycle)."""
    slots = dict(flow.slots)
    first, second = ORDER[direction]
    final, bad, cause = {}, [], []
    for a in axes:
        p, q = passes(slots[first], a), passes(slots[second], a)
        if a in flow.layers or a in flow.summed:
            wrong = first if p % 2 else (second if q % 2 else "")
        elif a in flow.tensor:
            wrong = first if p % 2 == 0 else (second if q % 2 == 0 else "")
        else:
            wrong = "" if (p + q) % 2 == 0 else (first if p % 2 else second)
        final[a] = ("X", 0) if wrong else ("V", 0)
        if wrong:
            bad.append(a)
            cause.append((a, wrong, slots[wrong].span))
    needed = tuple((a, "V") for a in axes)
    return Typed(flow, direction, tuple(final.items()), needed, tuple(bad), tuple(cause))


def _transpose(buf: list[list[Fraction]], times: int) -> list[list[Fraction]]:
    for _ in range(times):
        buf = [[buf[k][r] for k in range(len(buf))] for r in range(len(buf))]
    return buf


def run(flow: af.Flow, direction: str, axis: str, n: int):
    """(each rank's blocks, the single-device blocks, the inputs) along ``axis``: rank r's block k
    holds the token 1000·(n·r + k) + 1, bound for expert k on an expert axis (expert 0 elsewhere); on
    a summed tensor axis every rank holds the token 1000·k + 1 in block k and shard r of the expert
    (factor r + 2), the partial products all-reduced over the axis."""
    slots = dict(flow.slots)
    first, second = ORDER[direction]
    expert = axis in flow.tensor
    summed = axis in flow.summed
    x = [[Fraction(1000 * ((0 if summed else n * r) + k) + 1) for k in range(n)] for r in range(n)]
    mid = _transpose(x, passes(slots[first], axis))
    layer = axis in flow.layers
    mid = [[v * ((r + 2) if expert or layer or summed else 2) for v in row] for r, row in enumerate(mid)]
    if summed:
        mid = [[sum((mid[s][k] for s in range(n)), Fraction(0)) for k in range(n)] for _ in range(n)]
    got = _transpose(mid, passes(slots[second], axis))
    whole = sum(range(2, n + 2))
    want = [[x[r][k] * ((k + 2) if expert else (r + 2) if layer else whole if summed else 2) for k in range(n)]
            for r in range(n)]
    inputs = {"token in block k of rank r": "1000·k + 1 (the same on every rank)" if summed else "1000·(n·r + k) + 1",
              "its expert": "k (rank k's local expert, which multiplies by k + 2)" if expert else
              "its own stage's expert (stage r's layer multiplies by r + 2)" if layer else
              f"expert 0, split over the ranks (rank r's shard multiplies by r + 2, all-reduced: {whole})"
              if summed else "expert 0 (every rank of the axis holds it; it multiplies by 2)"}
    return got, want, inputs


def counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, show, axes_of) -> Counterexample:
    fwd = ty.direction == "forward"
    summed = axis in ty.flow.summed
    what = "expert output per block" if fwd else \
        f"input gradient per block (output gradient {'1000·k + 1' if summed else '1000·(n·r + k) + 1'})"
    eq = f"{what} on rank {r} of {axis} = {show(got[r])}, single-device = {show(want[r])}"
    slot = dict(ty.flow.slots).get(stage)
    if slot is not None and slot.verb:
        target = OverrideTarget.ACTIVATIONS if fwd else OverrideTarget.ACTIVATION_GRADS
        how = f"override {target}[experts]: {slot.verb} over ({', '.join(axes_of(slot))}) at line {span.line}"
    else:
        how = "derived, while the other all-to-all is stated elsewhere"
    kind = "expert" if axis in ty.flow.tensor else "pipeline" if axis in ty.flow.layers else \
        "tensor" if summed else "non-expert"
    wrong = ("the sum over its ranks of the experts' shards applied to different tokens (its ranks hold the same "
             "tokens, an all-to-all over it gives each another one)" if summed else af.KIND_TEXT["X"])
    diag = (f"the MoE layer's {'output' if fwd else 'input gradient'} over the {kind} axis {axis} is "
            f"{wrong}; the all-to-alls must range over the expert axes "
            f"({', '.join(ty.flow.tensor)}); the root cause is {TEXT[stage]} ({how})",)
    diag += (("every layer after it, the loss and so every gradient of the step, are computed from it",) if fwd
             else ("every layer before it, and the weight gradients computed from it, receive the wrong gradient",))
    devices = ((f"rank {r}", f"{axis}={r}"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, tuple(inputs.items()), eq, diag, ctx.command(sizes))
