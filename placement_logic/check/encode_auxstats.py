"""The z3 side of the aux term's statistics scope (check.auxstats): the negation of ``GI aux_stats``
and the obligation itself.

Input: the plan and its ``auxstats.StatsView``. Output: the obligation, whose negation asks for mesh
sizes (and E, k, sequences per microbatch where the model leaves them free) at which a dimension one
grouping gathers and the other keeps apart has two or more shards (the path's grouping: the union of
f's and P's, ``auxstats.effective``), or, where the path counts padded positions, any sizes with E >= 2
and k < E, or, where f and P are gathered over groups of their own, a dimension of the objective's groups
that one of them gathers and the other does not with two or more shards, their real-token counts free
unless the plan states ``tokens: equal`` (check.encode_auxcells.split_dims); ``auxstats.replay``
re-checks the witness on a concrete routing (and concrete unequal counts).
"""

from __future__ import annotations

from fractions import Fraction

import z3

from .. import ir
from ..ir import losses as terms
from ..solver.session import value_of
from . import auxpacked
from . import encode as en
from . import encode_auxcells as auxcells
from . import replay as rp
from .auxstats import PADDING, SCOPE_TEXT, SEQUENCES, StatsView, _dims, replay, view
from .obligation import Obligation
from .rules import GRADIENT_INTEGRITY


def _model_numbers(plan: ir.Plan, env: en.Env):
    """(E, k, sequences per microbatch) as z3 terms, with side conditions for those the model leaves free."""
    tf, side, free = plan.model.transformer, [], {}

    def term(value, name, low):
        if value is not None:
            return env.value(value)
        t = env.sess.int(f"aux_{name}")
        side.append(t >= low)
        free[name] = t
        return env.real(t)

    e = term(tf.experts if tf is not None else None, "experts", 1)
    k = term(tf.top_k if tf is not None else None, "top_k", 1)
    b = term(plan.model.microbatch, SEQUENCES, 1)
    free[auxpacked.DOCUMENTS] = env.sess.int("aux_documents")  # documents per packed row: free (check.auxpacked)
    side.append(free[auxpacked.DOCUMENTS] >= 1)
    return e, k, b, side, free


def negation(env: en.Env, plan: ir.Plan, v: StatsView):
    """The path counts padded positions (any batch with padding), or some dimension one grouping (the
    path's: f's and P's union) gathers and the other does not has two or more shards, with E >= 2 experts
    and top-k below E (at k = E every token routes everywhere and the value is constant)."""
    e, k, b, side, free = _model_numbers(plan, env)
    size = {SEQUENCES: b, auxpacked.DOCUMENTS: env.real(free[auxpacked.DOCUMENTS])}
    differ = sorted(v.wanted ^ v.gathered, key=_dims(v).index)
    conds = [(PADDING, z3.BoolVal(True, env.sess.ctx))] if v.padding and not v.counts_equal else []  # any padding
    dim_size = lambda d: size[d] if d in size else env.real(env.size(d))  # noqa: E731
    conds += [(d, dim_size(d) >= 2) for d in differ]
    tf = plan.model.transformer
    cf = env.value(tf.capacity_factor) if tf is not None else z3.RealVal(1, env.sess.ctx)
    conds += auxcells.negation_conds(env, plan, v, e, k, cf)  # unequal calls, the capacity step
    # f and P over groups of their own: cells of free real-token counts along a dimension only one of them gathers
    conds += [((auxcells.UNEVEN, d), dim_size(d) >= 2)
              for d in sorted(auxcells.split_dims(v), key=_dims(v).index)]
    if auxpacked.departs_by_length(v):  # a row's documents weighted by their free lengths
        conds.append(((auxpacked.LENGTH, auxpacked.DOCUMENTS), dim_size(auxpacked.DOCUMENTS) >= 2))
    routing = z3.And(e >= 2, k < e, k >= 1)
    cons = side + [routing, z3.Or([c for _, c in conds]) if conds else z3.BoolVal(False, env.sess.ctx)]

    def extract(model) -> dict:
        dim = next(d for d, c in conds if value_of(model, c))
        sizes = env.size_values(model)
        numbers = {"experts": value_of(model, e), "top_k": value_of(model, k), SEQUENCES: value_of(model, b),
                   auxpacked.DOCUMENTS: value_of(model, free[auxpacked.DOCUMENTS])}
        whole = {n: int(x) if Fraction(x).denominator == 1 else 0 for n, x in numbers.items()}
        factor = Fraction(cf if isinstance(cf, (int, Fraction)) else value_of(model, cf))  # a let folds to a number
        return {"kind": "aux_stats", "sizes": sizes, "dim": dim, **whole, "capacity_factor": factor}

    return cons, extract


def obligations(plan: ir.Plan, ctx: rp.Context) -> list[Obligation]:
    """``GI aux_stats`` where the model states the aux term's statistics scope."""
    if plan is None or not any(t in terms.STATS_TERMS for t, _, _ in plan.model.loss_terms):
        return []
    v = view(plan)
    if v is None:
        return []
    return [Obligation(
        "GI aux_stats", GRADIENT_INTEGRITY, v.span,
        f"the aux load-balancing loss's routing statistics are taken {SCOPE_TEXT[v.objective]}, over its real "
        f"tokens, as its objective (aux_stats = {v.objective}) states: every routing gives the objective's value",
        lambda env: negation(env, plan, v), lambda w: replay(ctx, w, v))]

