"""The MoE router's top-k choice (``override router: ...``; ir.router reads the statement): every rank that
holds a token must route it as the single device does (docs/semantics.md, "The router's choice").

The ranks of a tensor axis without sequence parallelism hold the same tokens, and each computes its part of
the MoE layer on them (its shard of every expert, or its own experts), the parts summed or gathered after
it: that is the single-device layer only if every one of them chose the same experts with the same gate
weights. A plan states what its code does:

* ``router: same`` (as derived): the router reads the reduced activation, its jitter or gate noise drawn from
  a generator shared over the ranks that hold the same tokens;
* ``router: vary over (AXES)``: the noise drawn with a per-rank seed over AXES (the model-parallel RNG tracker's
  tensor-parallel state, a seed offset by the rank): along a named axis whose ranks hold the same tokens, two
  of them draw different noise for one token;
* ``router: input_partial over (AXES)``: the router reads the row-parallel linear's partial sums over AXES
  (before their all-reduce or reduce-scatter): along a named tensor axis each rank scores its own summand.

``GI router`` holds when no such axis has two or more ranks: the negation asks z3 for one (free sizes stay
free: a tensor axis of one rank holds one replica). The replay routes one token of hidden (1, 1) on rank 0
and rank 1 of the axis, top-k of E experts by score ℓ_e + 1 (ties to the lower expert), the gate weights
the chosen scores normalised, expert e multiplying by e + 2: for ``vary`` the logits are tied at 0 and the
noise drawn with rank r's seed adds 3 to the experts r·k, ..., r·k + k - 1 mod E (for k = E: to expert
r mod E; rank 0's draw is the single device's, which every rank draws from a shared generator); for ``input_partial`` the router's weights are g_0 = (2, 0), g_1 = (0, 1),
the others 0, and rank r holds the r-th summand of (1, 1) = (1, 0) + (0, 1) + (0, 0) + ...

Input: the plan. Output: the obligation where the plan states the router (none otherwise).
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..ir import router as stmt
from ..ir.overrides import OverrideVerb
from ..ir.walker import fold
from . import encode as en
from . import replay as rp
from .obligation import Obligation
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY


def route(scores: dict[int, Fraction], experts: int, k: int) -> tuple[tuple[int, ...], tuple[Fraction, ...]]:
    """(the top-k experts by score, ties to the lower index; their weights: the chosen scores normalised).
    ``scores``: the experts whose score is not 1 (every other expert scores 1), so E may be any size: of the
    experts scoring 1 only the lowest k can be chosen, all among the first k + len(scores) indices."""
    pool = set(scores) | set(range(min(experts, k + len(scores))))
    chosen = tuple(sorted(sorted(pool, key=lambda e: (-scores.get(e, Fraction(1)), e))[:k]))
    total = sum(scores.get(e, Fraction(1)) for e in chosen)
    return chosen, tuple(scores.get(e, Fraction(1)) / total for e in chosen)


def output(chosen: tuple[int, ...], weights: tuple[Fraction, ...], x: Fraction = Fraction(1)) -> Fraction:
    """The MoE layer's output on the token x: expert e multiplies by e + 2."""
    return sum((w * (e + 2) * x for e, w in zip(chosen, weights)), Fraction(0))


def scores_on(verb: str, rank: int, experts: int, k: int) -> dict[int, Fraction]:
    """Rank ``rank``'s router scores ℓ_e + 1 for the replay's token (module docstring), those other than 1."""
    if verb == OverrideVerb.VARY:
        noised = {(rank * k + j) % experts for j in range(k)} if k < experts else {rank % experts}
        return {e: Fraction(4) for e in noised}
    h = [Fraction(int(rank == 0)), Fraction(int(rank == 1))] if rank >= 0 else [Fraction(1), Fraction(1)]
    g = [(Fraction(2), Fraction(0)), (Fraction(0), Fraction(1))]  # the others' weights 0: score 1
    return {e: g[e][0] * h[0] + g[e][1] * h[1] + 1 for e in range(min(experts, 2))}


