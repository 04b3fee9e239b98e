"""``GI capacity dropped``: what the capacity step's dropped (token, expert) pairs add to the MoE combine
(check.capdrop has the semantics and the concrete call).

The objective gives a dropped pair a zero contribution and its gate weight no gradient, and weights a token's
kept experts as the model states (``drop_renormalise``: renormalised over the kept experts; else as the
router gave them). A path departs:

* ``dropped_uninitialised`` / ``dropped_weighted``: wherever a capacity step drops a pair, capacity_factor · k
  < E (1 ≤ k ≤ E): the pair adds its gate weight times a stale value or the token's hidden state, and its
  gate weight gets that value as gradient;
* ``renormalise_dropped`` where the objective renormalises over the kept experts: wherever a token keeps some
  of its experts and loses others, which needs k ≥ 2 as well: the denominator sums the dropped gate weights
  too, so the kept weights are too small (where the objective keeps the weights, dividing by Σ g = 1 changes
  nothing: PL290, ir.capdrop);
* ``renormalise_kept`` where the objective keeps the weights: likewise (the kept weights too large).

The negation asks z3 for those conditions over the model's numbers (check.encode_capacity's); the replay
builds check.capdrop's call at the witness's numbers and compares each token's output and its dropped
pairs' gate gradients, exactly.

Input: the plan. Output: the obligation where the plan states what the dropped pairs add (none otherwise).
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil

import z3

from .. import ir
from ..ir.capdrop import OUTPUTS, WEIGHTS, said
from ..ir.overrides import OverrideVerb
from . import capdrop
from . import encode as en
from . import encode_capacity as capacity
from . import replay as rp
from .obligation import Obligation
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY

NAME = "GI capacity dropped"


def statements(plan: ir.Plan):
    """(the last statement about the dropped pairs' outputs, the last about the kept weights), each or None."""
    outs, weights = said(plan, OUTPUTS), said(plan, WEIGHTS)
    return (outs[-1] if outs else None), (weights[-1] if weights else None)


def _renormalises(plan: ir.Plan) -> bool:
    tf = plan.model.transformer
    return bool(tf is not None and tf.drop_renormalise)


def departs(plan: ir.Plan) -> tuple[bool, bool]:
    """(departs wherever a pair is dropped, departs wherever a token keeps some experts and loses others)."""
    out, weights = statements(plan)
    any_drop = out is not None and out.verb in (OverrideVerb.DROPPED_UNINITIALISED, OverrideVerb.DROPPED_WEIGHTED)
    partial = weights is not None and (weights.verb == OverrideVerb.RENORMALISE_DROPPED) == _renormalises(plan)
    return any_drop, partial


def negation(env: en.Env, plan: ir.Plan):
    any_drop, partial = departs(plan)
    cons, extract = capacity.negation(env, plan)
    if any_drop:
        return cons, extract
    if partial:
        _, k, _, _ = capacity._numbers(plan, env)
        return cons + [k >= 2], extract
    return [z3.BoolVal(False, env.sess.ctx)], lambda model: {}


def _modes(plan: ir.Plan) -> tuple[str, str]:
    out, weights = statements(plan)
    return capdrop.path_modes(out.verb if out else None, weights.verb if weights else None, _renormalises(plan))


_SLOTS = {"zero": "nothing", "stale": f"gate weight × a stale buffer value {capdrop.STALE}",
          "hidden": "gate weight × the hidden state"}
_WEIGHTS = {"none": "as the router gave them", "kept": "renormalised over the kept experts",
            "chosen": "renormalised over all k chosen, the dropped too"}


def replay(ctx: rp.Context, plan: ir.Plan, w: dict) -> Counterexample | None:
    e, k, cf = w["experts"], w["top_k"], Fraction(w["capacity_factor"])
    call = capdrop.witness_call(e, k, cf)
    if call is None:
        return None
    kept = capacity.kept(call, e, k, cf, False)
    renorm = _renormalises(plan)
    want = capdrop.combine(call, kept, "zero", "kept" if renorm else "none")
    value, weights = _modes(plan)
    got = capdrop.combine(call, kept, value, weights)
    bad = [j for j in range(len(call)) if capdrop.differs(want[j], got[j])]
    if not bad:
        return None
    j = bad[0]
    f = rp._frac
    dropped = sorted((t, i) for t, (chosen, _, _) in enumerate(call) for i in chosen if (t, i) not in kept)
    def grads(t):
        gates = ", ".join(f"∂L/∂g[{j},{i}] = {f(v)}" for i, v in sorted(t[1].items())) or "no dropped pair"
        return gates + "; router logits " + ", ".join(f"∂L/∂l[{j},{i}] = {f(v)}" for i, v in sorted(t[2].items()))

    n = len(call)
    values = (
        ("objective", f"the capacity step's dropped pairs add nothing to the combine and get no gate gradient; kept "
                      f"weights {'renormalised over the kept experts' if renorm else 'as the router gave them'}"),
        ("path", f"dropped pairs: {_SLOTS[value]}; kept weights {_WEIGHTS[weights]}"),
        ("routing", f"E = {e}, top-{k}, capacity factor {f(cf)}: one router call of {n} tokens choosing experts "
                    f"{', '.join(map(str, range(k)))}, C = ⌈{f(cf)}·{k}·{n}/{e}⌉ = {ceil(cf * k * n / e)}; "
                    f"token {j}'s gate weights ({', '.join(f(call[j][1][i]) for i in range(k))}); hidden state x_t = t+1, "
                    "expert i's output (i+2)·x, L = Σ_t y_t"),
        ("dropped pairs", ", ".join(f"token {t} on expert {i}" for t, i in dropped)),
        (f"objective's token {j}", f"y = {f(want[j][0])}; {grads(want[j])}"),
        (f"path's token {j}", f"y = {f(got[j][0])}; {grads(got[j])}"),
    )
    eq = f"token {j}: y = {f(got[j][0])} ≠ {f(want[j][0])}" if want[j][0] != got[j][0] else (
        f"token {j}: the router's gradient {grads(got[j])} ≠ {grads(want[j])}")
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "one device's router call"),), values, eq,
                          tuple(diagnose(value, weights, renorm)), ctx.command(w["sizes"]))


