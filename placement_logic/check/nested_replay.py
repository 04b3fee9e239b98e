"""Nested accumulation (``check.nested``): every gradient obligation of a group checked where the
step's microbatches are whole rounds of M, the rescaled buffer's violation, and the concrete
replays of a witness.

Input: the obligations of a plan, its step model and replay context. Output: the obligations with
their negation (``encode_partial.nested_rounds``), replay and notes extended."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .. import ir
from ..ir.overrides import OverrideVerb
from .dims import MICROBATCHES, NORMALISATION
from .encode_partial import nested_rounds
from .nested import DIVISORS, RESCALED, nested_override
from .replay import _frac, coords_text
from .report import Counterexample
from .values import fold, resolver


def wrap(obs: list, step, ctx, plan: ir.Plan | None) -> list:
    """The configuration's condition (m a multiple of M) on every gradient obligation of a group;
    for a rescaled buffer also its violation, on the whole plan's and the microbatch aspect's."""
    o = nested_override(plan) if plan is not None else None
    if o is None:
        return obs
    groups = {g.group for g in step.groups}
    for ob in obs:
        g = ob.whole or ob.aspect_of
        if g not in groups:
            continue
        rescaled = o.verb == RESCALED and (ob.whole is not None or ob.name.endswith("over microbatches"))
        ob.encode = nested_rounds(ob.encode, o.by, rescaled, ob.name)
        if rescaled:
            ob.replay = _replay(ob.replay, ctx, o, g)
            ob.span = o.span
        elif o.verb in DIVISORS and (ob.whole is not None or ob.name.endswith(NORMALISATION)):
            ob.replay = _explained(ob.replay, o)
        ob.replay = _whole_rounds(ob.replay, ctx, o)
        ob.notes = ob.notes + (f"the step's microbatches run as rounds of {ir.show(o.by)} (line {o.span.line}): "
                               "checked where they are a whole number of rounds",)
    return obs


def rounds_of(ctx, sizes: dict[str, int], o: ir.Override) -> int | None:
    """M at these sizes, where the step's microbatches are a whole number of rounds of it."""
    known = {k: Fraction(v) for k, v in sizes.items()}
    M = Fraction(fold(o.by, resolver(ctx.bindings, known)))
    m = sizes.get(MICROBATCHES, 1)
    return int(M) if M.denominator == 1 and M >= 1 and m % int(M) == 0 else None


def _whole_rounds(orig, ctx, o: ir.Override):
    """A witness is replayed only where it is a configuration: m a whole number of rounds of M (a
    shrunk variant of a witness may not be)."""
    def replay(w):
        return orig(w) if "sizes" not in w or rounds_of(ctx, w["sizes"], o) is not None else None
    return replay


def _explained(orig, o: ir.Override):
    what = {OverrideVerb.OUTER_UNDIVIDED: "the outer accumulation divides by nothing, so its rounds are summed: each "
                               f"microbatch's mean is divided by {ir.show(o.by)} (the schedule's count) only",
            OverrideVerb.INNER_UNDIVIDED: f"the pipeline schedule sums its {ir.show(o.by)} microbatches without dividing by "
                               "them and the outer accumulation divides by its rounds only: each microbatch's mean "
                               "is divided by the number of rounds, not by the step's microbatches"}[o.verb]

    def replay(w):
        cex = orig(w)
        if cex is None:
            return None
        return replace(cex, diagnosis=(f"{what} (override at line {o.span.line})",) + tuple(cex.diagnosis))
    return replay


def _replay(orig, ctx, o: ir.Override, group: str):
    def replay(w):
        if w.get("kind") != "nested":
            return orig(w)
        return replay_rescaled(ctx, w["sizes"], o, group)
    return replay


def weights(m: int, M: int) -> list[Fraction]:
    """Each microbatch's weight in the accumulated buffer when the schedule scales the buffer by
    1 / M after each of the A = m / M rounds and the outer loop divides each loss by A."""
    rounds = m // M
    buf: list[Fraction] = []
    for _ in range(rounds):
        buf += [Fraction(1, rounds)] * M  # this round's microbatches, each loss divided by A
        buf = [x / M for x in buf]  # the schedule's scale, applied to the whole buffer
    return buf


def replay_rescaled(ctx, sizes: dict[str, int], o: ir.Override, group: str):
    """A device's buffer over the step's rounds, in exact fractions: each microbatch's mean loss
    gradient 1, the schedule's rescale applied to the accumulated buffer after every round."""
    m = sizes.get(MICROBATCHES, 1)
    M = rounds_of(ctx, sizes, o)
    if M is None:
        return None
    got = weights(m, M)
    right = Fraction(1, m)
    if all(x == right for x in got):
        return None
    step = ctx.step
    c0 = coords_text(step.axes, [0] * len(step.axes))
    shown = ", ".join(f"{_frac(x)}" for x in got)
    return Counterexample(
        ctx.sizes_tuple(sizes), (("device", c0),),
        (("rounds", f"{m // M} rounds of M = {M} microbatches"),
         ("per-microbatch gradient", "1 (each microbatch's mean loss), the token axes' division aside")),
        f"the {group} gradient on {c0} weights the microbatches {shown}; the global-batch mean weights each "
        f"{_frac(right)}",
        (f"the schedule scales the accumulated gradient buffer by 1/{M} after every round (override at line "
         f"{o.span.line}), so an earlier round is scaled again by every later one: round r of {m // M} is "
         f"weighted 1/(A·M^(A−r+1)); scale each round's losses instead, or the buffer once",),
        ctx.command(sizes))
