"""The aux load-balancing loss's statistics over router calls of unequal real-token counts and after a
capacity step (docs/semantics.md, "Loss terms"; the grouping itself: check.auxstats).

A router call is one device's microbatch (its coordinates on the token axes and the microbatch). The
objective pools a group's tokens: f_i = (slots on i) / (k · real tokens of the group), P_i likewise, so
a call holding more real tokens weighs more. Two departures of a path:

* ``override loss[aux]: stats_equal_cell_weights over (AXES)`` (over the ranks of AXES) and
  ``stats_equal_microbatch_weights`` (over the step's microbatches): the statistics of the calls a group
  gathers there are combined with equal weights: each call's f and P normalised by its own real-token count, then
  averaged (NVIDIA/Megatron-LM#7197: the running counts of ``global_aux_loss`` divided as though every
  microbatch held the current one's tokens). Equal counts give the pooled value; where the counts differ
  (padding spread unevenly: a short last sequence, packs of unequal fill) the mean of fractions weighs a
  token of a short call more. The negation asks for a gathered call dimension of two or more; the replay
  gives the calls at 0 on it one real token routed to experts 0..k-1 (a padded position beside it), the
  others two routed to 1..k: a mix weighted 1/n is not one weighted 1/(2n-1), and E·Σ f_i P_i of a mix of
  the two is a parabola symmetric about 1/2.
* ``override loss[aux]: stats_after_capacity`` / ``stats_capacity_padded``: f is counted on the routing
  map after the capacity step (NVIDIA/Megatron-LM#1617, #1513), not on the router's top-k: in each call of
  N tokens an expert keeps at most C = ⌈capacity_factor · k · N / E⌉ slots (its top C tokens by router score,
  ties to the earlier token: Megatron-LM's ``moe_token_drop_policy = probs``), and
  padded to capacity every expert's column is filled up to min(C, N) marked tokens. Dropping departs
  exactly where C < N for some N, that is capacity_factor · k < E; padding departs always (k < E): a
  column filled for a token that did not choose the expert adds f where P is positive. The replay routes
  every token alike (weight 2 on experts 0..k-1, 1 on the others; no padding, equal counts, so no other
  statement matters) with the fewest tokens per shard at which the values differ.

Input: the plan and its ``auxstats.StatsView``. Output: the view's fields (``equal``, ``capacity``), the
negation's disjuncts, the replay and the findings.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product
from math import ceil

import z3

from ..ir import losses as terms
from ..ir import routerstats
from ..ir.overrides import OverrideTarget, OverrideVerb
from .dims import MICROBATCHES

UNEVEN = "uneven"  # the witness's kind where the calls' real-token counts differ
CAPACITY = "capacity"  # the witness's kind for the capacity step
DROP, PAD = "drop", "pad"


def stated(plan) -> tuple[frozenset[str], str | None]:
    """(the call dimensions whose calls' statistics are combined with equal weights, the capacity step: None,
    DROP or PAD)."""
    said = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb in terms.STATS_VERBS]
    caps = [o.verb for o in said if o.verb in terms.CAPACITY_VERBS]
    cap = None if not caps else DROP if caps[-1] == terms.CAPACITY_VERBS[0] else PAD
    return frozenset(d for o in said for d in routerstats.equal_dims(o)), cap


def equal_dims(plan, gathered: frozenset[str]) -> frozenset[str]:
    """The call dimensions of ``gathered`` (token axes, microbatches) that the path weights equally (a stated
    one the path does not gather is refused where the plan is resolved: PL264)."""
    return gathered & stated(plan)[0]


def counts_equal(plan) -> bool:
    """Whether the plan states that every device and microbatch holds as many tokens, none padded (``override
    tokens: equal``): then every shard of every sequence holds as many real tokens, and the counts are not free."""
    return any(o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.EQUAL and o.group is None
               for o in plan.overrides)


def split_dims(v) -> frozenset[str]:
    """The dimensions of the objective's groups over which one of f and P is gathered and the other is not
    (``loss[aux]: probs_* over (AXES)``), where the shards' real-token counts are free: there the path averages its
    cells' E·Σ f_i·P_i with equal weights, and the mean of the cells' local factor is the gathered one only for
    cells of equal counts. Those outside the objective's groups are the grouping's departures (check.auxstats). The
    documents packed in a row have free lengths even under ``tokens: equal`` (check.auxpacked)."""
    split = (v.f_gathered ^ v.p_gathered) & v.wanted
    return split & {"documents"} if v.counts_equal else split  # a row's documents differ in length (check.auxpacked)


def negation_conds(env, plan, v, e, k, cf_term):
    """(witness kind, z3 condition) for each departure of this module: a gathered call dimension of two or
    more where the calls are weighted equally (their counts free: not ``tokens: equal``); capacity_factor · k < E
    where tokens are dropped; always where the map is padded to capacity."""
    out = [((UNEVEN, d), env.real(env.size(d)) >= 2) for d in sorted(v.equal) if not v.counts_equal]
    if v.capacity == DROP:
        drops = cf_term * k < e
        out.append(((CAPACITY, DROP), z3.BoolVal(drops, env.sess.ctx) if isinstance(drops, bool) else drops))
    elif v.capacity == PAD:
        out.append(((CAPACITY, PAD), z3.BoolVal(True, env.sess.ctx)))
    return out


def marked(calls: dict, experts: int, top_k: int, capacity: tuple[str, Fraction] | None) -> dict:
    """Each token's marked experts in its router call's map: its top-k, or after the capacity step (per call of
    N tokens an expert keeps C = ⌈cf·k·N/E⌉ of the tokens that chose it, the highest router scores first, ties
    to the earlier token; padded, each column then filled to min(C, N) with the call's further tokens in order).
    A token is (id, chosen) or (id, chosen, its probabilities), the call's tokens in order."""
    out = {}
    for toks in calls.values():
        if capacity is None:
            out.update({tok[0]: set(tok[1]) for tok in toks})
            continue
        mode, cf = capacity
        n = len(toks)
        cap = ceil(Fraction(cf) * top_k * n / experts)
        out.update({tok[0]: set() for tok in toks})
        for i in range(experts):
            chose = [j for j, tok in enumerate(toks) if i in tok[1]]
            kept = sorted(chose, key=lambda j: (-score(toks[j], i), j))[:cap]
            if mode == PAD:
                kept += [j for j in range(n) if j not in kept][:max(0, min(cap, n) - len(kept))]
            for j in kept:
                out[toks[j][0]].add(i)
    return out


def score(tok: tuple, expert: int) -> Fraction:
    """A token's router score for ``expert`` (0 where the token carries no probabilities: order by position)."""
    return tok[2][expert] if len(tok) > 2 else Fraction(0)


def uniform_cells(sizes: dict, names: tuple[str, ...], per: int, experts: int, top_k: int) -> dict:
    """``per`` tokens on every shard, each choosing experts 0..k-1 with weight 2 on them and 1 on the others."""
    w = [2 if i < top_k else 1 for i in range(experts)]
    tok = (tuple(range(top_k)), tuple(Fraction(x, sum(w)) for x in w))
    return {c: [tok] * per for c in product(*[range(sizes[n]) for n in names])}


def uneven_cells(sizes: dict, names: tuple[str, ...], dim: str, experts: int, top_k: int, padding: bool) -> dict:
    """The calls at ``dim`` = 0 hold one real token routed to 0..k-1 (and a padded position routed alike where
    the path counts padding), the others two real tokens routed to 1..k; probability 1/k on each chosen."""
    c0, c1 = tuple(range(top_k)), tuple(range(1, top_k + 1))
    tok = {c: (c, tuple(Fraction(1, top_k) if i in c else Fraction(0) for i in range(experts))) for c in (c0, c1)}
    at = names.index(dim)
    return {c: ([tok[c0]] * (2 if padding else 1) if c[at] == 0 else [tok[c1]] * 2)
            for c in product(*[range(sizes[n]) for n in names])}


def capacity_per_shard(cf: Fraction, experts: int, top_k: int, per_call: int) -> int:
    """The fewest tokens per shard at which dropping changes a call's map (C < N, N = per_call × per)."""
    x = Fraction(cf) * top_k / experts
    per = 1
    while x < 1 and ceil(x * per_call * per) >= per_call * per:
        per += 1
    return per


def describe(kind, v, e: int, k: int, cf: Fraction, per: int) -> str:
    if kind[0] == UNEVEN:
        calls = "the shards of the sequences" if kind[1] == "sequences" else "the router calls"
        return (f"{calls} at {kind[1]}=0 hold one real token choosing experts {', '.join(map(str, range(k)))}"
                f"{' and one padded position' if v.padding else ''}, the others two real tokens choosing "
                f"{', '.join(map(str, range(1, k + 1)))}, probability 1/{k} on each chosen expert")
    return (f"{per} token(s) per shard, each choosing experts {', '.join(map(str, range(k)))} (probability "
            f"{Fraction(2, e + k)} on each, {Fraction(1, e + k)} on the others); capacity_factor = {cf}: each expert keeps ⌈{cf}·{k}·N/{e}⌉ slots of a "
            "router call of N tokens" + (", every column padded up to it" if kind[1] == PAD else ""))


def diagnose(v) -> list[str]:
    """The findings of this module's departures."""
    out = []
    if v.equal and not v.counts_equal:
        order = v.token_axes + (MICROBATCHES,)
        out.append("the aux term's routing statistics combine the router calls' statistics with equal weights over "
                   f"{', '.join(sorted(v.equal, key=order.index))}: each call's f and P are "
                   "normalised by its own real-token count and then averaged, so where the calls hold unequal numbers "
                   "of real tokens (uneven padding) a token of a short call weighs more than one of a long call (the "
                   "objective pools the tokens: counts summed, then divided by the total)")
    out += _split_findings(v)
    if v.capacity == DROP:
        out.append("the aux term's routing fractions f are counted on the routing map after the capacity step "
                   f"(loss[aux]: {terms.CAPACITY_VERBS[0]}): the tokens an expert's capacity drops are missing from f, "
                   "so the loss sees the capped load, not the router's top-k choices it is meant to balance")
    if v.capacity == PAD:
        out.append("the aux term's routing fractions f are counted on the routing map padded to capacity "
                   f"(loss[aux]: {terms.CAPACITY_VERBS[1]}): every expert's column is filled up to its capacity, so "
                   "the padding slots count as routed tokens and f no longer reflects the router's top-k choices")
    return out


def _split_findings(v) -> list[str]:
    """One finding per factor taken locally over dimensions of ``split_dims``."""
    out = []
    order = v.token_axes + (MICROBATCHES, "sequences")
    for local, gathered, dims in (("P", "f", v.f_gathered - v.p_gathered), ("f", "P", v.p_gathered - v.f_gathered)):
        over = sorted(dims & split_dims(v), key=order.index)
        if over:
            out.append(f"the aux term's {gathered} is gathered over {', '.join(over)} and its {local} is not: each cell "
                       f"takes E·Σ f_i·P_i with its own {local} and the cells are averaged with equal weights, so the "
                       f"mean of the cells' {local} is the gathered {local} only where every cell holds as many real "
                       "tokens; where the counts differ (padding spread unevenly, sequences of unequal lengths) a token "
                       f"of a short cell weighs more in {local} than one of a long cell (the objective pools the tokens; "
                       "`override tokens: equal` states equal counts where every device and microbatch holds as many "
                       "tokens and none is padded)")
    return out
