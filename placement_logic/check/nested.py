"""Time within a step: nested accumulation, a pipeline schedule's own microbatch accumulation
inside an outer gradient accumulation.

Input: a plan (its ``accumulation`` override), its step model and replay context. Output: the
located errors of a statement the step cannot read (``check_override``), each group's divisor as
the two levels apply it (``apply``), and the gradient obligations wrapped (``wrap``) with the
configuration's side condition and, for a rescaled buffer, the violation and its concrete replay.

``override accumulation: VERB by M`` states that the step's m microbatches run as A = m / M rounds
of a pipeline schedule of M microbatches each (DeepSpeed's PipelineEngine, PyTorch's pipeline
schedules inside an outer gradient-accumulation loop), with a per-microbatch mean loss. The derived
step weights every microbatch's mean 1 / m (with the token axes' sizes): the schedule divides by M,
the outer loop by A. The verbs say what a real system does instead:

- ``outer_undivided``: the outer loop divides by nothing, so the rounds are summed: each
  microbatch weighted 1 / M (wrong when A ≥ 2);
- ``inner_undivided``: the schedule sums its microbatches (no division by M: ``scale_grads`` off,
  or an engine that sums its micro-batches) and the outer loop divides by its rounds: each
  microbatch weighted 1 / A (wrong when M ≥ 2);
- ``rescaled_every_round``: the schedule scales the *accumulated* gradient buffer by 1 / M at the end
  of every round (``scale_grads`` on a buffer that keeps the earlier rounds): round r of A is
  weighted 1 / (A·M^(A−r+1)), not 1 / (A·M) (wrong when A ≥ 2 and M ≥ 2).

The first two are divisors and enter the group's divisor (so the usual obligations and replays
judge them exactly, cancellations included); the third weights microbatches unequally, which no
divisor or reduction can undo, and is added to the gradient obligations as a violation of its own.
Every wrapped obligation holds m a multiple of M, the configuration's condition.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError
from .dims import MICROBATCHES, NORMALISATION
from .encode_partial import nested_rounds

TARGET = "accumulation"
DIVISORS = ("outer_undivided", "inner_undivided")
RESCALED = "rescaled_every_round"


def nested_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == TARGET), None)


def _const(v: ir.Value) -> Fraction | None:
    return v.value if isinstance(v, ir.Const) else None


def check_override(plan: ir.Plan, loss: str) -> None:
    """PL171 where the statement cannot describe the step; PL506 where it changes nothing."""
    o = nested_override(plan)
    if o is None:
        return
    head = f"override accumulation: {o.verb} by {ir.show(o.by)}"

    def bad(code: str, why: str) -> DiagnosticError:
        return DiagnosticError([Diagnostic(code, f"{head}: {why}", o.span)])
    if o.group is not None:
        raise bad("PL171", "the accumulation is the whole step's; it names no parameter group")
    if not plan.axes_with_role(ir.Role.PIPELINE) and plan.schedule is None:
        raise bad("PL171", "the plan has no pipeline schedule, so there is no inner accumulation (its "
                  "microbatches are the step's gradient accumulation: state a divisor with grads: divide by)")
    if loss != "per_microbatch_mean":
        raise bad("PL171", "the levels divide a per-microbatch mean loss (write override loss: per_microbatch_mean; "
                  "a token-normalised loss is divided by the step's tokens, not by the rounds)")
    div = next((x for x in plan.overrides if x.target == "grads" and x.verb == "divide"), None)
    if div is not None:
        raise bad("PL171", f"the divisor is stated at line {div.span.line} as well (override grads: divide by); "
                  "state it once")
    if any(x.target == "grads" and x.verb == "no_accumulation_buffer" for x in plan.overrides):
        raise bad("PL171", "without an accumulation buffer no round is accumulated into the next")
    mv, m = _const(o.by), plan.model.microbatches
    if mv is not None and (mv.denominator != 1 or mv < 1):
        raise bad("PL171", "M, the schedule's microbatches per round, is a positive integer")
    if mv is not None and isinstance(m, ir.Const) and m.value % mv != 0:
        raise bad("PL171", f"the step's microbatches ({m.value}) are not a whole number of rounds of {mv}")
    if mv == 1 and o.verb != "outer_undivided":
        raise DiagnosticError([Diagnostic("PL506", f"{head} changes nothing: a schedule of one microbatch has "
                                          "nothing to divide or rescale", o.span)])


def apply(plan: ir.Plan, groups: list) -> list:
    """Each group's divisor where the two levels divide wrongly (``outer_undivided``,
    ``inner_undivided``): the token axes' sizes times M, or times the rounds m / M."""
    o = nested_override(plan)
    if o is None or o.verb not in DIVISORS:
        return groups
    out = []
    for g in groups:
        axes = [ir.Sym(a) for a in g.divisor_axes if a != MICROBATCHES]
        extra = [ir.Op("/", (ir.Sym(MICROBATCHES), o.by))] if o.verb == "inner_undivided" else [o.by]
        terms = axes + extra
        value = terms[0] if len(terms) == 1 else ir.Op("*", tuple(terms))
        out.append(replace(g, divisor_value=value, span=o.span,
                           spans=tuple((k, o.span if k == NORMALISATION else s) for k, s in g.spans)))
    return out


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
    from .values import fold, resolver

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
    what = {"outer_undivided": "the outer accumulation divides by nothing, so its rounds are summed: each "
                               f"microbatch's mean is divided by {ir.show(o.by)} (the schedule's count) only",
            "inner_undivided": f"the pipeline schedule sums its {ir.show(o.by)} microbatches without dividing by "
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
    from .replay import _frac, coords_text
    from .report import Counterexample

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
