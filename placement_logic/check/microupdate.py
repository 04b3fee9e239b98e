"""Time within a step: an optimizer update taken after every micro-step instead of once per step.

Input: the obligations of a plan, its step model and replay context. Output: the whole-plan gradient
integrity (``GI grads[g]``) of every gradient group an ``override optimizer[G]: step_every_microbatch``
reaches, wrapped so that the per-micro-step updates refute it, the aspect that names the defect
(``GI grads[g] update over microbatches``, stated only for those groups), each with a concrete replay of
the m updates, and PL506 where the statement changes nothing (``check_override``: one micro-step).

The derived step takes one optimizer update per step, after the last micro-step, from the gradient
accumulated over all m micro-steps: single-device training on the global batch. ``step_every_microbatch``
states that G's update runs after every micro-step's backward from that micro-step's gradient alone (its
share 1/m of the step's mean loss), the optimizer state advanced m times: ZeRO-3 applying Muon in every
micro-step's reduce epilogue (deepspeedai/DeepSpeed#8443), ``optimizer.step()`` outside the accumulation
condition. No optimizer the checker models makes m such updates equal to the one: for SGD the update is
linear in the gradient, but micro-step k's forward reads the parameters the k - 1 earlier updates moved,
so its gradient is another one wherever the loss is not linear in them; every other algorithm (Adam,
AdamW, Lion, Adafactor, Muon, Shampoo, SOAP, Dion) normalises the update, so the update of a partial
gradient is as long as the update of the whole one, and m of them move m times as far. The replay shows
both: plain SGD on a quadratic loss, and the algorithm's own update of a constant gradient (a linear loss),
computed in exact rationals.
"""

from __future__ import annotations

from fractions import Fraction
from math import isqrt

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import groups as pg
from ..ir import optimizers as opt
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import steps
from .encode_time import update_per_microstep
from .matrixwise import newton_schulz
from .obligation import Obligation
from .replay import Context, _frac
from .report import Counterexample, coords_text
from .rules import GRADIENT_INTEGRITY

VERB = OverrideVerb.STEP_EVERY_MICROBATCH
KIND = "update_per_microstep"
BETA1, BETA2 = Fraction(9, 10), Fraction(999, 1000)  # Adam's and Lion's defaults (Lion: β2 0.99, below)


def statements(plan: ir.Plan | None) -> list[ir.Override]:
    return [o for o in (plan.overrides if plan is not None else ())
            if o.target == OverrideTarget.OPTIMIZER and o.verb == VERB]


def _reaches(o: ir.Override, p) -> bool:
    return o.group in (None, "all", p.name) or (o.group == "matrices" and p.name in opt.MATRIX_GROUPS)


def stepped(plan: ir.Plan | None, classes) -> dict[str, tuple[ir.Override, opt.Choice]]:
    """Each gradient group whose update runs every micro-step: the statement and the algorithm. A statement
    without a group (or ``all``) reaches every gradient group; one naming parameter groups reaches the
    gradient groups they are checked as."""
    out: dict[str, tuple[ir.Override, opt.Choice]] = {}
    for o in statements(plan):
        for c in classes:
            if o.group in (None, "all"):
                members = [p for p in pg.param_groups(plan.model) if p.name == c or p.checks_as == c]
                out.setdefault(c, (o, opt.choice(plan, members[0].name if members else c)))
                continue
            for p in pg.param_groups(plan.model):
                if (p.name == c or (p.checks_as == c and not p.user)) and _reaches(o, p):
                    out.setdefault(c, (o, opt.choice(plan, p.name)))
    return out


