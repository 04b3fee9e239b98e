"""Obligations on the state a step starts from and the random state it draws: identical initial
copies, the optimizer holding the model's own tensors, and the RNG state of every dropout region.

Input: a ``StepModel`` (its ``identity`` and ``rng`` parts) and the replay ``Context``. Output:
``Obligation`` records (``obligations.Obligation``), each with the z3 negation (some axis of the
violation has two or more ranks) and a concrete replay that initialises, steps or draws on two
ranks and compares them.
"""

from __future__ import annotations

from fractions import Fraction

from ..diagnostics import NO_SPAN
from . import encode as en
from .replay import Context, _frac, coords_text
from .report import Counterexample
from .rng import mask
from .rules import STATE_CONSISTENCY

BASE_SEED = 1234


def state_obligations(step, ctx: Context, obligation) -> list:
    """``obligation``: the ``Obligation`` constructor (obligations.py owns it)."""
    ident, rng = step.identity, step.rng
    P = step.plan_span
    sp = (lambda s: P if s is None or s == NO_SPAN else s)
    has_copies = any(g.replicated_params for g in step.groups)
    init_bad = [(a, True) for a in ident.bad_axes]
    obs = [
        obligation(
            "SC params initial", STATE_CONSISTENCY, sp(ident.init_span),
            "every copy of a parameter starts from the same value: params replicated over an axis are broadcast "
            "(or seeded alike) at initialisation",
            lambda env: en.axes_negation(env, "init", [(a, env.sess.true() if b else env.sess.false())
                                                        for a, b in init_bad]),
            lambda w: replay_init(ctx, w),
            () if has_copies else ("vacuous: no parameter is replicated over any axis",)),
        obligation(
            "SC optimizer holds the params", STATE_CONSISTENCY, sp(ident.stale_span),
            "the optimizer steps the very tensors the forward reads (built over the wrapped model's parameters)",
            lambda env: en.flag_negation(env, "stale", bool(ident.stale)),
            lambda w: replay_stale(ctx, w)),
    ]
    split_span = rng.split_bad[0][1] if rng.split_bad else None
    obs.append(obligation(
        "SC rng split regions", STATE_CONSISTENCY, sp(split_span),
        "dropout in a region split over an axis (the heads of a tensor-parallel rank, sequence-parallel slices, "
        "the experts of an expert rank) draws from an RNG state that differs over that axis",
        lambda env: en.axes_negation(env, "rng_split", [(a, env.sess.true()) for a, _, _ in rng.split_bad]),
        lambda w: replay_rng_split(ctx, w),
        () if rng.split_axes else ("vacuous: no tensor or expert axis",)))
    rep_span = rng.replicated_bad[0][1] if rng.replicated_bad else None
    vac = not rng.tensor_axes or rng.sequence_parallel
    obs.append(obligation(
        "SC rng replicated region", STATE_CONSISTENCY, sp(rep_span),
        "dropout in the region replicated over the tensor axes draws from the same RNG state (seed and offset) "
        "on every rank of them",
        lambda env: en.axes_negation(env, "rng_replicated", [(a, env.sess.true()) for a, _ in rng.replicated_bad]),
        lambda w: replay_rng_replicated(ctx, w),
        (("vacuous: no tensor axis",) if not rng.tensor_axes else
         ("vacuous: under sequence parallelism no dropout region is replicated over the tensor axes",)) if vac else ()))
    obs.append(obligation(
        "SC rng recompute", STATE_CONSISTENCY, sp(rng.not_preserved),
        "recomputation replays the forward's RNG state, so the recomputed dropout masks are the forward's",
        lambda env: en.flag_negation(env, "rng_recompute", rng.recompute_bad),
        lambda w: replay_rng_recompute(ctx, w),
        () if rng.recompute else ("vacuous: no activation is recomputed",)))
    return obs


def _pair(ctx: Context, axis: str) -> tuple[dict[str, int], dict[str, int]]:
    d0 = {a: 0 for a in ctx.step.axes}
    return d0, dict(d0, **{axis: 1})


