"""Time across steps: the gradient buffer an optimizer step reads, when it is not cleared between steps.

Input: the obligations of a plan, its step model and replay context. Output: every named group's
whole-plan gradient integrity (``GI grads[g]``) wrapped so that a buffer carried over from the previous
step refutes it, the aspect that names the defect (``GI grads[g] across steps``, stated only where the
plan says ``no_zero_grad``), each with a concrete replay of two steps, and PL506 where the statement
changes nothing (``check_override``).

The derived step clears each gradient buffer after the optimizer step (``zero_grad``), so the next
step's update reads that step's accumulated gradient only. ``override grads[g]: no_zero_grad`` states
that g's buffer is never cleared (zero_grad skipped, or called on an optimizer that does not hold g):
backward adds into what the buffer already holds, and step t's update reads the sum of the gradients of
steps 1 … t. From the second step on that is not the global-batch gradient whenever an earlier step's
gradient is nonzero, at every mesh size and on every rank alike: the replicas stay consistent (every
rank carries the same reduced gradient), the norm and the overflow decision are taken of the same wrong
sum everywhere, and the reductions and the divisor of the step itself are unchanged (their aspects stay
proved). Without an accumulation buffer (``grads: no_accumulation_buffer``) each micro-step's gradient
overwrites the buffer, the carried one included, and the statement changes nothing (PL506).
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import steps
from .encode_time import stale_buffer
from .obligation import Obligation
from .replay import Context, _frac
from .report import Counterexample, coords_text
from .rules import GRADIENT_INTEGRITY

VERB = OverrideVerb.NO_ZERO_GRAD


def carried(plan: ir.Plan | None, groups) -> dict[str, ir.Override]:
    """Each group whose buffer is not cleared between steps, with the statement that says so."""
    out: dict[str, ir.Override] = {}
    for o in (plan.overrides if plan is not None else ()):
        if o.target == OverrideTarget.GRADS and o.verb == VERB:
            for g in groups:
                if o.group in (None, "all", g):
                    out.setdefault(g, o)
    return out


def check_override(plan: ir.Plan) -> None:
    """PL506 where ``no_zero_grad`` changes nothing: the buffer is overwritten by every micro-step."""
    o = next((x for x in plan.overrides if x.target == OverrideTarget.GRADS and x.verb == VERB), None)
    if o is None:
        return
    none = next((x for x in plan.overrides if x.target == OverrideTarget.GRADS
                 and x.verb == OverrideVerb.NO_ACCUMULATION_BUFFER), None)
    if none is not None:
        name = f"grads{f'[{o.group}]' if o.group else ''}"
        raise DiagnosticError([Diagnostic(
            Code.OVERRIDE_NO_EFFECT,
            f"override {name}: {VERB} changes nothing: with no accumulation buffer (override grads: "
            f"no_accumulation_buffer, line {none.span.line}) every micro-step's gradient overwrites the buffer, "
            "the previous step's included", o.span)])


def wrap(obs: list, step: steps.StepModel, ctx: Context, plan: ir.Plan | None) -> list:
    """Add the carried-over buffer to the whole-plan gradient integrity of every group it names."""
    if plan is None:
        return obs
    check_override(plan)
    stale = carried(plan, [g.group for g in step.groups])
    for ob in obs:
        if ob.whole in stale and ob.name == f"GI grads[{ob.whole}]":
            o = stale[ob.whole]
            ob.encode = stale_buffer(ob.encode, ob.name)
            ob.replay = _replay(ob.replay, ctx, o.span.line, ob.whole)
            ob.span = o.span
    return obs + [_aspect(g, o, ctx) for g, o in stale.items()]


def _aspect(group: str, o: ir.Override, ctx: Context) -> Obligation:
    """``GI grads[g] across steps``: the buffer an update reads holds that step's gradient only. Stated
    only for a group the plan leaves uncleared, so its negation (the carried buffer) always holds."""
    name = f"GI grads[{group}] across steps"
    return Obligation(
        name, GRADIENT_INTEGRITY, o.span,
        f"the {group} gradient buffer an update reads holds that step's gradient only (cleared after every "
        "optimizer step)",
        stale_buffer(lambda env: ([env.sess.false()], lambda model: None), name),
        _replay(lambda w: None, ctx, o.span.line, group), aspect_of=group)


def _replay(orig, ctx: Context, line: int, group: str):
    def replay(w):
        if w.get("kind") != "stale_buffer":
            return orig(w)
        return replay_stale(ctx, w["sizes"], line, group)
    return replay


def replay_stale(ctx: Context, sizes: dict[str, int], line: int, group: str) -> Counterexample | None:
    """Two optimizer steps of one token per rank and micro-step: step 1's global-batch gradient of the
    element is 1, step 2's is 0; the buffer step 2's update reads still holds step 1's."""
    step1, step2 = Fraction(1), Fraction(0)
    held = step1 + step2  # backward adds into the uncleared buffer
    if held == step2:
        return None
    dev = coords_text(ctx.step.axes, [0] * len(ctx.step.axes))
    return Counterexample(
        ctx.sizes_tuple(sizes), (("rank", dev),),
        (("global-batch gradient of step 1", f"{group}[0] = {_frac(step1)}"),
         ("global-batch gradient of step 2", f"{group}[0] = {_frac(step2)}")),
        f"the {group} gradient that step 2's update reads on {dev} = {_frac(step1)} + {_frac(step2)} = "
        f"{_frac(held)}, but step 2's global-batch gradient is {_frac(step2)}",
        (f"the {group} gradient buffer is not cleared after step 1's update (override at line {line}: "
         "zero_grad skipped): step 2's backward adds into step 1's gradient, and every later update reads the "
         "sum of all earlier steps' gradients",),
        ctx.command(sizes))