def check_override(plan: ir.Plan) -> None:
    """PL242 where the statement names a parameter group the model lacks (as resolve does, for a plan that did not
    come through it: it would reach no gradient group and change nothing silently); PL506 where
    ``step_every_microbatch`` changes nothing: one micro-step per step."""
    names = [p.name for p in pg.param_groups(plan.model)]
    for o in statements(plan):
        if o.group == "matrices" and not any(g in opt.MATRIX_GROUPS for g in names):
            raise DiagnosticError([Diagnostic(Code.OPTIMIZER_GROUP, "the model has no weight matrix group ('matrices': "
                                              f"{', '.join(opt.MATRIX_GROUPS)})", o.span)])
        if o.group not in (None, "all", "matrices") and o.group not in names:
            raise DiagnosticError([Diagnostic(Code.OPTIMIZER_GROUP, f"the model has no parameter group '{o.group}' "
                                              f"(its groups: {', '.join(names)})", o.span)])
    o = next(iter(statements(plan)), None)
    m = plan.model.microbatches
    if o is not None and isinstance(m, ir.Const) and m.value == 1:
        name = f"optimizer{f'[{o.group}]' if o.group else ''}"
        raise DiagnosticError([Diagnostic(
            Code.OVERRIDE_NO_EFFECT,
            f"override {name}: {VERB} changes nothing: the model has one microbatch per step (microbatches = 1), "
            "so the update after the only micro-step is the step's one update", o.span)])


def wrap(obs: list, step: steps.StepModel, ctx: Context, plan: ir.Plan | None) -> list:
    """Add the per-micro-step updates to the whole-plan gradient integrity of every group they reach."""
    if plan is None or not statements(plan):
        return obs
    check_override(plan)
    each = stepped(plan, [g.group for g in step.groups])
    for ob in obs:
        if ob.whole in each and ob.name == f"GI grads[{ob.whole}]":
            o, c = each[ob.whole]
            ob.encode = update_per_microstep(ob.encode, ob.name)
            ob.replay = _replay(ob.replay, ctx, o.span.line, ob.whole, c)
            ob.span = o.span
    return obs + [_aspect(g, o, c, ctx) for g, (o, c) in each.items()]


def _aspect(group: str, o: ir.Override, c: opt.Choice, ctx: Context) -> Obligation:
    """``GI grads[g] update over microbatches``: one update per step, from the gradient of all m micro-steps.
    Stated only for a group the plan updates every micro-step, so its negation holds wherever m >= 2."""
    name = f"GI grads[{group}] update over microbatches"
    return Obligation(
        name, GRADIENT_INTEGRITY, o.span,
        f"the {group} parameters take one {c.text()} update per step, from the gradient accumulated over every "
        "micro-step (as single-device training on the global batch)",
        update_per_microstep(lambda env: ([env.sess.false()], lambda model: None), name),
        _replay(lambda w: None, ctx, o.span.line, group, c), aspect_of=group)


def _replay(orig, ctx: Context, line: int, group: str, c: opt.Choice):
    def replay(w):
        if w.get("kind") != KIND:
            return orig(w)
        return replay_updates(ctx, w["sizes"], line, group, c)
    return replay


def _sqrt(x: Fraction) -> Fraction:
    """The exact square root of a rational square (the replays' second moments are squares)."""
    n, d = isqrt(x.numerator), isqrt(x.denominator)
    if n * n != x.numerator or d * d != x.denominator:
        raise ValueError(f"{x} is not a rational square")
    return Fraction(n, d)


def sgd_run(m: int, per_microstep: bool) -> Fraction:
    """Plain SGD (lr 1) of one element from θ = 0 on m micro-steps whose losses are (θ - x_k)² / 2, x_1 = 1
    and the others 0, each weighted 1/m: one update from the summed gradient, or one after each micro-step
    from that micro-step's gradient at the parameters the earlier updates left. Returns the final θ."""
    xs = [Fraction(1)] + [Fraction(0)] * (m - 1)
    theta = Fraction(0)
    if not per_microstep:
        return theta - sum((theta - x) / m for x in xs)
    for x in xs:
        theta -= (theta - x) / m
    return theta