def diagnose(value: str, weights: str, renorm: bool) -> list[str]:
    out = []
    if value == "stale":
        out.append("the capacity step's dropped tokens read an uninitialised expert-output buffer (capacity: "
                   "dropped_uninitialised): the unpermute buffer is allocated empty and the dropped pairs' rows are "
                   "never written, so the combine adds their gate weight times a stale value and the router gets "
                   "its gradient")
    if value == "hidden":
        out.append("the capacity step's dropped tokens are combined with their nonzero gate weight (capacity: "
                   "dropped_weighted): the combine buffer starts from the hidden states, so a dropped pair adds "
                   "its gate weight times the token itself, and the router gets that as gradient")
    if weights == "chosen" and renorm:
        out.append("the kept experts' gate weights are renormalised over all k chosen experts, the dropped ones too "
                   "(capacity: renormalise_dropped): the dropped pairs' gate weights stay in the denominator, so the "
                   "kept weights no longer sum to 1 and the token's expert output is scaled down")
    if weights == "kept" and not renorm:
        out.append("the kept experts' gate weights are renormalised after the capacity step (capacity: "
                   "renormalise_kept) where the objective keeps them as the router gave them (no drop_renormalise)")
    return out


def obligations(plan: ir.Plan | None, ctx: rp.Context) -> list[Obligation]:
    """``GI capacity dropped`` where the plan states what the dropped pairs add or how kept weights are scaled."""
    if plan is None or statements(plan) == (None, None):
        return []
    span = next(o for o in statements(plan)[::-1] if o is not None).span
    return [Obligation(
        NAME, GRADIENT_INTEGRITY, span,
        "every pair the capacity step drops adds nothing to the combine, so its gate weight gets no gradient, and the "
        "kept experts' gate weights are renormalised over the kept experts exactly where the model states "
        "drop_renormalise (judged on each token's output and its router logits' gradient)",
        lambda env: negation(env, plan), lambda w: replay(ctx, plan, w))]
