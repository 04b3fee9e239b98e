"""The plan's statements about what the capacity step's dropped (token, expert) pairs add to the combine
(``override capacity: drops_zeroed | dropped_uninitialised | dropped_weighted | renormalise_kept |
renormalise_dropped``; the checker's side is check.encode_capdrop): what no step can read.

Input: an ``ir.Plan``. Output: (code, message, span, notes) for a departing statement where the model's
capacity_factor, experts and top_k are numbers with capacity_factor >= experts / top_k, at which the
capacity step drops nothing (PL506, the test of PL274), and for a renormalisation statement at top_k = 1,
where a token keeps its one expert or none (PL275), and for ``renormalise_dropped`` where the model keeps
the weights (no ``drop_renormalise``): dividing weights that sum to 1 by their sum changes nothing (PL290). (A model without experts: PL273, ir.capacity.)
"""

from __future__ import annotations

from ..diagnostics import Code
from .overrides import OverrideTarget, OverrideVerb
from .walker import fold

# the statements about the dropped pairs' outputs, and about the kept experts' weights
OUTPUTS = (OverrideVerb.DROPS_ZEROED, OverrideVerb.DROPPED_UNINITIALISED, OverrideVerb.DROPPED_WEIGHTED)
WEIGHTS = (OverrideVerb.RENORMALISE_KEPT, OverrideVerb.RENORMALISE_DROPPED)


def said(plan, verbs) -> list:
    return [o for o in plan.overrides if o.target == OverrideTarget.CAPACITY and o.verb in verbs]


def problems(plan, bindings=None) -> list[tuple[str, str, object, tuple[str, ...]]]:
    stated = said(plan, OUTPUTS + WEIGHTS)
    tf = plan.model.transformer
    if not stated or tf is None or fold(tf.experts, bindings or {}) == 1:
        return []  # none, or PL273 (ir.capacity)
    cf, e, k = (fold(x, bindings or {}) for x in (tf.capacity_factor, tf.experts, tf.top_k))
    out = []
    for o in stated:
        if o.verb == OverrideVerb.DROPS_ZEROED:
            continue  # as derived
        if None not in (cf, e, k) and cf * k >= e:
            out.append((Code.OVERRIDE_NO_EFFECT, f"'capacity: {o.verb}': capacity_factor = {cf} is at least experts / "
                        f"top_k = {e}/{k}: each expert's capacity holds every token of a router call, so no token is "
                        "dropped and the statement changes nothing", o.span,
                        ("a capacity step drops tokens where capacity_factor < experts / top_k",)))
        elif o.verb == OverrideVerb.RENORMALISE_DROPPED and not tf.drop_renormalise:
            out.append((Code.CAPACITY_RENORMALISE_UNCHANGED, "'capacity: renormalise_dropped': the model keeps the gate "
                        "weights as the router gave them (no drop_renormalise), and dividing them by their sum over all "
                        "k chosen experts, which is 1, changes neither the combine nor the router's gradient", o.span,
                        ("renormalise_dropped departs where the model states drop_renormalise",)))
        elif o.verb in WEIGHTS and k == 1:
            out.append((Code.CAPACITY_RENORMALISE_TOP1, f"'capacity: {o.verb}': top_k = 1: a token keeps its one "
                        "expert or none, so renormalising the kept experts' gate weights changes nothing", o.span,
                        ("renormalisation after the capacity step matters where top_k >= 2",)))
    return out
