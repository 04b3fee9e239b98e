"""Concrete replay of an activation-flow refutation (``check.actflow``): the region run on the n
ranks of the axis the witness names, with exact numbers.

One sample of n sequence positions, a column-parallel weight a (column j on tensor rank j) and a
row-parallel weight b (row j on tensor rank j): the single-device region computes y_i = x_i · Σ_j
a_j b_j and its input gradient dx_i = dy_i · Σ_j a_j b_j (the head: logits z_ij = x_i a_j, and dx_i
= Σ_j dz_ij a_j). Each rank holds its local tensor (a list of numbers along the sequence); every
collective of the plan's slots that ranges over the axis is executed on the ranks' lists (an
all-reduce sums them element by element, an all-gather concatenates them, a reduce-scatter sums and
keeps the rank's chunk, a copy's reduction leaves the list as it was). Along a non-tensor axis the
ranks hold different samples and the whole weights. Every other axis has one rank.
"""

from __future__ import annotations

from fractions import Fraction

from ..ir import actflow as af
from ..ir.actflow import type_text
from ..ir.overrides import OverrideTarget, OverrideVerb
from .replay import Context, _frac
from .report import Counterexample

Local = list[Fraction] | None  # None: the ranks' shapes did not fit the collective


def _collective(kind: str, ranks: list[Local]) -> list[Local]:
    n = len(ranks)
    if kind == af.COPY or n == 1:
        return ranks
    if any(r is None for r in ranks):
        return [None] * n
    if kind == af.ALL_GATHER:
        return [[v for r in ranks for v in r]] * n
    if kind == af.SLICE:
        return [r[i * len(r) // n:(i + 1) * len(r) // n] if len(r) % n == 0 else None for i, r in enumerate(ranks)]
    if len({len(r) for r in ranks}) != 1:
        return [None] * n
    total = [sum(col, Fraction(0)) for col in zip(*ranks)]
    if kind == af.ALL_REDUCE:
        return [list(total)] * n
    if len(total) % n:
        return [None] * n
    k = len(total) // n
    return [total[i * k:(i + 1) * k] for i in range(n)]


def _apply(slot: af.Slot, axis: str, ranks: list[Local]) -> list[Local]:
    for s in slot.steps:
        for a in s.axes:
            if a == axis:
                ranks = _collective(s.kind, ranks)
    return ranks


def _numbers(n: int) -> tuple[list[Fraction], list[Fraction], list[Fraction]]:
    x = [Fraction(2 * i + 3) for i in range(n)]
    a = [Fraction(i + 2) for i in range(n)]
    b = [Fraction(3 * i + 1, 2) for i in range(n)]
    return x, a, b


def _embedding(flow: af.Flow, direction: str, axis: str, n: int) -> tuple[list[Local], list[Local], dict[str, str]]:
    """The vocabulary-parallel embedding along ``axis``: n words, word j's (one-number) row e_j on
    tensor rank j; n positions holding the tokens n-1, ..., 0. Forward: each rank looks up the tokens
    in its slice (zero elsewhere), then the plan's fwd_exit. Backward: the output gradient dy (whole,
    or the rank's sequence slice under sequence parallelism) through bwd_exit, then rank j's weight
    gradient for word j, the sum of dy over the positions holding token j, which reads one number
    per position (another length: shapes that do not fit). Along a non-tensor axis every rank holds
    its own one-token sample and the whole vocabulary."""
    x, e, _ = _numbers(n)
    slots = dict(flow.slots)
    if axis not in flow.tensor:
        if direction == "forward":
            got = _apply(slots["fwd_exit"], axis, [[x[r]] for r in range(n)])
            want = [[x[r]] for r in range(n)]
            return got, want, {"e(token) on rank r": "2r + 3 (its own sample's token)"}
        got = _apply(slots["bwd_exit"], axis, [[x[r]] for r in range(n)])
        got = [None if v is None or len(v) != 1 else list(v) for v in got]
        return got, [[x[r]] for r in range(n)], {"dy on rank r": "2r + 3 (its own sample)"}
    tok = [n - 1 - i for i in range(n)]
    if direction == "forward":
        got = [[e[j] if j == r else Fraction(0) for j in tok] for r in range(n)]
        got = _apply(slots["fwd_exit"], axis, got)
        full = [e[j] for j in tok]
        want = [[full[r]] for r in range(n)] if flow.sp else [list(full) for _ in range(n)]
        return got, want, {"tokens": "[" + ", ".join(str(j) for j in tok) + "]",
                           "e (row j on rank j)": "[" + ", ".join(_frac(v) for v in e) + "]"}
    start = [[x[r]] for r in range(n)] if flow.sp else [list(x) for _ in range(n)]
    got = _apply(slots["bwd_exit"], axis, start)
    got = [None if v is None or len(v) != n else [sum((v[i] for i in range(n) if tok[i] == r), Fraction(0))]
           for r, v in enumerate(got)]
    want = [[sum((x[i] for i in range(n) if tok[i] == r), Fraction(0))] for r in range(n)]
    return got, want, {"tokens": "[" + ", ".join(str(j) for j in tok) + "]",
                       "dy": "[" + ", ".join(_frac(v) for v in x) + "]"}


def run(flow: af.Flow, direction: str, axis: str, n: int) -> tuple[list[Local], list[Local], dict[str, str]]:
    """(what each rank holds, what it should hold, the inputs) for the region along ``axis``."""
    if flow.region == "embedding":
        return _embedding(flow, direction, axis, n)
    tensor = axis in flow.tensor
    x, a, b = _numbers(n)
    slots = dict(flow.slots)
    if not tensor:  # n samples of one position, the whole weights on every rank (one tensor rank)
        w = a[0] * b[0]
        if direction == "forward":
            got = [[x[r]] for r in range(n)]
            got = _apply(slots["fwd_entry"], axis, got)
            got = [None if v is None else [e * a[0] for e in v] for v in got]
            want = [[x[r] * (a[0] if not flow.has_row else w)] for r in range(n)]
            if flow.has_row:
                got = [None if v is None else [e * b[0] for e in v] for v in got]
                got = _apply(slots["fwd_exit"], axis, got)
        else:
            got = [[x[r]] for r in range(n)]
            if flow.has_row:
                got = _apply(slots["bwd_exit"], axis, got)
                got = [None if v is None else [e * b[0] for e in v] for v in got]
            got = [None if v is None else [e * a[0] for e in v] for v in got]
            got = _apply(slots["bwd_entry"], axis, got)
            want = [[x[r] * (w if flow.has_row else a[0])] for r in range(n)]
        return got, want, {"sample on rank r": "2r + 3", "a (whole)": _frac(a[0]), "b (whole)": _frac(b[0])}
    w = sum((a[j] * b[j] for j in range(n)), Fraction(0))
    start = [[x[r]] for r in range(n)] if flow.sp else [list(x) for _ in range(n)]
    if direction == "forward":
        got = _apply(slots["fwd_entry"], axis, start)
        got = [None if v is None else [e * a[r] for e in v] for r, v in enumerate(got)]
        if flow.has_row:
            got = [None if v is None else [e * b[r] for e in v] for r, v in enumerate(got)]
            got = _apply(slots["fwd_exit"], axis, got)
            full = [e * w for e in x]
        else:
            full = None
        if full is None:
            want = [[e * a[r] for e in x] for r in range(n)]
        else:
            want = [[full[r]] for r in range(n)] if flow.sp else [list(full) for _ in range(n)]
    else:
        if flow.has_row:
            got = _apply(slots["bwd_exit"], axis, start)
            got = [None if v is None else [e * b[r] for e in v] for r, v in enumerate(got)]
            full = [e * w for e in x]
        else:  # the vocabulary-parallel loss's logit gradient: column r of dz on rank r, dz_ij = x_i + j
            got = [[e + r for e in x] for r in range(n)]
            full = [sum(((e + j) * a[j] for j in range(n)), Fraction(0)) for e in x]
        got = [None if v is None else [e * a[r] for e in v] for r, v in enumerate(got)]
        got = _apply(slots["bwd_entry"], axis, got)
        want = [[full[r]] for r in range(n)] if flow.sp else [list(full) for _ in range(n)]
    inputs = {"x (one sample)" if direction == "forward" else "dy": "[" + ", ".join(_frac(v) for v in x) + "]",
              "a (column j on rank j)": "[" + ", ".join(_frac(v) for v in a) + "]"}
    if flow.has_row:
        inputs["b (row j on rank j)"] = "[" + ", ".join(_frac(v) for v in b) + "]"
    return got, want, inputs


def _show(v: Local) -> str:
    return "shapes that do not fit" if v is None else "[" + ", ".join(_frac(e) for e in v) + "]"


NEEDED_TEXT = {"R": "the whole value (replicated)", "S": "its sequence slice of the whole value (sharded)",
               "C": "its columns of the whole value", "V": "the value for its own samples"}
SLOT_TEXT = {
    "fwd_entry": "the collective before the column-parallel linear",
    "fwd_exit": "the collective after the row-parallel linear",
    "bwd_exit": "the output gradient's collective before the row-parallel linear's backward",
    "bwd_entry": "the input gradient's collective after the column-parallel linear's backward",
    "column": "the column-parallel linear", "row": "the row-parallel linear",
    "row_back": "the row-parallel linear's backward", "col_back": "the column-parallel linear's backward",
}


def replay(ctx: Context, ty, w: dict) -> Counterexample | None:

    axis = w["axis"]
    sizes = {k: (v if k == axis or k in ctx.pinned else 1) for k, v in w["sizes"].items()}
    n = sizes[axis]
    if n < 2 or axis not in ty.bad:
        return None
    for _, slot in ty.flow.slots:  # a collective over another axis with several ranks: not replayed here
        if any(sizes.get(a, 1) > 1 and a != axis for s in slot.steps for a in s.axes):
            return None
    if ty.flow.region == "loss":
        from . import actflow_loss

        got, want, inputs = actflow_loss.run(ty.flow, ty.direction, axis, n)
    elif ty.flow.region == "experts":
        from . import actflow_experts

        got, want, inputs = actflow_experts.run(ty.flow, ty.direction, axis, n)
    elif ty.flow.region == "context":
        from . import actflow_context

        got, want, inputs = actflow_context.run(ty.flow, ty.direction, axis, n, _apply)
    else:
        got, want, inputs = run(ty.flow, ty.direction, axis, n)
    r = next((i for i in range(n) if got[i] != want[i]), None)
    if r is None:
        return None
    stage, span = next((s, sp) for a, s, sp in ty.cause if a == axis)
    if ty.flow.region == "loss":
        return actflow_loss.counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, _show, _axes)
    if ty.flow.region == "experts":
        return actflow_experts.counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, _show, _axes)
    if ty.flow.region == "context":
        return actflow_context.counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, _show, _axes)
    if ty.flow.region == "embedding":
        return _embedding_cex(ctx, ty, sizes, axis, r, got, want, inputs, stage, span)
    result = dict(ty.result)[axis]
    what = "forward output" if ty.direction == "forward" else "input gradient"
    region = "the expert MLPs (expert tensor parallel)" if ty.flow.region == "expert_tensor" else ty.flow.region
    eq = (f"{what} of {region} on rank {r} of {axis} = {_show(got[r])}, single-device = {_show(want[r])}")
    slot = dict(ty.flow.slots).get(stage)
    if slot is not None and slot.verb:
        target = OverrideTarget.ACTIVATIONS if stage.startswith("fwd") else OverrideTarget.ACTIVATION_GRADS
        how = (f"override {target}[{ty.flow.shown}]: {slot.verb}" + (f" over ({', '.join(_axes(slot))})"
                                                                          if slot.verb not in (OverrideVerb.NO_REDUCE,
                                                                                               OverrideVerb.REDUCE_COPY) else "")
               + f" at line {span.line}")
        if slot.verb == OverrideVerb.REDUCE_COPY:
            how += ": the reduction sums a copy and the gradient that flows on is the rank's own summand"
        elif slot.declared and stage == "bwd_exit":
            how += f": the output gradient is declared {_PLACEMENT[slot.declared]} (to_local's grad_placements) and " \
                   f"redistributed from that, while it arrives {'sharded' if ty.flow.sp else 'replicated'}"
        elif slot.declared:
            how += f": the value is declared {_PLACEMENT[slot.declared]} " \
                   "and redistributed from that, not from what it is"
        cause = f"{SLOT_TEXT[stage]} ({how})"
    else:
        cause = f"{SLOT_TEXT.get(stage, stage)}, whose input an earlier stated collective left wrong"
    needed = dict(ty.needed)[axis]
    diag = (f"the {what} of {region if ty.flow.region == 'expert_tensor' else 'the ' + region + ' region'} is {type_text(result)} over {axis}, where every rank "
            f"must hold {NEEDED_TEXT[needed]}; the root cause is {cause}",)
    if ty.direction == "backward":
        diag += ("every layer before it, and the weight gradients computed from it, receive the wrong gradient",)
    else:
        diag += ("every value after it, the loss and so every gradient of the step, are computed from it",)
    devices = ((f"rank {r}", f"{axis}={r}"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, tuple(inputs.items()), eq, diag, ctx.command(sizes))


_PLACEMENT = {"R": "Replicate", "P": "Partial", "S": "Shard"}


def _axes(slot: af.Slot) -> tuple[str, ...]:
    return slot.axes or tuple(a for s in slot.steps for a in s.axes)


EMBEDDING_SLOT = {"fwd_exit": "the collective after the vocabulary-parallel embedding's masked lookup",
                  "bwd_exit": "the output gradient's collective before the embedding's weight gradient",
                  "lookup": "the vocabulary-parallel lookup"}


def _embedding_cex(ctx: Context, ty, sizes, axis, r, got, want, inputs, stage, span) -> Counterexample:
    fwd = ty.direction == "forward"
    what = "forward output" if fwd else "weight gradient (its vocabulary row)"
    eq = f"{what} of the embedding on rank {r} of {axis} = {_show(got[r])}, single-device = {_show(want[r])}"
    slot = dict(ty.flow.slots).get(stage)
    if slot is not None and slot.verb:
        target = OverrideTarget.ACTIVATIONS if fwd else OverrideTarget.ACTIVATION_GRADS
        how = f"override {target}[embedding]: {slot.verb} over ({', '.join(_axes(slot))}) at line {span.line}"
        if slot.declared and not fwd:
            how += f": the output gradient is declared {_PLACEMENT[slot.declared]} (to_local's grad_placements) " \
                   f"and redistributed from that, while it arrives {'sharded' if ty.flow.sp else 'replicated'}"
        elif slot.declared:
            how += f": the output is declared {_PLACEMENT[slot.declared]} " \
                   "and redistributed from that, while the masked lookup makes it Partial"
        cause = f"{EMBEDDING_SLOT.get(stage, stage)} ({how})"
    else:
        cause = f"{EMBEDDING_SLOT.get(stage, stage)}, whose input an earlier stated collective left wrong"
    result = dict(ty.result)[axis]
    needed = dict(ty.needed)[axis]
    if fwd:
        diag = (f"the embedding's output is {type_text(result)} over {axis}, where every rank must hold "
                f"{NEEDED_TEXT[needed]}; the root cause is {cause}",
                "every layer after it, the loss and so every gradient of the step, are computed from it")
    else:
        diag = (f"the output gradient the embedding's weight gradient reads is {type_text(result)} over {axis}, "
                f"where every rank must hold {NEEDED_TEXT[needed]}; the root cause is {cause}",
                "the embedding's weight gradient misses the contributions of the positions the rank does not hold")
    devices = ((f"rank {r}", f"{axis}={r}"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, tuple(inputs.items()), eq, diag, ctx.command(sizes))
