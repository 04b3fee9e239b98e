"""Time within a step: the accumulated gradient buffer reduced again after every micro-step.

Input: the obligations of a plan, its step model and replay context. Output: every group's whole-plan
gradient integrity (``GI grads[g]``) and the aspect that names the defect (``GI grads[g] over microbatches``:
every micro-step's gradient accumulated exactly once) wrapped so that the repeated reduction refutes them,
each with a concrete replay of the m micro-steps, PL506 where the statement changes nothing and PL298 where it
contradicts ``reduce_every_microbatch`` (``check_override``).

The derived step reduces each micro-step's fresh gradient once, or the accumulated buffer once per step:
either way micro-step k's gradient reaches the update once. ``override grads:
reduce_accumulated_every_microbatch`` states what ZeRO with gradient accumulation did before
hpcaitech/ColossalAI#247 was fixed: backward adds into the local gradient buffer, which is not cleared
after its reduction, and after every micro-step the whole buffer is reduced (all-reduced or reduce-scattered)
and the result added into a separate accumulator (the optimizer's reduced, often fp32, gradient). After
micro-step k the buffer holds the local gradients of micro-steps 1 … k, so the accumulator ends the step
holding sum over k of R(g_1 + … + g_k) = sum over j of (m - j + 1) R(g_j): micro-step j's gradient counted
m - j + 1 times. The reduction R is linear, so this holds alike for a sum and for a mean over the n ranks
(the mean divides every term by n once; it does not undo the repetition), and at every mesh size, a single
device included: the repetition is in time, not across ranks. Every rank's accumulator holds the same
(wrong) value, so replica consistency, the clip norm's agreement and the reductions' axes stay proved.
A reduction written back into the buffer itself with a mean (DDP without ``no_sync``) is the correct
``reduce_every_microbatch``. The statement changes nothing with one micro-step per step, or where the
buffer is freed after every reduction (``grads: no_accumulation_buffer``: the next backward writes a fresh
gradient); it applies to the whole gradient buffer, reduced as one.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import steps
from .encode_time import rereduced
from .obligation import Obligation
from .replay import Context, _frac
from .report import Counterexample, coords_text
from .rules import GRADIENT_INTEGRITY

VERB = OverrideVerb.REDUCE_ACCUMULATED_EVERY_MICROBATCH
KIND = "rereduced"


def statement(plan: ir.Plan | None) -> ir.Override | None:
    return next((o for o in (plan.overrides if plan is not None else ())
                 if o.target == OverrideTarget.GRADS and o.verb == VERB), None)


def _no_effect(o: ir.Override, why: str) -> DiagnosticError:
    name = f"grads{f'[{o.group}]' if o.group else ''}"
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"override {name}: {VERB} changes nothing: {why}", o.span)])


def check_override(plan: ir.Plan) -> None:
    """PL506 where ``reduce_accumulated_every_microbatch`` changes nothing, PL298 where it contradicts
    ``reduce_every_microbatch``."""
    o = statement(plan)
    if o is None:
        return
    if o.group not in (None, "all"):
        raise _no_effect(o, f"the gradient buffer is reduced as one; it cannot be re-reduced for '{o.group}' alone "
                            f"(write override grads: {VERB})")
    m = plan.model.microbatches
    if isinstance(m, ir.Const) and m.value == 1:
        raise _no_effect(o, "the model has one microbatch per step (microbatches = 1), so the buffer holds the only "
                            "micro-step's gradient when it is reduced")
    grads = plan.overrides_for(OverrideTarget.GRADS)
    none = next((x for x in grads if x.verb == OverrideVerb.NO_ACCUMULATION_BUFFER), None)
    if none is not None:
        raise _no_effect(o, f"with no accumulation buffer (override grads: no_accumulation_buffer, line "
                            f"{none.span.line}) the buffer is freed after every reduction, so each reduction "
                            "reads the fresh micro-step's gradient")
    every = next((x for x in grads if x.verb in (OverrideVerb.REDUCE_EVERY_MICROBATCH,
                                                  OverrideVerb.REDUCE_SUMMED_EVERY_MICROBATCH)), None)
    if every is not None:
        raise DiagnosticError([Diagnostic(
            Code.MICROSTEP_REDUCE_CONFLICT,
            f"override grads: {VERB} contradicts override grads: {every.verb} (line {every.span.line}): "
            "the buffer's reduction after every micro-step is written either back into the buffer or into a "
            "separate accumulator, not both", o.span)])


def wrap(obs: list, step: steps.StepModel, ctx: Context, plan: ir.Plan | None) -> list:
    """Add the repeated reduction to every group's whole-plan gradient integrity and to its accumulation
    aspect (``GI grads[g] over microbatches``: every micro-step's gradient accumulated exactly once)."""
    o = statement(plan)
    if o is None:
        return obs
    check_override(plan)
    groups = [g.group for g in step.groups]
    stated = set()
    for ob in obs:
        whole = ob.whole in groups and ob.name == f"GI grads[{ob.whole}]"
        aspect = ob.aspect_of in groups and ob.name == f"GI grads[{ob.aspect_of}] over microbatches"
        if whole or aspect:
            g = ob.whole if whole else ob.aspect_of
            stated |= {g} if aspect else set()
            ob.encode = rereduced(ob.encode, ob.name)
            ob.replay = _replay(ob.replay, ctx, o.span.line, g)
            ob.span = o.span
    return obs + [_aspect(g, o, ctx) for g in groups if g not in stated]


def _aspect(group: str, o: ir.Override, ctx: Context) -> Obligation:
    """``GI grads[g] over microbatches`` where the step states none for the group: every micro-step's gradient
    reaches the update once."""
    name = f"GI grads[{group}] over microbatches"
    return Obligation(
        name, GRADIENT_INTEGRITY, o.span,
        f"every micro-step's {group} gradient reaches the update once (each reduction reads the fresh "
        "micro-step's gradient, or the accumulated buffer is reduced once per step)",
        rereduced(lambda env: ([env.sess.false()], lambda model: None), name),
        _replay(lambda w: None, ctx, o.span.line, group), aspect_of=group)


def _replay(orig, ctx: Context, line: int, group: str):
    def replay(w):
        if w.get("kind") != KIND:
            return orig(w)
        return replay_rereduced(ctx, w["sizes"], line, group)
    return replay


def accumulated(shares: list[Fraction]) -> Fraction:
    """The separate accumulator after the m micro-steps: the local buffer adds micro-step k's share and is
    reduced (here: every rank holds the same share, so the reduction leaves it) and added in every time."""
    buffer, acc = Fraction(0), Fraction(0)
    for s in shares:
        buffer += s
        acc += buffer
    return acc


def replay_rereduced(ctx: Context, sizes: dict[str, int], line: int, group: str) -> Counterexample | None:
    """m >= 2 micro-steps of one token per rank, the same tokens on every rank: micro-step 1's per-token
    gradient 1, the others' 0, each micro-step's share 1/m of the step's mean."""
    m = sizes.get(steps.MICROBATCHES, 1)
    if m < 2:
        return None
    shares = [Fraction(1, m)] + [Fraction(0)] * (m - 1)
    held, want = accumulated(shares), sum(shares)
    if held == want:
        return None
    dev = coords_text(ctx.step.axes, [0] * len(ctx.step.axes))
    later = "micro-step 2" if m == 2 else f"micro-steps 2 … {m}"
    return Counterexample(
        ctx.sizes_tuple(sizes), (("rank", dev),),
        (("per-token gradient", f"{group}[0] = 1 in micro-step 1, 0 in {later} (the same tokens on every rank)"),),
        f"the {group} gradient the update reads on {dev} = {m} × {_frac(shares[0])} = {_frac(held)} (micro-step 1 "
        f"counted {m} times), but the global-batch gradient is {_frac(want)}",
        (f"the accumulated {group} gradient buffer is reduced again after every micro-step and added into a separate "
         f"accumulator (override at line {line}: {VERB}): micro-step k's gradient is counted m - k + 1 times",),
        ctx.command(sizes))
