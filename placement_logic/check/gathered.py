"""The loss computed on the sequence gathered over context axes: ``override loss: on_gathered_sequence
over (AXES)``.

Input: a plan (its context axes, its loss normalisation, its token-count statement). Output: the axes
the loss is gathered over, the token dimensions the loss normaliser sums and the divisor's axes
(``normalisation``, read by ``steps``), and the statement's diagnostics (``check_override``: PL292,
PL293, PL506).

Under Ulysses (or ring) context parallelism a system may gather the model's per-token outputs over
the context group before the loss (verl's ``gather_outputs_and_unpad``, Megatron-DeepSpeed's
sequence-parallel cross entropy): every rank of AXES then computes the loss of the whole sequence,
and its local token count is the whole sequence's, the same on every rank of AXES. The gather's
backward keeps each rank's own shard of the incoming gradient, so each rank's gradient is still
that of its own tokens, divided by its (whole) count: the gradient reductions are those derived.
The count is already summed over AXES, as if reduced over them once before any all-reduce; a
statement ``tokens: reduce over (...)`` naming an axis of AXES sums it a second time, which
multiplies it by the axis's size (every token counted that many times, the loss and the gradient
that many times too small). The derived count is then reduced over the other token axes only, and
a per-device or per-microbatch mean divides by the other token axes' sizes only.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from .dims import MICROBATCHES

VERB = OverrideVerb.ON_GATHERED_SEQUENCE
# the per-rank variants of a count that the gather makes whole: each would act on the gathered count,
# which the step semantics does not model (PL293)
UNMODELLED = (OverrideVerb.CLAMP_BEFORE_REDUCE, OverrideVerb.EPS_BEFORE_REDUCE, OverrideVerb.COUNT_IGNORED,
              OverrideVerb.IGNORED_IN_LOSS)


def stated(plan: ir.Plan) -> ir.Override | None:
    """The plan's last ``loss: on_gathered_sequence`` statement (the main loss's)."""
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.LOSS and o.verb == VERB
                 and o.group is None), None)


def axes(plan: ir.Plan) -> tuple[str, ...]:
    """The axes the loss is computed on the gathered sequence over; () without the statement."""
    o = stated(plan)
    return tuple(dict.fromkeys(o.axes or ())) if o is not None else ()


def is_path(o: ir.Override) -> bool:
    """Whether a main-loss override states the loss's normalisation (not where it is computed)."""
    return o.verb != VERB


def normalisation(loss: str, token_axes: tuple[str, ...], tok_o: ir.Override | None,
                  gathered: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the token dims the loss normaliser is summed over, the divisor's axes) for the loss path
    ``loss``: a gathered axis's count is summed once by the gather itself, before any reduction."""
    own = tuple(a for a in token_axes if a not in gathered)
    if loss == "global_mean":
        return (tuple(tok_o.axes or ()) if tok_o is not None else own) + gathered + (MICROBATCHES,), ()
    if loss == "per_device_mean":
        return (MICROBATCHES,) + gathered, own
    if loss == "sum":
        return (), ()
    return gathered, own + (MICROBATCHES,)


def check_override(plan: ir.Plan, context_axes: tuple[str, ...], loss: str) -> None:
    """PL292 where the statement names an axis that is not a context axis (or one twice), PL293
    beside a per-rank variant of the count it makes whole, PL506 beside a sum loss (no count)."""
    o = stated(plan)
    if o is None:
        return
    for i, a in enumerate(o.axes or ()):
        if a not in context_axes:
            raise DiagnosticError([Diagnostic(
                Code.GATHERED_LOSS_AXIS, f"loss: on_gathered_sequence over '{a}', which is not a context axis: only "
                f"a context axis (Ulysses or ring context parallelism) splits one sequence to gather "
                f"(context axes: {', '.join(context_axes) or 'none'})", o.span)])
        if a in (o.axes or ())[:i]:
            raise DiagnosticError([Diagnostic(
                Code.GATHERED_LOSS_AXIS, f"loss: on_gathered_sequence names '{a}' twice: a sequence is gathered over "
                "an axis once", o.span)])
    if not o.axes:
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, "loss: on_gathered_sequence over (): no axis is gathered, "
                                          "so each rank computes the loss of its own tokens, as derived", o.span)])
    if loss == "sum":
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, "loss: on_gathered_sequence beside loss: sum: a sum over "
                                          "tokens has no token count for the gather to make whole, and the gather's "
                                          "backward keeps each rank's own shard, as derived", o.span)])
    for x in plan.overrides:
        if x.target == OverrideTarget.TOKENS and x.group is None and x.verb in UNMODELLED:
            raise DiagnosticError([Diagnostic(
                Code.GATHERED_LOSS_COUNT, f"tokens: {x.verb} beside loss: on_gathered_sequence (line {o.span.line}): "
                "a per-rank variant of a count the gather makes whole is not modelled by the checker", x.span,
                notes=("state one of them, or check the two apart",))])
