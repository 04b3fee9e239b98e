"""The aux-loss-free routing bias (DeepSeek-V3's load-balancing correction; the model flag ``router_bias``):
after each step every rank moves expert e's bias by u · sign(mean - count_e), the counts the top-k choices
of the step's tokens per expert (docs/semantics.md, "The routing bias").

The bias is a router buffer, replicated on every rank. The single device counts the global batch's tokens;
a rank counts the tokens it holds, and the plan states which axes its code sums the counts over before the
update (``override router: counts_reduce over (AXES)``; derived: every axis whose ranks hold different tokens:
data, context, expert, and the tensor axes under sequence parallelism, where each rank routes its own slice).
Along an axis left out of the sum, two ranks count different tokens, move the same expert's bias by
different steps (the replicas drift apart), and neither moves it as the single device does. Summing over an
axis whose ranks hold the same tokens (a tensor axis without sequence parallelism) multiplies every count by
its size, which the sign cannot see.

``SC router bias`` holds when no left-out axis has two or more ranks: the negation asks z3 for one (free sizes
stay free). The replay takes E experts (the model's; 2 where free), each rank holding 2 routed tokens (top-1):
rank 0 of the axis sends both to expert 0, rank 1 both to expert 1, every other rank of the axis one to each;
the ranks of the other axes hold the same counts as their coordinate on the axis (the stated sums multiply
every count alike). The update is recomputed without the solver from these counts, on ranks 0 and 1 and on the
single device (the counts summed over the axis).

Input: the plan. Output: the obligation where the plan states the counts (none otherwise).
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..ir import router as stmt
from ..ir.walker import fold
from . import encode as en
from . import replay as rp
from .obligation import Obligation
from .report import Counterexample
from .rules import STATE_CONSISTENCY


def update(counts: list[Fraction]) -> list[int]:
    """The bias steps in units of u: sign(mean - count_e) per expert."""
    mean = sum(counts, Fraction(0)) / len(counts)
    return [(mean > c) - (mean < c) for c in counts]


def local_counts(rank: int, size: int, experts: int) -> list[Fraction]:
    """Rank ``rank``'s counts of its two tokens (module docstring)."""
    counts = [Fraction(0)] * experts
    if rank in (0, 1):
        counts[rank] = Fraction(2)
    else:
        counts[0] = counts[1] = Fraction(1)
    return counts


def _experts(plan: ir.Plan, bindings) -> int:
    tf = plan.model.transformer
    e = fold(tf.experts, bindings) if tf is not None else None
    return int(e) if e is not None and e >= 2 else 2


def replay(ctx: rp.Context, plan: ir.Plan, o, w: dict) -> Counterexample | None:
    axis, sizes = w["axis"], w["sizes"]
    n = sizes.get(axis, 1)
    if n < 2:
        return None
    e = _experts(plan, ctx.bindings)
    ranks = [local_counts(r, n, e) for r in range(n)]
    whole = [sum((c[x] for c in ranks), Fraction(0)) for x in range(e)]
    single, steps = update(whole), [update(ranks[r]) for r in (0, 1)]
    if all(s == single for s in steps) and steps[0] == steps[1]:
        return None
    cut, tail = (3, ", ...") if e > 4 else (e, "")  # past 4 experts: 2, ..., E - 1 alike, shown once
    show = lambda c: "(" + ", ".join(rp._frac(x) for x in c[:cut]) + tail + ")"  # noqa: E731
    signs = lambda s: "(" + ", ".join(f"{x:+d}·u" if x else "0" for x in s[:cut]) + tail + ")"  # noqa: E731
    others = f", the other {n - 2} rank(s) of {axis} one to each" if n > 2 else ""
    values = (("router", f"E = {e} experts, top-1; the bias moves by u·sign(mean - count_e) after the step"),
              ("tokens", f"every rank holds 2 tokens; rank 0 of {axis} routes both to expert 0, rank 1 both to "
                         f"expert 1{others}" + (f"; experts 2, ..., {e - 1} alike, shown once" if e > 4 else "")),
              ("single device", f"counts {show(whole)} (summed over the {n} ranks of {axis}): step {signs(single)}"))
    values += tuple((f"rank {r} of {axis}", f"counts {show(ranks[r])}: step {signs(steps[r])}") for r in (0, 1))
    bad = 0 if steps[0] != single else 1
    eq = (f"expert biases' step on rank {bad} of {axis} = {signs(steps[bad])}, on rank {1 - bad} = "
          f"{signs(steps[1 - bad])}, single-device = {signs(single)}")
    devices = tuple((f"rank {r}", f"{axis}={r}") for r in (0, 1))
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, tuple(diagnose(o, axis)), ctx.command(sizes))


def diagnose(o, axis: str) -> list[str]:
    said = f"(override router: counts_reduce over ({', '.join(o.axes or ())}) at line {o.span.line})"
    return [f"the root cause is the routing bias's token counts: they are not summed over {axis}, whose ranks hold "
            f"different tokens {said}",
            "each rank moves every expert's bias by the sign of its own tokens' counts against their mean: the "
            "replicas of the bias drift apart and none follows the global batch's counts; all-reduce the counts over "
            "every axis whose ranks hold different tokens before the update"]


def obligations(plan: ir.Plan | None, ctx: rp.Context) -> list[Obligation]:
    """``SC router bias`` where the plan states the counts (``override router: counts_reduce over (AXES)``)."""
    o = stmt.counts_stated(plan) if plan is not None else None
    tf = plan.model.transformer if plan is not None else None
    if o is None or tf is None or not tf.router_bias:
        return []
    missing = stmt.counts_missing(plan, o)
    return [Obligation(
        "SC router bias", STATE_CONSISTENCY, o.span,
        "every rank holding the routing bias moves each expert's bias by the same step, the single device's from the "
        "global batch's token counts (the counts summed over every axis whose ranks hold different tokens)",
        lambda env: en.axes_negation(env, "router_bias", [(a, env.sess.true()) for a in missing]),
        lambda w: replay(ctx, plan, o, w))]
