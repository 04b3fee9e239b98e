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
random routings. A path may take the mean probabilities over a group of their own (`probs_* over
(AXES)`): each cell of tokens sharing both groups computes E · Σ f_i P_i with its f-group's f and
its P-group's P, and the path's value is the mean over the cells. Every sequence's shards carry
padded positions besides their tokens; the objective counts the real tokens only, the path the
padded ones too where it says so (`stats_count_padding`).
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from placement_logic import ir

PER_SHARD = 2  # tokens of a sequence on each rank that holds a part of it
PAD_PER_SHARD = 1  # padded positions beside them, where a batch is padded


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


def tokens(plan: ir.Plan, sizes: dict[str, int], sequences: int, padding: bool = False, real: int = PER_SHARD,
           pads: int = PAD_PER_SHARD) -> list[dict]:
    """Every token: the coordinates of the rank routing it, its microbatch, sequence and position, and
    whether it is a padded position (``padding``: ``pads`` of them after each shard's ``real`` tokens)."""
    whole, parts = token_layout(plan)
    out = []
    part_ranks = list(product(*[range(sizes[a]) for a in parts]))
    per = real + (pads if padding else 0)
    for w in product(*[range(sizes[a]) for a in whole]):
        for mb in range(sizes["microbatches"]):
            for s in range(sequences):
                for block, pr in enumerate(part_ranks):
                    for i in range(per):
                        rank = dict(zip(whole, w)) | dict(zip(parts, pr))
                        out.append({"rank": rank, "mb": mb, "seq": s, "pos": block * per + i, "pad": i >= real})
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


def stated_path(plan: ir.Plan, prefix: str = "stats_per_"):
    """The last statement whose verb starts with ``prefix`` (``probs_per_``: P's own group), as (the
    grouping verb ``stats_per_*``, its axes), or None."""
    found = [o for o in plan.overrides if o.target == "loss" and o.group == "aux" and str(o.verb).startswith(prefix)]
    if not found:
        return None
    return "stats_per_" + str(found[-1].verb)[len(prefix):], tuple(found[-1].axes or ())


def counts_padding(plan: ir.Plan) -> bool:
    return any(o.target == "loss" and o.group == "aux" and o.verb == "stats_count_padding" for o in plan.overrides)


def cell_loss(routed: list, fverb: str, faxes: tuple, pverb: str, paxes: tuple, experts: int, top_k: int) -> Fraction:
    """A path's value when each rank's statistics are its own code's: f summed over f's group, P over P's,
    each cell (the tokens sharing both) taking E · Σ f_i P_i, the mean over the cells. ``routed``: (token,
    routing) pairs of the tokens the path counts."""
    fgroups: dict = {}
    pgroups: dict = {}
    cells: set = set()
    for t, r in routed:
        fk, pk = path_key(fverb, faxes, t), path_key(pverb, paxes, t)
        fgroups.setdefault(fk, []).append(r)
        pgroups.setdefault(pk, []).append(r)
        cells.add((fk, pk))
    total = Fraction(0)
    for fk, pk in cells:
        slots = [0] * experts
        for chosen, _ in fgroups[fk]:
            for i in chosen:
                slots[i] += 1
        ps = pgroups[pk]
        mean = [sum((p[i] for _, p in ps), Fraction(0)) / len(ps) for i in range(experts)]
        total += experts * sum(Fraction(slots[i], len(fgroups[fk]) * top_k) * mean[i] for i in range(experts))
    return total / len(cells)


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
    routed = [(t, random_routing(rng, experts, top_k)) for t in tokens(plan, sizes, sequences, padding=True)]
    return path_and_objective(plan, scope, routed, experts, top_k)


def path_and_objective(plan: ir.Plan, scope: str, routed: list, experts: int, top_k: int) -> tuple[Fraction, Fraction]:
    """(the path's value, the objective's) on ``routed``: every position of the batch, padded ones
    included, with its routing. The objective counts the real tokens; the path counts the padding too
    where it says so."""
    whole, _ = token_layout(plan)
    verb, axes = stated_path(plan) or default_path(plan, scope)
    pverb, paxes = stated_path(plan, "probs_per_") or (verb, axes)
    pad = counts_padding(plan)
    want: dict = {}
    for t, r in routed:
        if not t["pad"]:
            want.setdefault(objective_key(scope, t, whole), []).append(r)
    counted = [(t, r) for t, r in routed if pad or not t["pad"]]
    return cell_loss(counted, verb, axes, pverb, paxes, experts, top_k), loss(want, experts, top_k)


def differs(plan: ir.Plan, scope: str, sizes: dict[str, int], sequences: int, experts: int, top_k: int,
            rng: random.Random, tries: int = 6) -> bool:
    """Whether some random routing gives the path a value other than the objective's."""
    return any(a != b for a, b in (values(plan, scope, sizes, sequences, experts, top_k, rng) for _ in range(tries)))