def _init_value(dev: dict[str, int], axes: tuple[str, ...], sizes: dict[str, int]) -> Fraction:
    """A parameter element initialised from seed BASE + the rank's offset over ``axes`` (no broadcast)."""
    s, stride = BASE_SEED, 1
    for a in reversed(axes):
        s += dev[a] * stride
        stride *= sizes[a]
    return Fraction((s * 7919) % 1000 + 1, 1000)


def replay_init(ctx: Context, w: dict) -> Counterexample | None:
    """Two ranks along the axis initialise one replicated element from their own seeds and apply the
    same (reduced, identical) update: they still differ, so the replicas never agree."""
    step, sizes, axis = ctx.step, w["sizes"], w["axis"]
    hit = next(((g, axes, span) for g, axes, span in step.identity.unbroadcast if axis in axes), None)
    if hit is None or sizes[axis] < 2:
        return None
    group, axes, span = hit
    d0, d1 = _pair(ctx, axis)
    v0, v1 = _init_value(d0, axes, sizes), _init_value(d1, axes, sizes)
    if v0 == v1:
        return None
    delta = Fraction(-1, 10)
    eq = (f"{group} element 0 after the first update on {coords_text(step.axes, d0.values())} = {_frac(v0 + delta)} "
          f"but on {coords_text(step.axes, d1.values())} = {_frac(v1 + delta)}: the copies started apart "
          f"({_frac(v0)} vs {_frac(v1)}) and the same reduced gradient keeps them apart")
    diag = (f"the {group} params are replicated over {axis} and each rank initialises them from its own seed with "
            f"no broadcast at initialisation (override at line {span.line}): every {axis} rank trains a different "
            "model, and averaging their gradients does not make them one",)
    return Counterexample(ctx.sizes_tuple(sizes),
                          (("rank A", coords_text(step.axes, d0.values())), ("rank B", coords_text(step.axes, d1.values()))),
                          (("initial value A", _frac(v0)), ("initial value B", _frac(v1)), ("update", _frac(delta))),
                          eq, diag, ctx.command(sizes))


def replay_stale(ctx: Context, w: dict) -> Counterexample | None:
    """One update: the optimizer steps its copy, the next forward reads the model's own tensor."""
    step, sizes = ctx.step, w["sizes"]
    if not step.identity.stale:
        return None
    group, span = step.identity.stale[0]
    theta, grad, lr = Fraction(1, 2), Fraction(1, 5), Fraction(1, 10)
    stepped, read = theta - lr * grad, theta
    eq = (f"{group} element 0 read by the next forward = {_frac(read)}; the update made it {_frac(theta)} - "
          f"{_frac(lr)}·{_frac(grad)} = {_frac(stepped)}, in the optimizer's copy only")
    diag = (f"the optimizer holds copies of the {group} params made before the model was re-wrapped (override at "
            f"line {span.line}): it steps tensors the model no longer reads, so the model never trains",)
    return Counterexample(ctx.sizes_tuple(sizes), (("device", "every rank"),),
                          (("param before", _frac(theta)), ("grad", _frac(grad)), ("lr", _frac(lr))),
                          eq, diag, ctx.command(sizes))


def _tracker_seed(dev: dict[str, int], rng, sizes: dict[str, int]) -> int:
    """Megatron-LM's fork: seed + 2718 + the rank over each split axis the tracker is forked on."""
    same = {a for a, _, _ in rng.same}
    s, stride = BASE_SEED + 2718, 1
    for a in reversed(rng.split_axes):
        if a not in same:
            s += dev[a] * stride
            stride *= sizes[a]
    return s