def _numbers(plan: ir.Plan, bindings) -> tuple[int, int]:
    """(E, k): the model's, where numbers (E free: 2; k free: 1)."""
    tf = plan.model.transformer
    e = fold(tf.experts, bindings) if tf is not None else None
    k = fold(tf.top_k, bindings) if tf is not None else None
    e = int(e) if e is not None and e >= 2 else 2
    k = int(k) if k is not None and k >= 1 else 1
    return e, min(k, e)


def replay(ctx: rp.Context, plan: ir.Plan, o, w: dict) -> Counterexample | None:
    axis, sizes = w["axis"], w["sizes"]
    if sizes.get(axis, 1) < 2:
        return None
    e, k = _numbers(plan, ctx.bindings)
    single = route(scores_on(o.verb, -1 if o.verb == OverrideVerb.INPUT_PARTIAL else 0, e, k), e, k)
    ranks = [route(scores_on(o.verb, r, e, k), e, k) for r in (0, 1)]
    if all(r == single for r in ranks):
        return None
    show = lambda c: f"experts ({', '.join(map(str, c[0]))}) with weights ({', '.join(rp._frac(x) for x in c[1])})"  # noqa: E731
    how = ("its jitter drawn with rank r's seed adds 3 to experts r·k, ..., r·k + k - 1 mod E (k < E; to expert "
           "r mod E where k = E; logits tied at 0)" if o.verb == OverrideVerb.VARY
           else "router weights g_0 = (2, 0), g_1 = (0, 1), the others 0; rank r scores the r-th summand of the "
                "row-parallel output (1, 1) = (1, 0) + (0, 1) + ...")
    values = (("token", f"one token of hidden (1, 1), held by every rank of {axis}"),
              ("router", f"E = {e} experts, top-{k} by score ℓ_e + 1, ties to the lower expert; {how}"),
              ("experts", "expert e multiplies the token by e + 2"),
              ("single device", f"{show(single)}: output {rp._frac(output(*single))}"))
    values += tuple((f"rank {r} of {axis}", f"{show(c)}: output {rp._frac(output(*c))}") for r, c in enumerate(ranks))
    bad = next(r for r, c in enumerate(ranks) if c != single)
    eq = (f"the token's routing on rank {bad} of {axis} = {show(ranks[bad])} (output {rp._frac(output(*ranks[bad]))}), "
          f"single-device = {show(single)} (output {rp._frac(output(*single))})")
    devices = tuple((f"rank {r}", f"{axis}={r}") for r in (0, 1))
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, tuple(diagnose(o, axis)), ctx.command(sizes))


def diagnose(o, axis: str) -> list[str]:
    at = f"(override router: {o.verb} over ({', '.join(o.axes or ())}) at line {o.span.line})"
    cause = (f"the router's jitter / gate noise is drawn with a per-rank seed over {axis}, whose ranks hold the same "
             f"tokens {at}: two of them choose different experts (or gate weights) for one token"
             if o.verb == OverrideVerb.VARY else
             f"the router scores the row-parallel linear's partial sums over {axis}, before their all-reduce {at}: "
             "each rank routes its own summand, not the token")
    return [f"the root cause is the MoE router's choice: {cause}",
            "the experts' parts computed on the ranks of the axis (their shards, summed after the layer) belong to "
            "different routings, so the MoE output, every layer after it, the loss and every gradient of the step "
            "differ from the single device's; draw the noise from a generator shared over the tensor ranks and "
            "route the reduced activation (router: same)"]


def obligations(plan: ir.Plan | None, ctx: rp.Context) -> list[Obligation]:
    """``GI router`` where the plan states the router (``override router: ...``)."""
    o = stmt.stated(plan) if plan is not None else None
    if o is None:
        return []
    bad = stmt.reach(plan, o)
    return [Obligation(
        "GI router", GRADIENT_INTEGRITY, o.span,
        "every rank that holds a token routes it to the single device's top-k experts with the same gate weights "
        "(the ranks of a tensor axis without sequence parallelism hold the same tokens: one shared noise draw, the "
        "reduced activation as the router's input)",
        lambda env: en.axes_negation(env, "router", [(a, env.sess.true()) for a in bad]),
        lambda w: replay(ctx, plan, o, w))]
