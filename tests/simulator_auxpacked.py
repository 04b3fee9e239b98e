"""The sequence-wise MoE load-balancing loss on concrete packed rows, written from docs/semantics.md ("Loss
terms", packed rows) without the checker's code.

A microbatch holds ``rows`` packed rows; each row is a list of documents of given real lengths (THD:
``cu_seqlens`` gives their boundaries). A row's positions are cut into contiguous equal blocks, one per rank of
the axes that split a sequence (context, and tensor under sequence parallelism); a block may hold pieces of
several documents and a document may straddle blocks. Every token is listed with its rank's coordinates, its
microbatch, its row, its document and its position, and routed at random (an exact probability vector, its
top-k). The objective's groups are taken from the model: ``per_sequence`` with packing is one group per
document (all its tokens, wherever they lie), ``per_microbatch`` one per device's microbatch, ``global_batch``
one; the loss of a group is E · Σ f_i P_i over its tokens and the term the mean over the groups. The path's
groups are taken from the plan's statement: ``stats_per_row over (AXES)`` one group per row and rank outside
AXES, ``stats_per_sequence`` one per document and rank outside AXES, ``stats_per_microbatch`` one per
microbatch and rank outside AXES. With ``stats_length_weighted`` the path's value is the mean over the tokens of each token's
group's value (the groups weighted by their token counts).
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import simulator_auxstats as base

from placement_logic import ir


def tokens(plan: ir.Plan, sizes: dict[str, int], packs: list[list[int]], cyclic: bool = False) -> list[dict]:
    """Every token of the step: ``packs`` are the rows of every microbatch, each the real lengths of its documents
    (their sum a multiple of the split ranks' count). Rank coordinates of the whole-sequence axes and the
    microbatch index repeat the same packs. ``cyclic``: position p goes to split rank p mod (their count) instead
    of contiguous blocks."""
    whole, parts = base.token_layout(plan)
    part_ranks = list(product(*[range(sizes[a]) for a in parts]))
    out = []
    for w in product(*[range(sizes[a]) for a in whole]):
        for mb in range(sizes["microbatches"]):
            for row, docs in enumerate(packs):
                n = sum(docs)
                assert n % len(part_ranks) == 0, (docs, part_ranks)
                block = n // len(part_ranks)
                owner = [d for d, length in enumerate(docs) for _ in range(length)]
                for pos in range(n):
                    at = pos % len(part_ranks) if cyclic else pos // block
                    rank = dict(zip(whole, w)) | dict(zip(parts, part_ranks[at]))
                    out.append({"rank": rank, "mb": mb, "row": row, "doc": owner[pos], "pos": pos})
    return out


def objective_key(scope: str, t: dict, whole: list[str]):
    owner = tuple(t["rank"][a] for a in whole)
    if scope == "global_batch":
        return ()
    return owner + (t["mb"],) if scope == "per_microbatch" else owner + (t["mb"], t["row"], t["doc"])


def path_key(verb: str, axes: tuple[str, ...], t: dict):
    rank = tuple(sorted((a, c) for a, c in t["rank"].items() if a not in axes))
    return rank + {"stats_per_step": (), "stats_per_microbatch": (t["mb"],), "stats_per_row": (t["mb"], t["row"]),
                   "stats_per_sequence": (t["mb"], t["row"], t["doc"])}[verb]


def stated(plan: ir.Plan):
    found = [o for o in plan.overrides if o.target == "loss" and o.group == "aux" and str(o.verb).startswith("stats_per_")]
    return (str(found[-1].verb), tuple(found[-1].axes or ())) if found else None


def values(plan: ir.Plan, scope: str, sizes: dict[str, int], packs: list[list[int]], experts: int, top_k: int,
           rng: random.Random, routing=None, cyclic: bool = False) -> tuple[Fraction, Fraction]:
    """(the path's value, the objective's) on one routing: random, or ``routing(token)`` where given."""
    whole, _ = base.token_layout(plan)
    verb, axes = stated(plan) or base.default_path(plan, scope)
    got: dict = {}
    want: dict = {}
    for t in tokens(plan, sizes, packs, cyclic):
        r = routing(t) if routing else base.random_routing(rng, experts, top_k)
        got.setdefault(path_key(verb, axes, t), []).append(r)
        want.setdefault(objective_key(scope, t, whole), []).append(r)
    weighted = any(o.target == "loss" and o.group == "aux" and o.verb == "stats_length_weighted" for o in plan.overrides)
    return (per_token(got, experts, top_k) if weighted else base.loss(got, experts, top_k)), base.loss(want, experts, top_k)


def per_token(groups: dict, experts: int, top_k: int) -> Fraction:
    """The mean over every token of its group's value."""
    each = [base.loss({key: members}, experts, top_k) for key, members in groups.items() for _ in members]
    return sum(each, Fraction(0)) / len(each)


def differs(plan: ir.Plan, scope: str, sizes: dict[str, int], packs: list[list[int]], experts: int, top_k: int,
            rng: random.Random, tries: int = 6) -> bool:
    return any(a != b for a, b in (values(plan, scope, sizes, packs, experts, top_k, rng) for _ in range(tries)))