def replay_rng_split(ctx: Context, w: dict) -> Counterexample | None:
    step, sizes, axis = ctx.step, w["sizes"], w["axis"]
    rng = step.rng
    hit = next(((sp, verb) for a, sp, verb in rng.split_bad if a == axis), None)
    if hit is None or sizes[axis] < 2:
        return None
    d0, d1 = _pair(ctx, axis)
    s0, s1 = _tracker_seed(d0, rng, sizes), _tracker_seed(d1, rng, sizes)
    if s0 != s1:
        return None
    m = mask(s0, 0, 16)
    region = ("the experts of each expert rank" if axis in rng.expert_axes and axis not in rng.tensor_axes else
              "the attention heads each tensor-parallel rank holds" + (" and its sequence-parallel slice"
                                                                          if rng.sequence_parallel else ""))
    eq = (f"split-region dropout mask on {coords_text(step.axes, d0.values())} = {m} = the mask on "
          f"{coords_text(step.axes, d1.values())}: two different slices of one layer's activations get the same mask")
    how = ("every rank restores one rank's RNG state from the checkpoint" if hit[1] == "restored_from_one" else
           "the model-parallel RNG tracker is not forked per rank")
    diag = (f"{how} over {axis} (override at line {hit[0].line}), so dropout over {region} repeats one pattern on "
            f"every {axis} rank; the split region needs a state per rank (seed + rank)",)
    return Counterexample(ctx.sizes_tuple(sizes),
                          (("rank A", coords_text(step.axes, d0.values())), ("rank B", coords_text(step.axes, d1.values()))),
                          (("tracker state A", f"(seed {s0}, offset 0)"), ("tracker state B", f"(seed {s1}, offset 0)")),
                          eq, diag, ctx.command(sizes))


def replay_rng_replicated(ctx: Context, w: dict) -> Counterexample | None:
    step, sizes, axis = ctx.step, w["sizes"], w["axis"]
    rng = step.rng
    hit = next((sp for a, sp in rng.replicated_bad if a == axis), None)
    if hit is None or sizes[axis] < 2 or rng.sequence_parallel:
        return None
    d0, d1 = _pair(ctx, axis)
    # the default generator: one seed on every tensor rank; rank 0 of the axis draws once more before the dropout
    o0, o1 = 1, 0
    m0, m1 = mask(BASE_SEED, o0, 16), mask(BASE_SEED, o1, 16)
    eq = (f"replicated-region dropout mask on {coords_text(step.axes, d0.values())} = {m0} but on "
          f"{coords_text(step.axes, d1.values())} = {m1}: one hidden state, replicated over {axis}, gets two masks "
          "and the copies diverge")
    diag = (f"the default generator's offset is advanced differently over {axis} (override at line {hit.line}): the "
            "seeds agree but the states do not, and the dropout after the row-parallel all-reduce acts on a value "
            f"replicated over {axis}",)
    return Counterexample(ctx.sizes_tuple(sizes),
                          (("rank A", coords_text(step.axes, d0.values())), ("rank B", coords_text(step.axes, d1.values()))),
                          (("default state A", f"(seed {BASE_SEED}, offset {o0})"),
                           ("default state B", f"(seed {BASE_SEED}, offset {o1})")),
                          eq, diag, ctx.command(sizes))


def replay_rng_recompute(ctx: Context, w: dict) -> Counterexample | None:
    rng, sizes = ctx.step.rng, w["sizes"]
    if not rng.recompute_bad:
        return None
    n = 16  # the forward's dropout draws advance the offset by the mask's size
    fwd, again = mask(BASE_SEED, 0, n), mask(BASE_SEED, n, n)
    if fwd == again:
        return None
    eq = (f"dropout mask in the forward = {fwd}; in the recomputation = {again}: the backward differentiates a "
          "forward that did not produce the loss")
    diag = (f"activations are recomputed without restoring the forward's RNG state (override at line "
            f"{rng.not_preserved.line}): the recomputed dropout draws from the state the forward left behind",)
    return Counterexample(ctx.sizes_tuple(sizes), (("device", "every rank"),),
                          (("forward state", f"(seed {BASE_SEED}, offset 0)"),
                           ("recompute state", f"(seed {BASE_SEED}, offset {n})")), eq, diag, ctx.command(sizes))

