"""The loss computed on the sequence gathered over context axes (``override loss: on_gathered_sequence over
(AXES)``; the checker's side is check.gathered): what the statement may name, and the all-gather it adds to
the step (docs/costs.md, "Collectives").

Input: an ``ir.Plan``. Output: (code, message, span, notes) for a statement naming an axis that is not a
context axis, or one twice (PL292), for one over no axis or beside a sum loss (PL506), and for a per-rank
variant of the token count beside it (PL293); and the statement's all-gather: the per-token values of the
loss (one fp32 value per token: the per-token losses or log-probabilities a system gathers, as verl's
``gather_outputs_and_unpad`` and Megatron-DeepSpeed's sequence-parallel cross entropy do) of the whole
sequence gathered over AXES, once per microbatch in forward, on the stage that holds the head. Its
backward keeps each rank's own shard of the gradient (a slice): no communication.
"""

from __future__ import annotations

from ..diagnostics import Code
from . import views
from .buffers import Collective, Kind, Payload, Phase, link_of
from .buffers import PayloadTensor as PT
from .nodes import Role, State
from .overrides import OverrideTarget, OverrideVerb

VERB = OverrideVerb.ON_GATHERED_SEQUENCE
# the per-rank variants of a count that the gather makes whole: each would act on the gathered count,
# which the step semantics does not model (PL293)
UNMODELLED = (OverrideVerb.CLAMP_BEFORE_REDUCE, OverrideVerb.EPS_BEFORE_REDUCE, OverrideVerb.COUNT_IGNORED,
              OverrideVerb.IGNORED_IN_LOSS)


def stated(plan):
    """The plan's last ``loss: on_gathered_sequence`` statement (the main loss's), or None."""
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.LOSS and o.verb == VERB
                 and o.group is None), None)


def axes(plan) -> tuple[str, ...]:
    """The axes the loss is computed on the gathered sequence over; () without the statement."""
    o = stated(plan)
    return tuple(dict.fromkeys(o.axes or ())) if o is not None else ()


def problems(plan, bindings=None) -> list[tuple[str, str, object, tuple[str, ...]]]:
    o = stated(plan)
    if o is None:
        return []
    context = views.view(plan).axes_with_role(Role.CONTEXT)
    named = tuple(o.axes or ())
    for i, a in enumerate(named):
        if a not in context:
            return [(Code.GATHERED_LOSS_AXIS, f"loss: on_gathered_sequence over '{a}', which is not a context axis: "
                     "only a context axis (Ulysses or ring context parallelism) splits one sequence to gather", o.span,
                     (f"context axes of this plan: {', '.join(context) or 'none'}",))]
        if a in named[:i]:
            return [(Code.GATHERED_LOSS_AXIS, f"loss: on_gathered_sequence names '{a}' twice: a sequence is gathered "
                     "over an axis once", o.span, ())]
    if not named:
        return [(Code.OVERRIDE_NO_EFFECT, "loss: on_gathered_sequence over () changes nothing: no axis is gathered, "
                 "so each rank computes the loss of its own tokens, as derived", o.span, ())]
    paths = [x for x in plan.overrides if x.target == OverrideTarget.LOSS and x.group is None and x.verb != VERB]
    if paths and paths[-1].verb == OverrideVerb.SUM:
        return [(Code.OVERRIDE_NO_EFFECT, "loss: on_gathered_sequence changes nothing beside loss: sum: a sum over "
                 "tokens has no token count for the gather to make whole, and the gather's backward keeps each "
                 "rank's own shard, as derived", o.span, ())]
    return [(Code.GATHERED_LOSS_COUNT, f"tokens: {x.verb} beside loss: on_gathered_sequence (line {o.span.line}): a "
             "per-rank variant of a count the gather makes whole is not modelled by the checker", x.span,
             ("state one of them, or check the two apart",))
            for x in plan.overrides if x.target == OverrideTarget.TOKENS and x.group is None and x.verb in UNMODELLED]


def collectives(plan, microbatches) -> list[Collective]:
    """The all-gather of the loss's per-token values over the gathered axes, per microbatch in forward."""
    gathered = axes(plan)
    if not gathered or problems(plan):
        return []
    pay = Payload(PT.GATHERED_TOKEN_SCALARS, gathered, "the whole sequence's per-token loss values, one fp32 value "
                  "per token (s·b·4 / the context ranks, times the gathered ranks)")
    return [Collective(Kind.ALL_GATHER, State.ACTIVATIONS, gathered, link_of(plan, gathered), Phase.FORWARD,
                       microbatches, pay, "loss on the gathered sequence: the per-token loss values all-gathered over "
                       f"({', '.join(gathered)}) per microbatch in forward; the gather's backward keeps each rank's "
                       "own shard")]
