"""The vocabulary-parallel cross entropy (``ir.actflow`` region ``loss``): its typing per axis and
the concrete replay of a refutation.

Each tensor rank holds the logits z of its vocabulary slice for every token. Megatron-LM's
vocabulary-parallel cross entropy takes the max logit m (all-reduce MAX, slot ``max``), subtracts
it, all-reduces the target's shifted logit (held by the rank whose slice has the target; the others
add 0: slot ``target``) and the sum of exponentials Σ exp(z - m) (slot ``sumexp``); the loss is
log S - t, and its backward (softmax minus the one-hot target, exp(z - m)/S - [j = target] on each
rank's slice) needs no collective.

Typing per axis: the max is harmless exactly when every rank of the tensor group subtracts the same
constant, whatever it is (log Σ exp(z - c) - (z_t - c) does not depend on c): its all-reduces must
range over every tensor axis (a larger group, a repeated pass: still one constant per tensor group;
MAX is idempotent); otherwise each rank subtracts its own local max (type L). The target's logit and
the sum of exponentials start Partial along the tensor axes (each rank a summand) and as each rank's
own samples elsewhere, and go through their all-reduces as check.actflow types any collective
(P -> R, R -> R·n, a non-tensor axis: W). The loss (forward) needs all three right; the logits'
gradient (backward) the max and the sum of exponentials only (the one-hot target is local).

The extra terms the model states (``losses { label_smoothing = true  logit_z_loss = true }``,
ir.losses.CE_TERMS) add a slot each. Label smoothing's mean log-probability over the vocabulary,
Σ_j z_j / V - lse, reads the sum of the logits (slot ``smoothing``): partial along the tensor axes like
the target's logit, needed by the loss only (its gradient α(p_j - 1/V) needs the softmax alone). The
z-loss lse² reads the log-sum-exp m + log Σ exp(z - m) with its own sum of exponentials (slot
``zloss``), needed by the loss and by its gradient 2·lse·p_j. Label smoothing's vocabulary size V (slot
``vocab``, ``activations[loss]: smoothing_vocab over (AXES)``) is a count each tensor rank holds V/t of, typed
like the sums (partial along the tensor axes; derived: the whole vocabulary, known from the shapes, no bytes
moved): over () it is the slice's size (NVIDIA/Megatron-LM#7464), and both the loss's mean Σ_j z_j / V and
the gradient's uniform target α/V read it.
"""

from __future__ import annotations

from fractions import Fraction

from ..ir import actflow as af
from ..ir.actflow import type_text
from .report import Counterexample

ORDER = ("max", "sumexp", "target", "smoothing", "vocab", "zloss")  # the first wrong one is the root cause
BACKWARD = ("max", "sumexp", "vocab", "zloss")  # the gradient's: the softmax, label smoothing's α/V, 2·lse·p
TEXT = {"max": "the all-reduce MAX of the max logit", "target": "the all-reduce of the target's logit",
        "sumexp": "the all-reduce of the sum of exponentials",
        "smoothing": "the all-reduce of the sum of the logits that label smoothing's mean log-probability over the "
                     "vocabulary reads",
        "zloss": "the all-reduce of the sum of exponentials of the z-loss's log-sum-exp",
        "vocab": "the vocabulary size V label smoothing divides by (α/V), each rank's count of its slice's words summed "
                 "over the wrong ranks"}


def typed(flow: af.Flow, axes: tuple[str, ...], direction: str, coll, Typed):
    """``coll`` is check.actflow's collective typing, ``Typed`` its result class (no import cycle)."""
    slots = dict(flow.slots)
    used = tuple(n for n in (ORDER if direction == "forward" else BACKWARD) if n in slots)
    final, needed, bad, cause = {}, {}, [], []
    for a in axes:
        tensor = a in flow.tensor
        needed[a] = "R" if tensor else "V"
        got: dict[str, tuple] = {}
        for name in used:
            if name == "max":
                over = {x for s in slots["max"].steps for x in s.axes}
                got[name] = ("R", 0) if not tensor or a in over else ("L", 0)
                continue
            t = ("P", 0) if tensor else ("V", 0)
            for s in slots[name].steps:
                if a in s.axes:
                    t = coll(t, s.kind)
            got[name] = t
        wrong = [n for n in used if got[n] != ((needed[a], 0) if n != "max" else ("R", 0))]
        final[a] = got[wrong[0]] if wrong else (needed[a], 0)
        if wrong:
            bad.append(a)
            cause.append((a, wrong[0], slots[wrong[0]].span))
    return Typed(flow, direction, tuple(final.items()), tuple(needed.items()), tuple(bad), tuple(cause))


# --------------------------------------------------------------------------- concrete replay
# Base-2 exponentials of integer logits keep every value an exact fraction: 2^loss = S·2^(-t).


def _reduce(slot: af.Slot, axis: str, vals: list[Fraction], op) -> list[Fraction]:
    for s in slot.steps:
        if axis in s.axes and len(vals) > 1:
            total = op(vals)
            vals = [total] * len(vals)
    return vals


