"""Time within a step: nested accumulation, a pipeline schedule's own microbatch accumulation
inside an outer gradient accumulation.

Input: a plan (its ``accumulation`` override), its step model and replay context. Output: the
located errors of a statement the step cannot read (``check_override``), each group's divisor as
the two levels apply it (``apply``), and the gradient obligations wrapped (``wrap``) with the
configuration's side condition and, for a rescaled buffer, the violation and its concrete replay
(``nested_replay``).

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
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import views
from ..ir.overrides import OverrideTarget, OverrideVerb
from .dims import MICROBATCHES, NORMALISATION

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
        raise bad(Code.NESTED_ACCUMULATION, "the accumulation is the whole step's; it names no parameter group")
    if not views.view(plan).axes_with_role(ir.Role.PIPELINE) and plan.schedule is None:
        raise bad(Code.NESTED_ACCUMULATION, "the plan has no pipeline schedule, so there is no inner accumulation (its "
                  "microbatches are the step's gradient accumulation: state a divisor with grads: divide by)")
    if loss != "per_microbatch_mean":
        raise bad(Code.NESTED_ACCUMULATION, "the levels divide a per-microbatch mean loss (write override loss: per_microbatch_mean; "
                  "a token-normalised loss is divided by the step's tokens, not by the rounds)")
    div = next((x for x in plan.overrides if x.target == OverrideTarget.GRADS and x.verb == OverrideVerb.DIVIDE), None)
    if div is not None:
        raise bad(Code.NESTED_ACCUMULATION, f"the divisor is stated at line {div.span.line} as well (override grads: divide by); "
                  "state it once")
    if any(x.target == OverrideTarget.GRADS and x.verb == OverrideVerb.NO_ACCUMULATION_BUFFER for x in plan.overrides):
        raise bad(Code.NESTED_ACCUMULATION, "without an accumulation buffer no round is accumulated into the next")
    mv, m = _const(o.by), plan.model.microbatches
    if mv is not None and (mv.denominator != 1 or mv < 1):
        raise bad(Code.NESTED_ACCUMULATION, "M, the schedule's microbatches per round, is a positive integer")
    if mv is not None and isinstance(m, ir.Const) and m.value % mv != 0:
        raise bad(Code.NESTED_ACCUMULATION, f"the step's microbatches ({m.value}) are not a whole number of rounds of {mv}")
    if mv == 1 and o.verb != OverrideVerb.OUTER_UNDIVIDED:
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: a schedule of one microbatch has "
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
        extra = [ir.Op("/", (ir.Sym(MICROBATCHES), o.by))] if o.verb == OverrideVerb.INNER_UNDIVIDED else [o.by]
        terms = axes + extra
        value = terms[0] if len(terms) == 1 else ir.Op("*", tuple(terms))
        out.append(replace(g, divisor_value=value, span=o.span,
                           spans=tuple((k, o.span if k == NORMALISATION else s) for k, s in g.spans)))
    return out
