"""Time within a step: the accumulating gradient buffer all-reduced with a sum, in place, after every micro-step.

Input: the obligations of a plan, its step model and replay context. Output: the whole-plan gradient integrity
(``GI grads[g]``) and the accumulation aspect (``GI grads[g] over microbatches``) of every group whose gradient
is all-reduced over an axis, wrapped so that the repeated sum refutes them, each with a concrete replay of the
m micro-steps; PL506 where the statement changes nothing and PL298 where it contradicts another statement of
the reduction after every micro-step (``check_override``).

``override grads: reduce_summed_every_microbatch`` states that backward keeps adding into the local buffer and
that, after every micro-step, the whole buffer is all-reduced with a sum (no division) and the result written
back into it (NVIDIA/Megatron-LM#6660: the gradient doubled per accumulation step at a group of two; a manual
``dist.all_reduce(p.grad)`` inside the accumulation loop). After the reduction every rank of the n ranks holds
the sum, so the next micro-step's reduction sums n copies of it: after micro-step k every rank holds
n·(held after k - 1) + S_k, where S_k is micro-step k's gradient summed over the ranks, and the update reads
sum over k of n^(m - k) S_k: micro-step k's gradient multiplied by n^(m - k). It is wrong wherever m >= 2 and
n >= 2 (n the product of the sizes of the axes the group's replicated gradient is reduced over); at n = 1 or
m = 1 the sum leaves the buffer as it is and the verdict is the one without the statement. Every rank holds
the same value, so replica consistency, the norm's agreement and the overflow decision stay proved. With a
mean the reduction in place is correct: that is ``grads: reduce_every_microbatch``.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import steps
from .encode_time import summed_in_place
from .microsteps import early_axes
from .obligation import Obligation
from .replay import Context, _frac
from .report import Counterexample, coords_text
from .rules import GRADIENT_INTEGRITY

VERB = OverrideVerb.REDUCE_SUMMED_EVERY_MICROBATCH
KIND = "summed_in_place"
OTHERS = {OverrideVerb.REDUCE_EVERY_MICROBATCH: "averaged and written back into the buffer",
          OverrideVerb.REDUCE_ACCUMULATED_EVERY_MICROBATCH: "added into a separate accumulator",
          OverrideVerb.SYNC_BEFORE_LAST: "armed once, on a micro-step before the last"}


def statement(plan: ir.Plan | None) -> ir.Override | None:
    return next((o for o in (plan.overrides if plan is not None else ())
                 if o.target == OverrideTarget.GRADS and o.verb == VERB), None)


def _no_effect(o: ir.Override, why: str) -> DiagnosticError:
    name = f"grads{f'[{o.group}]' if o.group else ''}"
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"override {name}: {VERB} changes nothing: {why}", o.span)])


def check_override(plan: ir.Plan, groups) -> None:
    """PL506 where ``reduce_summed_every_microbatch`` changes nothing, PL298 beside another statement of the
    reduction after every micro-step."""
    o = statement(plan)
    if o is None:
        return
    if o.group not in (None, "all"):
        raise _no_effect(o, f"the gradient buffer is reduced as one; it cannot be summed in place for '{o.group}' "
                            f"alone (write override grads: {VERB})")
    m = plan.model.microbatches
    if isinstance(m, ir.Const) and m.value == 1:
        raise _no_effect(o, "the model has one microbatch per step (microbatches = 1), so the buffer is summed once, "
                            "as the derived step sums it")
    grads = plan.overrides_for(OverrideTarget.GRADS)
    freed = next((x for x in grads if x.verb == OverrideVerb.NO_ACCUMULATION_BUFFER), None)
    if freed is not None:
        raise _no_effect(o, f"with no accumulation buffer (override grads: no_accumulation_buffer, line "
                            f"{freed.span.line}) the buffer is freed after every reduction, so each reduction sums "
                            "the fresh micro-step's gradient once")
    other = next((x for x in grads if x.verb in OTHERS), None)
    if other is not None:
        raise DiagnosticError([Diagnostic(
            Code.MICROSTEP_REDUCE_CONFLICT,
            f"override grads: {VERB} contradicts override grads: {other.verb} (line {other.span.line}): the buffer's "
            f"reduction is either summed in place after every micro-step or {OTHERS[other.verb]}, not both", o.span)])
    if not any(early_axes(plan, g) for g in groups):
        raise _no_effect(o, "no gradient is all-reduced over an axis (every reduced gradient is sharded there and "
                            "reduce-scattered into its own shard)")


def wrap(obs: list, step: steps.StepModel, ctx: Context, plan: ir.Plan | None) -> list:
    """Add the repeated sum to the whole-plan gradient integrity and the accumulation aspect of every group
    all-reduced over an axis."""
    o = statement(plan)
    if o is None:
        return obs
    check_override(plan, step.groups)
    affected = {g.group: early_axes(plan, g) for g in step.groups if early_axes(plan, g)}
    stated = set()
    for ob in obs:
        whole = ob.whole in affected and ob.name == f"GI grads[{ob.whole}]"
        aspect = ob.aspect_of in affected and ob.name == f"GI grads[{ob.aspect_of}] over microbatches"
        if whole or aspect:
            g = ob.whole if whole else ob.aspect_of
            stated |= {g} if aspect else set()
            ob.encode = summed_in_place(ob.encode, affected[g], ob.name)
            ob.replay = _replay(ob.replay, ctx, o.span.line, g, affected[g])
            ob.span = o.span
    return obs + [_aspect(g, axes, o, ctx) for g, axes in affected.items() if g not in stated]


def _aspect(group: str, axes, o: ir.Override, ctx: Context) -> Obligation:
    """``GI grads[g] over microbatches`` where the step states none for the group."""
    name = f"GI grads[{group}] over microbatches"
    return Obligation(
        name, GRADIENT_INTEGRITY, o.span,
        f"every micro-step's {group} gradient reaches the update once (each micro-step's gradient summed over the "
        "ranks once)",
        summed_in_place(lambda env: ([env.sess.false()], lambda model: None), axes, name),
        _replay(lambda w: None, ctx, o.span.line, group, axes), aspect_of=group)


def _replay(orig, ctx: Context, line: int, group: str, axes):
    def replay(w):
        if w.get("kind") != KIND:
            return orig(w)
        return replay_summed(ctx, w["sizes"], line, group, axes)
    return replay


def summed(parts: list[list[Fraction]]) -> Fraction:
    """What every rank holds after the m micro-steps: ``parts[k][r]`` is rank r's gradient of micro-step k; each
    rank's buffer adds its part and is then replaced by the sum of all the ranks' buffers."""
    held = [Fraction(0)] * len(parts[0]) if parts else []
    for part in parts:
        total = sum(h + p for h, p in zip(held, part))
        held = [total] * len(part)
    return held[0] if held else Fraction(0)


def replay_summed(ctx: Context, sizes: dict[str, int], line: int, group: str, axes) -> Counterexample | None:
    """m >= 2 micro-steps, n >= 2 ranks over the reduced axes: micro-step 1's gradient 1/(n·m) on every rank (one
    token per rank and micro-step, per-token gradient 1), the later micro-steps' 0."""
    m = sizes.get(steps.MICROBATCHES, 1)
    n = 1
    for a in axes:
        n *= sizes.get(a, 1)
    if m < 2 or n < 2:
        return None
    share = Fraction(1, n * m)
    parts = [[share] * n] + [[Fraction(0)] * n for _ in range(m - 1)]
    held, want = summed(parts), sum(sum(p) for p in parts)
    if held == want:
        return None
    dev = coords_text(ctx.step.axes, [0] * len(ctx.step.axes))
    later = "micro-step 2" if m == 2 else f"micro-steps 2 … {m}"
    over = " × ".join(axes)
    later_r = "the later reduction" if m == 2 else f"each of the {m - 1} later reductions"
    return Counterexample(
        ctx.sizes_tuple(sizes), (("rank", dev),),
        (("per-token gradient", f"{group}[0] = 1 in micro-step 1, 0 in {later}, one token per rank and micro-step "
                                f"on each of the n = {n} ranks over {over} (token count {n * m})"),),
        f"the {group} gradient the update reads on {dev} = {n}^{m - 1} × {_frac(want)} = {_frac(held)} (micro-step 1 "
        f"summed over the ranks, then multiplied by {n} at {later_r}), but the "
        f"global-batch gradient is {n} × {_frac(share)} = {_frac(want)}",
        (f"the accumulating {group} gradient buffer is all-reduced with a sum in place after every micro-step "
         f"(override at line {line}: {VERB}): every rank holds the sum, and the next reduction sums n copies of it, "
         "so micro-step k's gradient is multiplied by n^(m - k)",),
        ctx.command(sizes))