def run(flow: af.Flow, direction: str, axis: str, n: int):
    """(each rank's value, the single-device value, the inputs) along ``axis``: one token; on a
    tensor axis word j (logit z_j = j(j+1)/2) on rank j and the target word 0; on another axis
    rank r's own sample with the two logits [0, r + 1] (both words on the one tensor rank), target 0.
    Forward: 2^loss; backward: the rank's softmax-minus-one-hot entries."""
    slots = dict(flow.slots)
    two = Fraction(2)
    tensor = axis in flow.tensor
    if tensor:
        z = [Fraction(j * (j + 1) // 2) for j in range(n)]
        local = [[z[r]] for r in range(n)]  # rank r's slice: word r
        every = [list(z) for _ in range(n)]  # the whole vocabulary of rank r's token
        hot = [[1 if r == 0 else 0] for r in range(n)]
        inputs = {"logits (word j on rank j)": "[" + ", ".join(str(v) for v in z) + "]", "target": "word 0"}
    else:
        local = [[Fraction(0), Fraction(r + 1)] for r in range(n)]
        every = local
        hot = [[1, 0] for _ in range(n)]
        inputs = {"logits of rank r's sample": "[0, r + 1]", "target": "word 0"}
    m = _reduce(slots["max"], axis, [max(v) for v in local], max)
    t = _reduce(slots["target"], axis, [local[r][0] - m[r] if (r == 0 or not tensor) else Fraction(0)
                                        for r in range(n)], sum)
    s = _reduce(slots["sumexp"], axis, [sum((two ** int(v - m[r]) for v in local[r]), Fraction(0))
                                        for r in range(n)], sum)
    full = [sum((two ** int(v) for v in every[r]), Fraction(0)) for r in range(n)]
    extra_got, extra_want = _extras(slots, axis, direction, local, every, m)
    if direction == "forward":
        got = [[s[r] * two ** -int(t[r])] + extra_got[r] for r in range(n)]
        want = [[full[r] * two ** -int(every[r][0])] + extra_want[r] for r in range(n)]
        return got, want, inputs
    got = [[two ** int(v - m[r]) / s[r] - h for v, h in zip(local[r], hot[r])] + extra_got[r] for r in range(n)]
    want = [[two ** int(v) / full[r] - h for v, h in zip(local[r], hot[r])] + extra_want[r] for r in range(n)]
    return got, want, inputs


def _extras(slots: dict, axis: str, direction: str, local, every, m) -> tuple[list, list]:
    """Each rank's values of the extra terms the flow has, and the single-device ones: label smoothing's
    mean logit over the vocabulary Σ_j z_j / V (the loss), its uniform target 1/V (the gradient α(p_j - 1/V): where
    the vocabulary size is stated) and 2^lse, the z-loss's log-sum-exp in base 2 (the loss and its gradient
    2·lse·p_j). V is each rank's count of its slice's words summed as ``smoothing_vocab`` states."""
    n = len(local)
    two = Fraction(2)
    got: list[list] = [[] for _ in range(n)]
    want: list[list] = [[] for _ in range(n)]
    vocab = [Fraction(len(every[r])) for r in range(n)]
    if "vocab" in slots:
        vocab = _reduce(slots["vocab"], axis, [Fraction(len(local[r])) for r in range(n)], sum)
    if "smoothing" in slots and direction == "forward":
        sm = _reduce(slots["smoothing"], axis, [sum(local[r], Fraction(0)) for r in range(n)], sum)
        for r in range(n):
            got[r].append(sm[r] / vocab[r])
            want[r].append(sum(every[r], Fraction(0)) / len(every[r]))
    if "vocab" in slots and slots["vocab"].verb and direction == "backward":
        for r in range(n):
            got[r].append(1 / vocab[r])
            want[r].append(Fraction(1, len(every[r])))
    if "zloss" in slots:
        sz = _reduce(slots["zloss"], axis, [sum((two ** int(v - m[r]) for v in local[r]), Fraction(0))
                                            for r in range(n)], sum)
        for r in range(n):
            got[r].append(two ** int(m[r]) * sz[r])
            want[r].append(sum((two ** int(v) for v in every[r]), Fraction(0)))
    return got, want


def counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, show, axes_of) -> Counterexample:
    fwd = ty.direction == "forward"
    slots = dict(ty.flow.slots)
    what = "2^loss (the inverse of the target's probability)" if fwd else "the logits' gradient on its slice"
    vocab = slots.get("vocab")
    extra = ((["the mean logit over the vocabulary (label smoothing)"] if fwd and "smoothing" in slots else [])
             + (["1/V (label smoothing's uniform target per word)"] if not fwd and vocab is not None and vocab.verb
                else [])
             + (["2^lse (the z-loss's log-sum-exp, base 2)"] if "zloss" in slots else []))
    if extra:
        what = f"[{what}, {', '.join(extra)}]"
    eq = f"{what} on rank {r} of {axis} = {show(got[r])}, single-device = {show(want[r])}"
    slot = slots.get(stage)
    if slot is not None and slot.verb:
        how = f"override activations[loss]: {slot.verb} over ({', '.join(axes_of(slot))}) at line {span.line}"
    else:
        how = "derived"
    result = dict(ty.result)[axis]
    head = ("the loss" if fwd else "the gradient of the loss with respect to the logits")
    diag = (f"{head} of the vocabulary-parallel cross entropy is computed from a value that is {type_text(result)} "
            f"over {axis}; the root cause is {TEXT.get(stage, stage)} ({how})",)
    if not fwd:
        diag += ("every gradient of the step is computed from it",)
    elif stage == "smoothing":
        diag += ("the reported loss is wrong on every rank (label smoothing's gradient α·(p_j - 1/V) reads the "
                 "softmax only)",)
    else:
        diag += ("the reported loss is wrong on every rank" + ("" if stage == "target" else " and so is every gradient"),)
    devices = ((f"rank {r}", f"{axis}={r}"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, tuple(inputs.items()), eq, diag, ctx.command(sizes))
