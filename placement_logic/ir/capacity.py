"""The plan's statement about the MoE dispatch's capacity step (``override capacity: masks_padding |
counts_padding``; the checker's side is check.encode_capacity): what no step can read.

Input: an ``ir.Plan``. Output: (code, message, span, notes) for a statement in a model without experts
(one, the default: PL273) and for ``counts_padding`` where the model's capacity_factor, experts and top_k are numbers with
capacity_factor >= experts / top_k, at which no capacity step drops a token (PL274).
"""

from __future__ import annotations

from ..diagnostics import Code
from .overrides import OverrideTarget, OverrideVerb
from .walker import fold


def problems(plan, bindings=None) -> list[tuple[str, str, object, tuple[str, ...]]]:
    said = [o for o in plan.overrides if o.target == OverrideTarget.CAPACITY]
    if not said:
        return []
    tf = plan.model.transformer
    if tf is None or fold(tf.experts, bindings or {}) == 1:  # a dense model: one MLP, no router
        return [(Code.CAPACITY_NO_EXPERTS, f"'capacity: {o.verb}': the model has no experts, so no router call has a "
                 "capacity step", o.span, ("state the experts: model { transformer { experts = E  top_k = K } }",))
                for o in said]
    cf, e, k = (fold(x, bindings or {}) for x in (tf.capacity_factor, tf.experts, tf.top_k))
    if None in (cf, e, k) or cf * k < e:
        return []
    return [(Code.CAPACITY_PADDING_NEVER_DROPS, f"'capacity: {o.verb}': capacity_factor = {cf} is at least experts / "
             f"top_k = {e}/{k}: each expert's capacity holds every position of a router call, padded or not, so no "
             "token is dropped and the statement changes nothing", o.span,
             ("a capacity step drops tokens where capacity_factor < experts / top_k",))
            for o in said if o.verb == OverrideVerb.COUNTS_PADDING]
