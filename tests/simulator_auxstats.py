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
padded ones too where it says so (`stats_count_padding`). A layout may give the shards unequal
real-token counts (`uneven_layout`); a path may average its router calls' (a rank's microbatch)
own f and P with equal weights over some axes or the microbatches (`stats_equal_cell_weights`,
`stats_equal_microbatch_weights`), and count f on each call's map after the capacity step, built
token by token (`stats_after_capacity`, `stats_capacity_padded`: `capacity_map`).
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from placement_logic import ir
from placement_logic.ir.walker import fold

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
           pads: int = PAD_PER_SHARD, layout=None) -> list[dict]:
    """Every token: the coordinates of the rank routing it, its microbatch, sequence and position, and
    whether it is a padded position (``padding``: ``pads`` of them after each shard's ``real`` tokens).
    ``layout(rank, mb, seq)``, where given, says each shard's (real tokens, padded positions) instead."""
    whole, parts = token_layout(plan)
    out = []
    part_ranks = list(product(*[range(sizes[a]) for a in parts]))
    for w in product(*[range(sizes[a]) for a in whole]):
        for mb in range(sizes["microbatches"]):
            for s in range(sequences):
                for block, pr in enumerate(part_ranks):
                    rank = dict(zip(whole, w)) | dict(zip(parts, pr))
                    n_real, n_pad = layout(rank, mb, s) if layout else (real, pads if padding else 0)
                    for i in range(n_real + n_pad):
                        out.append({"rank": rank, "mb": mb, "seq": s, "pos": (block, i), "pad": i >= n_real})
    return out


def uneven_layout(rank: dict, mb: int, seq: int) -> tuple[int, int]:
    """Padding spread unevenly: a shard holds 2 real tokens, or 1 and a padded position, by the parity of
    its rank's coordinates and microbatch (a padded batch of width 2 whose real lengths differ from call to
    call; the sequence ``seq`` of a call plays no part)."""
    odd = (mb + sum(rank.values())) % 2
    return (1, 1) if odd else (2, 0)


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


def equal_weights(plan: ir.Plan) -> set[str]:
    """The axes (and "microbatches") over which the path averages its router calls' own statistics."""
    out: set[str] = set()
    for o in plan.overrides:
        if o.target == "loss" and o.group == "aux" and o.verb == "stats_equal_cell_weights":
            out |= set(o.axes or ())
        if o.target == "loss" and o.group == "aux" and o.verb == "stats_equal_microbatch_weights":
            out.add("microbatches")
    return out


def capacity_step(plan: ir.Plan):
    """("drop" | "pad", the model's capacity factor) where the path counts f after the capacity step, else None."""
    modes = {"stats_after_capacity": "drop", "stats_capacity_padded": "pad"}
    found = [modes[o.verb] for o in plan.overrides if o.target == "loss" and o.group == "aux" and o.verb in modes]
    return (found[-1], fold(plan.model.transformer.capacity_factor, {})) if found else None


def call_of(t: dict) -> tuple:
    """The router call a token is routed in: its rank and microbatch (every sequence of it at once)."""
    return tuple(sorted(t["rank"].items())), t["mb"]


