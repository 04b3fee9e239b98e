"""A brute-force oracle of the MoE layer's dispatch and combine all-to-alls on every axis role, written
from the placements (it imports nothing from ``placement_logic.check`` or ``placement_logic.ir.actflow``
and shares no code with simulator_act).

What each rank holds, per mesh axis a, read from the plan and the model's ``group experts { role = ...}``
declaration (the group's role on a, else the plan's):

* experts: on an expert axis each coordinate holds its own experts; on a pipeline axis each stage holds
  the experts of its own layers (other experts); on a tensor or sequence axis whose parameters are split
  (S, S*, O) each rank holds a shard of every expert of its group (column shard of the first weight, row
  shard of the second: the expert is the sum of the shards' products); elsewhere a whole replica.
* tokens: on a tensor axis of the plan without sequence parallelism every rank holds the same tokens
  (Megatron TP: the layer's input is replicated); on every other axis each rank holds its own.

Every rank holds a block per mesh coordinate c (the tokens bound for the experts of c's coordinates on
the expert axes), each block one token (a distinct number, the same on ranks that hold the same tokens).
The MoE layer runs: the dispatch all-to-alls (derived: one over the group's expert axes; stated:
``activations[experts]: dispatch over (AXES)``, a repeated axis another pass), each an exchange of block
c with the rank whose coordinates on the pass's axes are c's (all_to_all_single); the expert's shards,
with the expert tensor collectives derived as a correct system runs them (Megatron: the routed tokens
all-gathered over the shard axes where ranks hold their own tokens, each rank's partial product, then
an all-reduce over the shard axes where ranks hold the same tokens and a reduce-scatter over the
others); then the combine all-to-alls. Backward the same with the output gradient: combine's
conjugates (``activation_grads[experts]: combine``), the expert's transpose (the same scalar), then
dispatch's conjugates. Every block is compared with its token times the factor of the single-device
expert it is bound for in its own stage's layer.

``violations(plan, sizes)`` returns ``("act", "experts")`` / ``("grad", "experts")``.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from placement_logic import ir

SPLIT = (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O)


def _group_roles(plan: ir.Plan) -> dict[str, ir.Role]:
    for g in plan.model.groups:
        if g.name == "experts" and g.roles:
            return dict(g.roles)
    return {}


def layout(plan: ir.Plan) -> tuple[dict[str, str], dict[str, str]]:
    """(what each axis's ranks hold of the experts: expert | layer | shard | replica,
    of the tokens: own | same)."""
    own = _group_roles(plan)
    params = plan.placement(ir.State.PARAMS)
    sp = plan.sequence_parallel or any(plan.role(a) is ir.Role.SEQUENCE for a in plan.mesh.names)
    experts, tokens = {}, {}
    for a in plan.mesh.names:
        plain = plan.role(a)
        role = own.get(a, plain)
        if plain is ir.Role.PIPELINE:
            experts[a] = "layer"
        elif role is ir.Role.EXPERT:
            experts[a] = "expert"
        elif role in (ir.Role.TENSOR, ir.Role.SEQUENCE) and (role is not plain or params.mode(a) in SPLIT):
            experts[a] = "shard"
        else:
            experts[a] = "replica"
        tokens[a] = "same" if plain is ir.Role.TENSOR and not sp else "own"
    return experts, tokens


def _stated_axes(plan: ir.Plan, target: str, verb: str):
    found = None
    for o in plan.overrides:
        if o.target == target and o.verb == verb and o.group in (None, "experts"):
            found = tuple(o.axes or ())
    return found


def _passes(axes: tuple[str, ...]) -> list[tuple[str, ...]]:
    out: list[list[str]] = []
    for a in axes:
        if not out or a in out[-1]:
            out.append([])
        out[-1].append(a)
    return [tuple(p) for p in out]


def _a2a(idx: dict[str, int], axes, bufs: dict) -> dict:
    """One all-to-all pass over ``axes``: each rank's block c goes to the rank whose coordinates on the axes
    are c's, into the slot of the sender's coordinates there."""
    out: dict = {d: {} for d in bufs}
    for d, buf in bufs.items():
        for c, v in buf.items():
            dest, slot = list(d), list(c)
            for a in axes:
                dest[idx[a]], slot[idx[a]] = c[idx[a]], d[idx[a]]
            out[tuple(dest)][tuple(slot)] = v
    return out


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    names = plan.mesh.names
    held, tok = layout(plan)
    if "expert" not in held.values():
        return set()
    idx = {a: i for i, a in enumerate(names)}
    devices = list(product(*(range(sizes[a]) for a in names)))

    def number(c: tuple, axes) -> int:
        n = 0
        for a in axes:
            n = n * sizes[a] + c[idx[a]]
        return n

    ex = [a for a in names if held[a] == "expert"]
    layer = [a for a in names if held[a] == "layer"]
    shard_own = [a for a in names if held[a] == "shard" and tok[a] == "own"]
    shard_same = [a for a in names if held[a] == "shard" and tok[a] == "same"]
    shards = [a for a in names if held[a] == "shard"]
    nshards = 1
    for a in shards:
        nshards *= sizes[a]

    def factor(j: int, s: int, t: int) -> Fraction:  # shard t of expert j of stage s's layer
        return Fraction(3 * j + 2, 1) * (2 * s + 1) + Fraction(t + 1, 7 * (j + 1))

    def full(j: int, s: int) -> Fraction:
        return sum((factor(j, s, t) for t in range(nshards)), Fraction(0))

    def peers(d: tuple, axes) -> list[tuple]:
        return [d2 for d2 in devices if all(d2[i] == d[i] for i, a in enumerate(names) if a not in axes)]

    def expert(bufs):
        # all-gather over the shard axes with own tokens: keyed by (origin, block)
        def origin(p: tuple) -> tuple:
            return tuple(p[idx[a]] for a in shard_own)

        gathered = {d: {(origin(p), c): v for p in peers(d, shard_own) for c, v in bufs[p].items()} for d in devices}
        part = {d: {k: v * factor(number(d, ex), number(d, layer), number(d, shards)) for k, v in buf.items()}
                for d, buf in gathered.items()}
        summed = {}
        for d in devices:  # all-reduce over the shard axes with the same tokens
            acc: dict = {}
            for p in peers(d, shard_same):
                for k, v in part[p].items():
                    acc[k] = acc.get(k, 0) + v
            summed[d] = acc
        # reduce-scatter over the shard axes with own tokens: d gets the sum of its own blocks
        return {d: {c: sum(summed[p][(origin(d), c)] for p in peers(d, shard_own)) for c in bufs[d]} for d in devices}

    def token(d: tuple, c: tuple, base: int) -> Fraction:
        key = tuple(0 if tok[a] == "same" else d[i] for i, a in enumerate(names))
        return Fraction(base + 1000 * (devices.index(key) * len(devices) + devices.index(c)) + 1)

    derived = tuple(ex)
    found = set()
    for tag, target, order, base in (("act", "activations", ("dispatch", "combine"), 0),
                                     ("grad", "activation_grads", ("combine", "dispatch"), 7)):
        x = {d: {c: token(d, c, base) for c in devices} for d in devices}
        bufs = x
        stated = _stated_axes(plan, target, order[0])
        for axes in _passes(derived if stated is None else stated):
            bufs = _a2a(idx, axes, bufs)
        bufs = expert(bufs)
        stated = _stated_axes(plan, target, order[1])
        for axes in _passes(derived if stated is None else stated):
            bufs = _a2a(idx, axes, bufs)
        if any(bufs[d][c] != x[d][c] * full(number(c, ex), number(d, layer)) for d in devices for c in devices):
            found.add((tag, "experts"))
    return found
