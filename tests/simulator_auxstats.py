"""The MoE load-balancing loss computed on concrete routings, written from docs/semantics.md
("Loss terms", the aux term's statistics) without the checker's code.

Every token of the step is listed with the rank that routes it: a data-parallel or expert rank
(each holds its own sequences), a microbatch, a sequence of that microbatch and a position; the
positions of a sequence are dealt out in blocks to the context ranks and, under sequence
parallelism, the tensor ranks. A routing gives each token a probability vector over E experts
and its top-k experts. The loss of a set of tokens is E · Σ_i f_i · P_i (f_i: the fraction of
the set's k routing slots on expert i, P_i: the set's mean probability of i); the term is the
mean over the sets a grouping makes. The objective's grouping (`aux_stats`) and the plan's path
(`loss[aux]: stats_* over (AXES)`) each assign every token a key; their values are compared on
random routings.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from placement_logic import ir

PER_SHARD = 2  # tokens of a sequence on each rank that holds a part of it


def token_layout(plan: ir.Plan) -> tuple[list[str], list[str]]:
    """(axes whose ranks hold different sequences, axes whose ranks hold different parts of one sequence)."""
    sp = plan.sequence_parallel or any(plan.role(a) == ir.Role.SEQUENCE for a in plan.mesh.names)
    whole, parts = [], []
    for a in plan.mesh.names:
        r = plan.role(a)
        if r == ir.Role.CONTEXT or (sp and r in (ir.Role.TENSOR, ir.Role.SEQUENCE)):
            parts.append(a)
        elif r in (ir.Role.DATA, ir.Role.EXPERT):
            whole.append(a)
    return whole, parts


def tokens(plan: ir.Plan, sizes: dict[str, int], sequences: int) -> list[dict]:
    """Every token: the coordinates of the rank routing it, its microbatch, sequence and position."""
    whole, parts = token_layout(plan)
    out = []
    part_ranks = list(product(*[range(sizes[a]) for a in parts]))
    for w in product(*[range(sizes[a]) for a in whole]):
        for mb in range(sizes["microbatches"]):
            for s in range(sequences):
                for block, pr in enumerate(part_ranks):
                    for i in range(PER_SHARD):
                        rank = dict(zip(whole, w)) | dict(zip(parts, pr))
                        out.append({"rank": rank, "mb": mb, "seq": s, "pos": block * PER_SHARD + i})
    return out


def objective_key(scope: str, t: dict, whole: list[str]):
    if scope == "global_batch":
        return ()
    owner = tuple(t["rank"][a] for a in whole)  # the rank that holds the whole sequence's batch slot
    return owner + (t["mb"],) if scope == "per_microbatch" else owner + (t["mb"], t["seq"])


def path_key(verb: str, axes: tuple[str, ...], t: dict):
    """Tokens share statistics when their ranks differ only on the summed axes (and, by the verb,
    in their sequence and microbatch)."""
    rank = tuple(sorted((a, c) for a, c in t["rank"].items() if a not in axes))
    if verb == "stats_per_step":
        return rank
    if verb == "stats_per_microbatch":
        return rank + (("mb", t["mb"]),)
    return rank + (("mb", t["mb"]), ("seq", t["seq"]))


def default_path(plan: ir.Plan, scope: str) -> tuple[str, tuple[str, ...]]:
    """What a system following the objective gathers: the verb and axes the docs give for it."""
    whole, parts = token_layout(plan)
    if scope == "global_batch":
        return "stats_per_step", tuple(whole + parts)
    return ("stats_per_microbatch" if scope == "per_microbatch" else "stats_per_sequence"), tuple(parts)


def stated_path(plan: ir.Plan):
    found = [o for o in plan.overrides if o.target == "loss" and o.group == "aux" and str(o.verb).startswith("stats_")]
    return (str(found[-1].verb), tuple(found[-1].axes or ())) if found else None


def loss(groups: dict, experts: int, top_k: int) -> Fraction:
    total = Fraction(0)
    for members in groups.values():
        n = len(members)
        slots = [0] * experts
        prob = [Fraction(0)] * experts
        for chosen, p in members:
            for i in chosen:
                slots[i] += 1
            for i in range(experts):
                prob[i] += p[i]
        total += experts * sum(Fraction(slots[i], n * top_k) * prob[i] / n for i in range(experts))
    return total / len(groups)


def random_routing(rng: random.Random, experts: int, top_k: int):
    """A probability vector (exact, positive) and its top-k experts (ties to the lower index)."""
    w = [rng.randint(1, 9) for _ in range(experts)]
    p = tuple(Fraction(x, sum(w)) for x in w)
    chosen = tuple(sorted(sorted(range(experts), key=lambda i: (-p[i], i))[:top_k]))
    return chosen, p


def values(plan: ir.Plan, scope: str, sizes: dict[str, int], sequences: int, experts: int, top_k: int,
           rng: random.Random) -> tuple[Fraction, Fraction]:
    """(the path's value, the objective's value) on one random routing."""
    whole, _ = token_layout(plan)
    verb, axes = stated_path(plan) or default_path(plan, scope)
    got: dict = {}
    want: dict = {}
    for t in tokens(plan, sizes, sequences):
        r = random_routing(rng, experts, top_k)
        got.setdefault(path_key(verb, axes, t), []).append(r)
        want.setdefault(objective_key(scope, t, whole), []).append(r)
    return loss(got, experts, top_k), loss(want, experts, top_k)


def differs(plan: ir.Plan, scope: str, sizes: dict[str, int], sequences: int, experts: int, top_k: int,
            rng: random.Random, tries: int = 6) -> bool:
    """Whether some random routing gives the path a value other than the objective's."""
    return any(a != b for a, b in (values(plan, scope, sizes, sequences, experts, top_k, rng) for _ in range(tries)))