def capacity_map(routed: list, experts: int, top_k: int, capacity) -> list:
    """Each token's experts in the map the path counts f on: its top-k, or, with ``capacity`` = (mode, factor),
    per router call of N tokens (taken by sequence, then position) the C = ceil(factor·k·N/E) tokens of highest
    probability among those that chose each expert (a stable sort: ties to the earlier token); mode "pad" then marks further tokens of the call, first ones first, until the expert's
    column holds min(C, N)."""
    if capacity is None:
        return [set(r[0]) for _, r in routed]
    mode, factor = capacity
    calls: dict = {}
    for n, (t, _) in enumerate(routed):
        calls.setdefault(call_of(t), []).append(n)
    out = [set() for _ in routed]
    for members in calls.values():
        members = sorted(members, key=lambda n: (routed[n][0]["seq"], routed[n][0]["pos"]))
        size = len(members)
        cap = -(-(Fraction(factor) * top_k * size) // experts)  # the ceiling
        for i in range(experts):
            # the tokens that chose i, highest probability of i first, ties to the earlier (sequence, position)
            kept = sorted((n for n in members if i in routed[n][1][0]), key=lambda n: -routed[n][1][1][i])[:cap]
            if mode == "pad":
                kept += [n for n in members if n not in kept][:max(0, min(cap, size) - len(kept))]
            for n in kept:
                out[n].add(i)
    return out


def group_fractions(members: list, experts: int, top_k: int, equal: set[str]):
    """(f, P) of a group: ``members`` are (token, routing, marked experts); pooled over the group, or, over the
    dimensions of ``equal`` (axes, "microbatches"), the mean over the parts of the group that differ there of
    each part's own pooled (f, P)."""
    parts: dict = {}
    for t, r, marked in members:
        where = tuple(t["rank"].get(a) for a in sorted(equal - {"microbatches"}))
        parts.setdefault(where + ((t["mb"],) if "microbatches" in equal else ()), []).append((r, marked))
    fs, ps = [], []
    for part in parts.values():
        n = len(part)
        fs.append([Fraction(sum(1 for _, m in part if i in m), n * top_k) for i in range(experts)])
        ps.append([sum((r[1][i] for r, _ in part), Fraction(0)) / n for i in range(experts)])
    return ([sum(x[i] for x in fs) / len(fs) for i in range(experts)],
            [sum(x[i] for x in ps) / len(ps) for i in range(experts)])


def cell_loss(routed: list, fverb: str, faxes: tuple, pverb: str, paxes: tuple, experts: int, top_k: int,
              equal: frozenset[str] = frozenset(), capacity=None) -> Fraction:
    """A path's value when each rank's statistics are its own code's: f summed over f's group, P over P's,
    each cell (the tokens sharing both) taking E · Σ f_i P_i, the mean over the cells. ``routed``: (token,
    routing) pairs of the tokens the path counts. ``equal``: over these dimensions a group's f and P are the
    mean of its router calls' own; ``capacity``: f is counted on the map after the capacity step (``capacity_map``)."""
    marks = capacity_map(routed, experts, top_k, capacity)
    fgroups: dict = {}
    pgroups: dict = {}
    cells: set = set()
    for (t, r), m in zip(routed, marks):
        fk, pk = path_key(fverb, faxes, t), path_key(pverb, paxes, t)
        fgroups.setdefault(fk, []).append((t, r, m))
        pgroups.setdefault(pk, []).append((t, r, m))
        cells.add((fk, pk))
    total = Fraction(0)
    for fk, pk in cells:
        f, _ = group_fractions(fgroups[fk], experts, top_k, equal)
        _, mean = group_fractions(pgroups[pk], experts, top_k, equal)
        total += experts * sum(f[i] * mean[i] for i in range(experts))
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
           rng: random.Random, layout=None) -> tuple[Fraction, Fraction]:
    """(the path's value, the objective's value) on one random routing."""
    routed = [(t, random_routing(rng, experts, top_k))
              for t in tokens(plan, sizes, sequences, padding=True, layout=layout)]
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
    got = cell_loss(counted, verb, axes, pverb, paxes, experts, top_k, equal_weights(plan), capacity_step(plan))
    return got, loss(want, experts, top_k)


def differs(plan: ir.Plan, scope: str, sizes: dict[str, int], sequences: int, experts: int, top_k: int,
            rng: random.Random, tries: int = 6, layout=None) -> bool:
    """Whether some random routing gives the path a value other than the objective's."""
    return any(a != b for a, b in (values(plan, scope, sizes, sequences, experts, top_k, rng, layout)
                                   for _ in range(tries)))


# Unequal real-token counts per shard, by brute force: the layouts a plan admits. A path that takes f and P
# over groups of their own (``probs_* over (AXES)``) averages its cells' E · Σ f_i P_i with equal weights; the
# tokens are laid out here shard by shard and the two values computed from them, with no use of the union.


def equal_counts(plan: ir.Plan) -> bool:
    """Whether the plan states that every device and microbatch holds as many tokens, none padded
    (``override tokens: equal``)."""
    return any(o.target == "tokens" and o.verb == "equal" and o.group is None for o in plan.overrides)


def full_layout(rank: dict, mb: int, seq: int) -> tuple[int, int]:
    """Every shard full: PER_SHARD real tokens, no padding (what ``tokens: equal`` admits)."""
    return PER_SHARD, 0


def uneven_along(dim: str):
    """The shards at coordinate 0 of ``dim`` (a mesh axis, "microbatches" or "sequences") hold one real token
    and a padded position, the others two real tokens."""
    def layout(rank: dict, mb: int, seq: int) -> tuple[int, int]:
        at = {"microbatches": mb, "sequences": seq}.get(dim, rank.get(dim))
        return (1, 1) if at == 0 else (2, 0)
    return layout


def random_layout(rng: random.Random, width: int = 3):
    """Each shard a random number of real tokens (1..width), padded to ``width``."""
    drawn: dict = {}

    def layout(rank: dict, mb: int, seq: int) -> tuple[int, int]:
        key = (tuple(sorted(rank.items())), mb, seq)
        if key not in drawn:
            real = rng.randint(1, width)
            drawn[key] = (real, width - real)
        return drawn[key]
    return layout


def admissible_layouts(plan: ir.Plan, rng: random.Random, randoms: int = 2) -> list:
    """The per-shard (real, padded) layouts a plan admits: under ``tokens: equal`` every shard full; else the
    even layout (``None``: PER_SHARD real tokens and PAD_PER_SHARD padded positions everywhere), the parity
    layout, one uneven along each dimension and ``randoms`` random ones."""
    if equal_counts(plan):
        return [full_layout]
    whole, parts = token_layout(plan)
    dims = whole + parts + ["microbatches", "sequences"]
    return [None, uneven_layout] + [uneven_along(d) for d in dims] + [random_layout(rng) for _ in range(randoms)]