def normalised_run(c: opt.Choice, m: int, per_microstep: bool) -> Fraction:
    """``c``'s update (lr 1, no weight decay, θ = 0, fresh state) of one element whose per-token gradient is 1 in
    every micro-step (a linear loss: the gradient does not move with θ), each micro-step's weighted 1/m: one
    update from the sum, or m from each share. Adam's family (AdamW, Adafactor, SOAP's and Shampoo's
    bias-corrected moving averages) with ε = 0, Lion's interpolated sign, Muon's Newton–Schulz of the
    normalised momentum (a 1×1 matrix, in units of its image of [1]), Dion's orthonormal factor (the sign).
    Returns the final θ."""
    grads = [Fraction(1, m)] * m if per_microstep else [Fraction(1)]
    theta, m1, v, t = Fraction(0), Fraction(0), Fraction(0), 0
    for g in grads:
        t += 1
        if c.algorithm == "lion":
            d = BETA1 * m1 + (1 - BETA1) * g
            m1 = Fraction(99, 100) * m1 + Fraction(1, 100) * g
            theta -= (d > 0) - (d < 0)
        elif c.algorithm == "muon":  # measured in units of Newton–Schulz's image of the 1×1 matrix [1]
            m1 = Fraction(95, 100) * m1 + g
            k = c.arg("ns_steps") or 5
            theta -= newton_schulz([[m1]], k)[0][0] / newton_schulz([[Fraction(1)]], k)[0][0]
        elif c.algorithm == "dion":
            m1 = Fraction(95, 100) * m1 + g
            theta -= (m1 > 0) - (m1 < 0)
        else:
            m1 = BETA1 * m1 + (1 - BETA1) * g
            v = BETA2 * v + (1 - BETA2) * g * g
            theta -= (m1 / (1 - BETA1 ** t)) / _sqrt(v / (1 - BETA2 ** t))
    return theta


def replay_updates(ctx: Context, sizes: dict[str, int], line: int, group: str, c: opt.Choice) -> Counterexample | None:
    """m >= 2 micro-steps, every rank holding the same tokens (so every reduction leaves the local mean): the
    element's final value after one update and after m, in exact rationals."""
    m = sizes.get(steps.MICROBATCHES, 1)
    if m < 2:
        return None
    sgd = c.algorithm == "sgd"
    once, each = ((sgd_run(m, False), sgd_run(m, True)) if sgd else
                  (normalised_run(c, m, False), normalised_run(c, m, True)))
    if once == each:
        return None
    dev = coords_text(ctx.step.axes, [0] * len(ctx.step.axes))
    data = ((("loss of micro-step k", f"(θ - x_k)² / 2 per token, x_1 = 1, {'x_2' if m == 2 else f'x_2 … x_{m}'} = 0 (the same tokens on "
              "every rank)"), ("optimizer", "sgd, no momentum, lr 1, θ = 0")) if sgd else
            (("per-token gradient", f"{group}[0] = 1 in every micro-step (a linear loss; the same tokens on every "
              "rank)"), ("optimizer", f"{c.text()}, lr 1, no weight decay, ε 0, θ = 0, fresh state" + (
                  " (θ in units of Newton–Schulz's image of the 1×1 matrix [1])" if c.algorithm == "muon" else ""))))
    why = ("micro-step k's gradient is taken at the parameters the k - 1 earlier updates moved" if sgd else
           f"{c.algorithm} normalises its update: the update of each micro-step's share is as long as the "
           "update of the whole gradient")
    return Counterexample(
        ctx.sizes_tuple(sizes), (("rank", dev),), data,
        f"{group}[0] on {dev} after the step = {_frac(each)} ({m} updates), but one update from the accumulated "
        f"gradient gives {_frac(once)}",
        (f"the {group} update runs after every micro-step (override at line {line}: step_every_microbatch), "
         f"each from that micro-step's gradient, the optimizer state advanced {m} times: {why}",),
        ctx.command(sizes))
