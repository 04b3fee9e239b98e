"""The verb of an override of a target without a group: unknown verbs, and a loss term's verbs given to the main
loss (``ir.overrides``, ``ir.losses``)."""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, did_you_mean
from ..frontend import surface
from ..ir import losses as ir_losses
from ..ir.overrides import OverrideTarget, OverrideVerb
from .values import Values


def bad_verb(vals: Values, o: surface.OverrideStmt, verbs: dict | None) -> bool:
    """An error where the main loss is given a term's verb, or the target or its verb is unknown."""
    error = vals.cx.error
    if o.target == OverrideTarget.LOSS and o.verb == OverrideVerb.DIVIDE:
        error(Code.BAD_OVERRIDE, "'loss: divide' applies to a loss term (loss[TERM]: divide by ...); the main loss's "
              "divisor is override grads: divide by ...", o.span)
        return True
    if o.target == OverrideTarget.LOSS and o.verb in ir_losses.RANK_VERBS:
        error(Code.BAD_OVERRIDE, f"'loss: {o.verb}' applies to a loss term (loss[TERM]: {o.verb} over (AXES) ranks "
              "(R1, ...)); the main loss's per-rank divisor is override grads: divide_on_ranks", o.span)
        return True
    if o.target == OverrideTarget.LOSS and o.verb in ir_losses.SEQUENCE_OBJECTIVES:
        error(Code.SEQUENCE_COUNT_STATEMENT, f"'loss: {o.verb}': the main loss is normalised per token here; a "
              "per-sequence normalisation applies to a loss term (loss[TERM]: ...)", o.span,
              (f"declare the term: model {{ losses {{ policy = {o.verb} }} }}",))
        return True
    if o.target == OverrideTarget.LOSS and o.verb in ir_losses.STATS_VERBS:
        error(Code.STATS_SCOPE_TERM, f"'loss: {o.verb}': the main loss is a sum over tokens, with no statistics over a "
              "group of tokens to scope", o.span, ("statistics scopes apply to: loss[aux]",))
        return True
    if verbs is None:
        error(Code.BAD_OVERRIDE, f"cannot override '{o.target}'", o.span, did_you_mean(o.target, ir.OVERRIDE_VERBS))
        return True
    if o.verb not in verbs:
        error(Code.BAD_OVERRIDE, f"'{o.target}' has no override '{o.verb}'", o.span,
              did_you_mean(o.verb, verbs) or (f"accepted: {', '.join(verbs)}",))
        return True
    return False
