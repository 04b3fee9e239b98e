"""A concrete simulator of one training step, written from docs/semantics.md.

Independent of the checker's code (it imports nothing from ``placement_logic.check``):
given an ``ir.Plan`` and concrete sizes, it enumerates every device, draws random token
counts and exact ``Fraction`` gradient contributions, executes the plan's reductions
(an all-reduce really sums the buffers of the devices of an axis group; a second one sums
again), loss weights, accumulation and divisor, and compares every device's gradient with
the single-device reference Σ s / T. On a tensor axis whose ranks hold copies of a group's
elements and use them with their own query heads (the query/key norms, K kv heads on more
than K ranks) each rank's heads are a source of their own and a rank holds the element of
its copy group (``head_copies``). It also evaluates the placement conditions of the
update and the clip-norm and overflow reductions by concrete computation.

``violations(plan, sizes, rng, trials)`` returns the violated conditions as keys:
``("gi", group)``, ``("usable", axis)``, ``("gathered", axis)``, ``("optimizer", axis)``,
``("clip",)``, ``("overflow",)``, ``("regather",)``.

Parameter groups with modes of their own (a ``group`` block's ``params``, ``optimizer``,
``grads``): each group's states are read from the declaration here — the plan's mode on
every axis the group does not place itself — and its reductions, gathers and re-gathers are
the collectives of the schedule that move its buffer (a collective names the groups it
carries). A user group's gradient class is its ``like``.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from itertools import product

from placement_logic import ir
from placement_logic.ir import collectives

MB = "microbatches"
DATA_LIKE = (ir.Role.DATA, ir.Role.CONTEXT)
TENSOR = (ir.Role.TENSOR, ir.Role.SEQUENCE)
SPLIT_PARAMS = (ir.Mode.S, ir.Mode.O)
GRAD_SPLIT = (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.M, ir.Mode.O)

PARTIAL, SPLIT, INVARIANT, SHARDED, COMPLETE, TIE = "partial", "split", "invariant", "sharded", "complete", "tie"
HEADS = "heads"  # a tensor axis whose ranks hold copies of the group's elements, each used by the rank's own heads


# --------------------------------------------------------------------------- reading the plan


def _overrides(plan: ir.Plan, target: str, verb: str | None = None, group: str | None = "*") -> list[ir.Override]:
    return [o for o in plan.overrides if o.target == target and (verb is None or o.verb == verb)
            and (group == "*" or o.group == group)]


def _last_for(plan: ir.Plan, target: str, verb: str, group: str) -> ir.Override | None:
    for g in (group, "all", None):
        found = _overrides(plan, target, verb, g)
        if found:
            return found[-1]
    return None


BUILTIN_CLASSES = ("dense", "norms", "biases", "experts", "router", "embedding")


def _decl(plan: ir.Plan, group: str):
    return next((d for d in plan.model.groups if d.name == group), None)


def kind_of(plan: ir.Plan, group: str) -> str:
    """The gradient class a group follows: its own name, or a user group's ``like``."""
    d = _decl(plan, group)
    return group if group in BUILTIN_CLASSES or d is None else (d.like or "dense")


def group_role(plan: ir.Plan, group: str, axis: str) -> ir.Role:
    """The role ``axis`` plays for ``group``: the group's own (``role = {AXIS: ...}``, MoE
    parallel folding) where it gives one, else the plan's."""
    d = _decl(plan, group)
    own = dict(d.roles) if d is not None and getattr(d, "roles", None) else {}
    return own.get(axis, plan.role(axis))


def mode(plan: ir.Plan, group: str, state: ir.State, axis: str) -> ir.Mode:
    """The group's mode for ``state`` on ``axis``: its own where it gives one; on an axis whose
    role the group changes, S for an expert or tensor role (each rank holds its own experts or
    slices) and, for a data role, the mode the plan's data axes give the state; else the plan's."""
    d = _decl(plan, group)
    own = dict(dict(d.modes).get(state, ())) if d is not None else {}
    if axis in own:
        return own[axis]
    r = group_role(plan, group, axis)
    if r is not plan.role(axis):
        if r in (ir.Role.EXPERT,) + TENSOR:
            return ir.Mode.S
        data = [a for a in plan.mesh.names if plan.role(a) is ir.Role.DATA]
        m = plan.placement(state).mode(data[0]) if data else ir.Mode.R
        return ir.Mode.R if m is ir.Mode.M and state is not ir.State.GRADS else m
    return plan.placement(state).mode(axis)


def own_mode(plan: ir.Plan, group: str, state: ir.State, axis: str) -> bool:
    d = _decl(plan, group)
    return d is not None and axis in dict(dict(d.modes).get(state, ()))


def carries(c, group: str) -> bool:
    """Whether collective ``c`` moves this group's buffer."""
    if c.payload.groups is not None:
        return group in c.payload.groups
    return group not in c.payload.without


def groups_of(plan: ir.Plan) -> list[str]:
    return _builtin_groups(plan) + [d.name for d in plan.model.groups
                                    if d.name not in BUILTIN_CLASSES and d.name not in _BUILTIN_NAMES]


_BUILTIN_NAMES = ("embedding", "attention", "kv", "attention_latent", "mlp", "mlp_biases", "experts", "shared_experts",
                  "expert_biases", "router", "biases", "norms", "final_norm", "head", "mtp", "dense")


def _builtin_groups(plan: ir.Plan) -> list[str]:
    t = plan.model.transformer
    out = ["dense", "norms"]
    if t is None or t.bias:
        out.append("biases")
    experts = bool(plan.axes_with_role(ir.Role.EXPERT)) or (
        t is not None and isinstance(t.experts, ir.Const) and t.experts.value > 1)
    if experts:
        out.append("experts")
    if t is not None and isinstance(t.experts, ir.Const) and t.experts.value > 1:
        out.append("router")  # the MoE router: a whole matrix on every tensor rank
    if t is not None and isinstance(t.kv_heads, ir.Const) and t.kv_heads.value == 1:
        out.insert(1, "kv")  # the K/V projections of a single head
    if t is not None and t.qk_norm:
        out.insert(out.index("norms") + 1, "qk_norms")  # the query and key norms shared by the heads
    out.append("embedding")
    return out


def head_copies(plan: ir.Plan, group: str, axis: str, n: int) -> int | None:
    """How many consecutive ranks of tensor ``axis`` (size n) hold one copy of each element of
    ``group`` and use it with their own query heads only: every rank for the query/key norms, n/K
    for K kv heads on n > K ranks; None where the axis splits the elements or the group sees no heads."""
    t = plan.model.transformer
    if t is None or plan.role(axis) not in TENSOR:
        return None
    if group == "qk_norms":
        return n
    k = int(t.kv_heads.value) if isinstance(t.kv_heads, ir.Const) else None
    if group == "kv" and k is not None and plan.placement(ir.State.PARAMS).mode(axis) in SPLIT_PARAMS and n > k:
        return n // k
    if group == "kv" and k == 1:
        return n
    return None


def tied(plan: ir.Plan) -> bool:
    t = plan.model.transformer
    return bool(t is not None and t.tied_embeddings)


def sequence_parallel(plan: ir.Plan) -> bool:
    return plan.sequence_parallel or bool(plan.axes_with_role(ir.Role.SEQUENCE))


def axis_type(plan: ir.Plan, group: str, axis: str) -> str:
    """The type of group's gradient contribution along ``axis`` (semantics.md's table), by the
    role the axis plays for the group."""
    role = group_role(plan, group, axis)
    params = mode(plan, group, ir.State.PARAMS, axis)
    group = kind_of(plan, group)
    if role in DATA_LIKE:
        return PARTIAL
    if role is ir.Role.EXPERT:
        if group == "experts" and params in SPLIT_PARAMS:
            return COMPLETE
        return PARTIAL
    if role in TENSOR:
        if group == "qk_norms":
            return HEADS
        if group in ("norms", "biases", "router"):
            return SPLIT if sequence_parallel(plan) else INVARIANT
        return SHARDED if params in SPLIT_PARAMS else INVARIANT
    if role is ir.Role.PIPELINE:
        return TIE if (group == "embedding" and tied(plan)) else SHARDED
    raise ValueError(role)


def token_axes(plan: ir.Plan) -> list[str]:
    return [a for a in plan.mesh.names if plan.role(a) in DATA_LIKE + (ir.Role.EXPERT,)]


def reductions(plan: ir.Plan, group: str) -> Counter:
    """How many times the plan all-reduces group's gradient over each axis (and the tie)."""
    counts: Counter = Counter()
    kind = kind_of(plan, group)
    for c in collectives.derive(plan):
        if c.phase is collectives.Phase.GRAD_SYNC and c.state is ir.State.GRADS:
            if c.payload.tensor == f"grads:{group}" and c.size is not None:  # over each copy group of the axes
                counts.update((a, "copies") for a in c.axes)
            elif carries(c, group) and (c.payload.tensor in ("grads", f"grads:{group}")
                                        or (c.payload.tensor == "dense_grads" and kind != "experts")
                                        or (c.payload.tensor == "expert_grads" and kind == "experts")):
                counts.update(c.axes)
    if kind in ("norms", "biases", "router") and sequence_parallel(plan):
        for a in plan.mesh.names:
            if plan.role(a) in TENSOR:
                counts[a] += 1
    tie = Counter()
    for a in plan.mesh.names:
        if axis_type(plan, group, a) == TIE:
            tie[a] = 1
    red = _last_for(plan, "grads", "reduce", group)
    if red is not None:
        counts = Counter(red.axes or ())
        tie = Counter({a: counts[a] for a in tie})
    tie_o = _overrides(plan, "embedding", "tie_reduce")
    if kind == "embedding" and tie_o:
        tie = Counter({a: Counter(tie_o[-1].axes or ())[a] for a in tie})
    for a in tie:
        counts[a] = tie[a]
    return counts


def _value(v: ir.Value, sizes: dict[str, int], plan: ir.Plan, bindings: dict) -> Fraction:
    if isinstance(v, ir.Const):
        return Fraction(v.value)
    if isinstance(v, ir.Sym):
        if v.name in sizes:
            return Fraction(sizes[v.name])
        if isinstance(plan.model.microbatches, ir.Sym) and v.name == plan.model.microbatches.name:
            return Fraction(sizes[MB])
        return _value(bindings[v.name], sizes, plan, bindings)
    args = [_value(x, sizes, plan, bindings) for x in v.args]
    if v.op == "+":
        return sum(args, Fraction(0))
    if v.op == "-":
        return args[0] - sum(args[1:], Fraction(0)) if len(args) > 1 else -args[0]
    if v.op == "*":
        out = Fraction(1)
        for x in args:
            out *= x
        return out
    if v.op == "/":
        return args[0] / args[1]
    if v.op == "^":
        return args[0] ** int(args[1])
    raise ValueError(v.op)


# --------------------------------------------------------------------------- gradient integrity


def _ignored(plan: ir.Plan, count: dict, rng: random.Random) -> dict:
    """The ignored tokens (label -100) of each piece that the plan's count includes (tokens: count_ignored):
    0 to 2 per piece, one at least in the first; none where the count is of the labelled tokens only."""
    if not _overrides(plan, "tokens", "count_ignored", None):
        return {}
    ignored = {key: rng.randint(0, 2) for key in count}
    first = next(iter(ignored))
    ignored[first] = max(1, ignored[first])
    return ignored


def _ignored_terms(plan: ir.Plan, count: dict, rng: random.Random) -> dict:
    """The ignored tokens of each piece whose loss terms the loss sums (tokens: ignored_in_loss: no ignore_index,
    no loss mask): 0 to 2 per piece, one at least in the first; none where the cross entropy ignores them."""
    if not _overrides(plan, "tokens", "ignored_in_loss", None):
        return {}
    terms = {key: rng.randint(0, 2) for key in count}
    first = next(iter(terms))
    terms[first] = max(1, terms[first])
    return terms


# an ignored token's term's gradient contribution (its softmax, label -100 matching no word): far larger than the
# drawn contributions (|s| <= 4), so no normaliser (a count with the ignored tokens too) can compensate it
IGNORED_TERM = Fraction(10 ** 6)


def _clamped(plan: ir.Plan) -> bool:
    """Whether each microbatch's local count is clamped to >= 1 before it is summed and reduced: a piece may
    then hold no token."""
    return bool(_overrides(plan, "tokens", "clamp_before_reduce", None))


def _draw_counts(plan: ir.Plan, tokens: list[str], sizes: dict[str, int], rng: random.Random) -> dict:
    """The token count of each piece ((token coordinates, microbatch)): varying only along the token axes and
    microbatches, all one drawn value where the plan states equal counts; the step holds a token."""
    equal = bool(_overrides(plan, "tokens", "equal", None))
    clamp = _clamped(plan)
    count: dict = {}
    c0 = rng.randint(1, 3)
    for tc in product(*[range(sizes[a]) for a in tokens]):
        for mu in range(sizes[MB]):
            count[(tc, mu)] = c0 if equal else rng.randint(0 if clamp else 1, 3)
    if not any(count.values()):  # the step holds a token
        count[next(iter(count))] = 1
    return count


def _divisor(plan: ir.Plan, group: str, sizes: dict[str, int], bindings: dict, loss: str, tokens: list[str]):
    """What the accumulated gradient is divided by: the group's ``grads: divide``, else the loss's (the token
    ranks for a per-device mean, and the microbatches too for a per-microbatch one), else 1."""
    div_o = _last_for(plan, "grads", "divide", group)
    if div_o is not None:
        return _value(div_o.by, sizes, plan, bindings)
    if loss == "per_device_mean":
        return _prod(sizes[a] for a in tokens)
    if loss == "per_microbatch_mean":
        return _prod(sizes[a] for a in tokens) * sizes[MB]
    return Fraction(1)


def _accumulated(plan: ir.Plan, group: str, bufs: list[dict], devices: list, sizes: dict[str, int], bindings: dict,
                 loss: str, tokens: list[str]) -> tuple[dict, Fraction] | None:
    """(each device's gradient accumulated over the microbatches' reduced buffers, its divisor); None where the
    step's microbatches are not whole rounds of the nested schedule the plan states."""
    m = sizes[MB]
    acc_o = _last_for(plan, "grads", "no_accumulation_buffer", group)
    final = ({d: sum((b[d] for b in bufs), Fraction(0)) for d in devices} if acc_o is None else dict(bufs[-1]))
    # nested accumulation: the step's m microbatches as m / M rounds of a pipeline schedule of M
    nest = _overrides(plan, "accumulation", None, None)
    if not nest:
        return final, _divisor(plan, group, sizes, bindings, loss, tokens)
    per_round = _value(nest[-1].by, sizes, plan, bindings)
    if per_round.denominator != 1 or m % int(per_round):
        return None
    ranks = _prod(sizes[a] for a in tokens)
    if nest[-1].verb == "rescaled_every_round":
        M = int(per_round)
        rounds = m // M
        final = {d: Fraction(0) for d in devices}
        for r in range(rounds):  # add this round's microbatches (each loss / rounds), then scale the buffer
            final = {d: final[d] + sum((bufs[r * M + j][d] for j in range(M)), Fraction(0)) / rounds for d in devices}
            final = {d: v / M for d, v in final.items()}
        return final, ranks
    if nest[-1].verb == "outer_undivided":
        return final, ranks * per_round  # the schedule divides by M; the rounds are summed
    if nest[-1].verb == "inner_undivided":
        return final, ranks * Fraction(m) / per_round  # the microbatches summed; / the rounds
    return final, _divisor(plan, group, sizes, bindings, loss, tokens)


def _routed(dev: tuple, complete: list[str], pos: dict[str, int], n: dict[str, int]) -> list[tuple]:
    """The devices whose tokens reach ``dev``'s element: ``dev`` with its coordinate on each complete axis
    replaced by every rank of that axis (a routed expert receives tokens from every rank of its axis)."""
    out = []
    for extra in product(*[range(n[a]) for a in complete]):
        src = list(dev)
        for a, c in zip(complete, extra):
            src[pos[a]] = c
        out.append(tuple(src))
    return out


def _reduced(plan: ir.Plan, bufs: list[dict], k: Counter, pos: dict[str, int], joint, n: dict[str, int]) -> list[dict]:
    """Each microbatch's buffers after the plan's all-reduces of the group's gradient, axis by axis: k[a] over the
    axis, then one over each group of n/K consecutive ranks holding one kv head (of the axis, or of the joint
    index) where the schedule reduces over the copies."""
    import simulator_kvproduct as kvp

    for a in pos:
        for _ in range(k[a]):
            bufs = [_allreduce(b, pos[a]) for b in bufs]
        bufs = kvp.reduce_copies(bufs, a, k, pos, joint, n, lambda b, a=a: _allreduce_copies(
            b, pos[a], n[a] // int(plan.model.transformer.kv_heads.value)))
    return bufs


def gi_ok(plan: ir.Plan, group: str, sizes: dict[str, int], rng: random.Random, bindings: dict) -> bool:
    axes = list(plan.mesh.names)
    n = {a: sizes[a] for a in axes}
    m = sizes[MB]
    types = {a: axis_type(plan, group, a) for a in axes}
    copies = {a: c for a in axes if (c := head_copies(plan, group, a, n[a])) is not None}
    import simulator_kvproduct as kvp  # kv heads copied over several tensor axes: the joint index

    joint = kvp.layout(plan, group, n)
    copies = kvp.off_layout(copies, joint)
    types.update(dict.fromkeys(list(copies) + list(kvp.axes(joint)), HEADS))
    k = reductions(plan, group)
    tokens = token_axes(plan)
    devices = list(product(*[range(n[a]) for a in axes]))
    pos = {a: i for i, a in enumerate(axes)}
    clamp = _clamped(plan)
    # ε added to each microbatch's local count before it is summed and reduced; single-device training adds it once
    eps_o = _overrides(plan, "tokens", "eps_before_reduce", None)
    eps = _value(eps_o[-1].by, sizes, plan, bindings) if eps_o else Fraction(0)

    count = _draw_counts(plan, tokens, sizes, rng)
    ignored = _ignored(plan, count, rng)
    terms = _ignored_terms(plan, count, rng)

    def tcoord(dev) -> tuple:
        return tuple(dev[pos[a]] for a in tokens)

    total_tokens = sum(count.values())

    # the element a device holds: its coordinates on sharded (and complete) axes; on a heads axis the
    # element its copy group holds (rank // copies)
    elem_axes = [a for a in axes if types[a] in (SHARDED, COMPLETE, HEADS)]

    own_axes = kvp.off_axes(elem_axes, joint)

    def elem(dev) -> tuple:  # over several copy axes: the head their joint index names
        return tuple(dev[pos[a]] // copies[a] if a in copies else dev[pos[a]] for a in own_axes) \
            + kvp.head_key(dev, pos, joint, n)

    # true per-source contributions: vary along partial, split, tie and complete axes; not along invariant ones;
    # on a heads axis each rank's own query heads are a source of their own
    src_axes = [a for a in axes if types[a] in (PARTIAL, SPLIT, TIE, COMPLETE, HEADS)]
    contrib: dict = {}

    def source(dev, mu) -> tuple:
        return (elem(dev), tuple(dev[pos[a]] for a in src_axes), mu)

    added: dict = {}  # the ignored tokens' terms each (element, source) adds where the loss sums them

    def draw(key: tuple, dev) -> Fraction:
        if key not in contrib:
            held = all(not (types[a] == TIE and 0 < dev[pos[a]] < n[a] - 1) for a in axes)
            holds = held and count[(tcoord(dev), key[2])] > 0  # a piece without a token contributes nothing
            contrib[key] = Fraction(rng.randint(-4, 4), rng.randint(1, 3)) if holds else Fraction(0)
            added[key] = IGNORED_TERM * terms.get((tcoord(dev), key[2]), 0) if held else 0
        return contrib[key]

    # every (element, source) pair: a routed expert receives tokens from every rank of its axis
    complete_axes = [a for a in axes if types[a] == COMPLETE]
    for dev in devices:
        for mu in range(m):
            for src in _routed(dev, complete_axes, pos, n):
                draw((elem(dev), tuple(src[pos[a]] for a in src_axes), mu), src)

    # loss weights
    loss_o = _overrides(plan, "loss", None, None)  # loss[TERM]: a loss term's path (term_ok)
    loss = loss_o[-1].verb if loss_o else "global_mean"
    tok_o = _overrides(plan, "tokens", "reduce", None)
    norm_axes = list(tok_o[-1].axes or ()) if tok_o else list(tokens)

    # global mean: the device's count accumulated over microbatches, all-reduced over each listed axis in turn
    def counted(c: int, key: tuple) -> Fraction:
        return (max(c, 1) if clamp else c) + eps + ignored.get(key, 0)

    reduced = {d: sum(counted(count[(tcoord(d), u)], (tcoord(d), u)) for u in range(m)) for d in devices}
    for a in norm_axes:
        reduced = _allreduce(reduced, pos[a])

    def normaliser(dev, mu) -> Fraction:
        if loss == "sum":
            return Fraction(1)
        if loss == "per_microbatch_mean":
            key = (tcoord(dev), mu)
            return Fraction(counted(count[key], key) if clamp or ignored else count[key])
        if loss == "per_device_mean":
            return Fraction(sum(counted(count[(tcoord(dev), u)], (tcoord(dev), u)) for u in range(m)))
        return Fraction(reduced[tuple(dev)])

    # local gradient of each device and microbatch (buffer position: the element it holds)
    def local(dev, mu) -> Fraction:
        out = Fraction(0)
        for src in _routed(dev, complete_axes, pos, n):  # tokens routed from that rank to this rank's expert
            key = (elem(dev), tuple(src[pos[a]] for a in src_axes), mu)
            out += (contrib[key] + added.get(key, 0)) / normaliser(src, mu)
        return out

    bufs = _reduced(plan, [{dev: local(dev, mu) for dev in devices} for mu in range(m)], k, pos, joint, n)
    accumulated = _accumulated(plan, group, bufs, devices, sizes, bindings, loss, tokens)
    if accumulated is None:
        return True  # no such configuration: the microbatches are not whole rounds
    final, div = accumulated
    if div == 0:
        return False
    # reference: Σ s / T per element, each true contribution once
    ref: dict = {}
    for (e, _, _), s in contrib.items():
        ref[e] = ref.get(e, Fraction(0)) + s
    target = 1 if loss == "sum" else total_tokens + eps
    return all(final[d] / div == ref[elem(d)] / target for d in devices)


def _allreduce(buf: dict, i: int) -> dict:
    sums: dict = {}
    for d, v in buf.items():
        key = d[:i] + d[i + 1:]
        sums[key] = sums.get(key, 0) + v
    return {d: sums[d[:i] + d[i + 1:]] for d in buf}


def _allreduce_copies(buf: dict, i: int, c: int) -> dict:
    """An all-reduce over each group of c consecutive ranks of the axis at position i."""
    sums: dict = {}
    for d, v in buf.items():
        key = d[:i] + (d[i] // c,) + d[i + 1:]
        sums[key] = sums.get(key, 0) + v
    return {d: sums[d[:i] + (d[i] // c,) + d[i + 1:]] for d in buf}


def _prod(xs) -> Fraction:
    out = Fraction(1)
    for x in xs:
        out *= x
    return out


# --------------------------------------------------------------------------- parameters and the update


def _modes_on(plan: ir.Plan, group: str, axis: str, schedule) -> tuple[ir.Mode, ir.Mode, ir.Mode]:
    """(params, optimizer, grads) of a group on one axis. On an expert axis that splits the
    experts, a group the axis does not divide is a data-parallel replica: params and optimizer
    state as on the plan's data axes (R without one), its gradient sharded where the schedule
    reduce-scatters it."""
    states = (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS)
    out = [mode(plan, group, s, axis) for s in states]
    if plan.role(axis) is ir.Role.EXPERT and kind_of(plan, group) != "experts" and \
            out[0] in SPLIT_PARAMS:  # the axis splits the experts only
        data = [a for a in plan.mesh.names if plan.role(a) is ir.Role.DATA]
        for i, s in enumerate(states[:2]):
            if not own_mode(plan, group, s, axis):
                m = plan.placement(s).mode(data[0]) if data else ir.Mode.R
                out[i] = ir.Mode.R if m is ir.Mode.M else m
        if not own_mode(plan, group, ir.State.GRADS, axis):
            scattered = any(c.kind is collectives.Kind.REDUCE_SCATTER and axis in c.axes and carries(c, group)
                            and c.phase is collectives.Phase.GRAD_SYNC for c in schedule)
            out[2] = ir.Mode.S if scattered else ir.Mode.R
    return out[0], out[1], out[2]


def placement_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    """Usable params, gathers, the optimizer step, the re-gather after it: one weight row and
    one step of SGD, for every parameter group."""
    out = set()
    schedule = collectives.derive(plan)
    for g in groups_of(plan):
        gathers = Counter(a for c in schedule if c.kind is collectives.Kind.ALL_GATHER and c.state is ir.State.PARAMS
                          and c.phase is collectives.Phase.FORWARD and carries(c, g) for a in c.axes)
        refresh = Counter(a for c in schedule if c.kind is collectives.Kind.ALL_GATHER and carries(c, g)
                          and c.phase is collectives.Phase.REFRESH for a in c.axes)
        for a in plan.mesh.names:
            out |= _axis_violations(plan, g, a, sizes[a], _modes_on(plan, g, a, schedule), gathers[a], refresh[a])
    return out


def _axis_violations(plan: ir.Plan, group: str, a: str, n: int, modes, gathers: int, refresh: int) -> set:
    out = set()
    par, opt, grads = modes
    weights = [Fraction(i + 1) for i in range(n)]  # element i lives on rank i
    role = group_role(plan, group, a)
    if role in DATA_LIKE and par in SPLIT_PARAMS and sum(weights[:1]) != sum(weights):
        out.add(("usable", a))  # the forward of rank 0 runs on its piece only
    if par is ir.Mode.S_STAR and gathers != 1:
        used = weights[:1] if gathers == 0 else weights * gathers
        if sum(used) != sum(weights):
            out.add(("gathered", a))
    expert_split = role is ir.Role.EXPERT and kind_of(plan, group) == "experts" and par in SPLIT_PARAMS
    whole = role in DATA_LIKE or (role in TENSOR and par not in SPLIT_PARAMS) or (
        role is ir.Role.EXPERT and not expert_split)
    if whole and grads in GRAD_SPLIT and opt is ir.Mode.R and n >= 2:
        full = [Fraction(1) - Fraction(1, 10) * w for w in weights]
        held = [Fraction(1) - Fraction(1, 10) * (weights[0] if i == 0 else 0) for i in range(n)]
        if full != held:
            out.add(("optimizer", a))
    raw_par, raw_opt = (mode(plan, group, s, a) for s in (ir.State.PARAMS, ir.State.OPTIMIZER))
    if raw_par is ir.Mode.R and raw_opt.shards and n >= 2:
        # each rank steps its own shard; the others' updates reach it only by the re-gather
        copies = [[w - (Fraction(1, 10) if r == i else 0) for i, w in enumerate(weights)] for r in range(n)]
        if refresh:
            copies = [[copies[i][i] for i in range(n)] for _ in range(n)]
        if any(c != copies[0] for c in copies):
            out.add(("regather",))
    return out


# --------------------------------------------------------------------------- clip norm and overflow


def grad_shard_axes(plan: ir.Plan, group: str) -> list[str]:
    out = [a for a in plan.mesh.names if axis_type(plan, group, a) in (SHARDED, COMPLETE)]
    out += [a for a in plan.mesh.names if plan.role(a) is ir.Role.DATA
            and mode(plan, group, ir.State.GRADS, a) in GRAD_SPLIT]
    if kind_of(plan, group) == "experts":
        out += [a for a in plan.mesh.names if plan.role(a) is ir.Role.EXPERT]
    return list(dict.fromkeys(out))


def _stated_norm(plan: ir.Plan, group: str | None) -> list[ir.Override]:
    """The clip-norm reductions stated for exactly ``group``: a sum, an average or a max over axes."""
    return [o for o in plan.overrides if o.target == "clip_norm" and o.verb in ("reduce", "average", "max")
            and o.group == group]


def _allmax(buf: dict, i: int) -> dict:
    best: dict = {}
    for d, v in buf.items():
        key = d[:i] + d[i + 1:]
        best[key] = max(best.get(key, v), v)
    return {d: best[d[:i] + d[i + 1:]] for d in buf}


def _twice(plan: ir.Plan, g: str, sizes: dict[str, int]) -> int:
    """How many times a group counted twice in the norm (double_count) is counted: 2, or its tied stages."""
    if _last_for(plan, "clip_norm", "double_count", g) is None:
        return 1
    ties = [a for a in plan.mesh.names if axis_type(plan, g, a) == TIE]
    return (2 if sizes[ties[0]] >= 2 else 1) if ties else 2


def _exact_root(v: Fraction) -> Fraction:
    from math import isqrt

    n, m = isqrt(v.numerator), isqrt(v.denominator)
    assert n * n == v.numerator and m * m == v.denominator, v
    return Fraction(n, m)


def _dedupe_axes(plan: ir.Plan, g: str, written: bool, g_axes: list[str]) -> set[str]:
    """The axes of the duplicate filter (semantics.md, "Global reductions"): the derived reduction counts a
    replicated group's copies on one rank of each axis it sums over; a written reduction is a plain sum,
    filtered only over the axes a dedupe override states."""
    if not written:
        return set(g_axes)
    stated = _last_for(plan, "clip_norm", "dedupe", g)
    return set(stated.axes or ()) if stated is not None else set()


def _norm_reduced(part: dict, g_axes: list[str], how: str, blocks: dict, pos: dict[str, int],
                  sizes: dict[str, int]) -> dict:
    """A group's per-device norm values after its reduction over each of ``g_axes`` in turn: a sum, an average
    or a max, over the whole axis or over blocks of its ranks (simulator_subgroups)."""
    import simulator_subgroups

    for a in g_axes:
        if a in blocks:  # a reduction over blocks of the axis's ranks (simulator_subgroups)
            part = simulator_subgroups.block_reduce(part, pos[a], blocks[a], "max" if how == "max" else "sum")
            if how == "average":
                part = {d: v / simulator_subgroups.block_len(d[pos[a]], blocks[a], sizes[a])
                        for d, v in part.items()}
        elif how == "max":
            part = _allmax(part, pos[a])
        else:
            part = _allreduce(part, pos[a])
            if how == "average":
                part = {d: v / sizes[a] for d, v in part.items()}
    return part


def norm_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict | None = None) -> set:
    out = set()
    axes = list(plan.mesh.names)
    pos = {a: i for i, a in enumerate(axes)}
    devices = list(product(*[range(sizes[a]) for a in axes]))
    import simulator_kvnorm as kvn  # K >= 2 kv heads copied over a tensor axis: a group of its own in the norm

    copies = kvn.copy_axes(plan, sizes)
    import simulator_kvproduct as kvp  # kv heads copied over several tensor axes: the joint index

    joint = kvp.layout(plan, "kv", sizes)
    if joint is not None:
        copies = {a: c for a, c in copies.items() if a not in joint[0]}
    groups = groups_of(plan) + (["kv"] if (copies or joint) and "kv" not in groups_of(plan) else [])

    def extent(g: str, a: str) -> int:
        if g == "kv" and joint is not None and a in joint[0]:
            return plan.model.transformer.kv_heads.value if a == joint[0][0] else 1
        return kvn.extent(g, a, sizes, copies)

    def shard_key(g: str, d) -> tuple:
        if g == "kv" and joint is not None:
            return tuple((kvp.head(d, pos, joint, sizes) if a == joint[0][0] else 0) if a in joint[0]
                         else kvn.key(g, a, d[pos[a]], copies) for a in shard[g])
        return tuple(kvn.key(g, a, d[pos[a]], copies) for a in shard[g])
    shard = {g: grad_shard_axes(plan, g) for g in groups}
    sharded_somewhere = {a for g in groups for a in shard[g]}
    plan_clip = _stated_norm(plan, "all") or _stated_norm(plan, None)
    roots = _overrides(plan, "clip_norm", "sqrt_before_reduce")
    default_axes = list(plan_clip[-1].axes or ()) if plan_clip else [a for a in axes if a in sharded_somewhere]
    # squared norms and overflow flags per (group, shard)
    q = {}
    flags = {}
    for g in groups:
        # with a root taken early, values whose counted multiple is a perfect square keep the roots exact
        f = _twice(plan, g, sizes) if roots else 1
        for s in product(*[range(int(extent(g, a))) for a in shard[g]]):
            q[(g, s)] = Fraction(f * rng.randint(0, 3) ** 2) if roots else Fraction(rng.randint(0, 3))
            flags[(g, s)] = rng.random() < 0.3
    expected = sum(q.values(), Fraction(0))
    total = {d: Fraction(0) for d in devices}
    import simulator_subgroups  # a norm reduction over blocks of an axis's ranks

    blocks = simulator_subgroups.norm_blocks(plan, sizes, bindings or {})
    for g in groups:
        own = _stated_norm(plan, g)
        stated = own or plan_clip
        how = stated[-1].verb if stated else "reduce"  # reduce (a sum), average or max, over each axis
        root = any(o.group in (None, "all", g) for o in roots)
        g_axes = list(own[-1].axes or ()) if own else default_axes
        filtered = _dedupe_axes(plan, g, bool(own or plan_clip), g_axes)
        r0 = _last_for(plan, "clip_norm", "rank0_only", g)
        rank0 = set(r0.axes or ()) if r0 is not None else set()
        import simulator_rankset  # a count on a set of one axis's ranks: those ranks, not the filter, count g there

        filtered -= simulator_rankset.norm_ranked_axes(plan, g)
        part = {}
        for d in devices:
            s = shard_key(g, d)
            counted = (kvp.counted(plan, d, pos, g_axes, joint, sizes) if g == "kv" and joint is not None
                       else kvn.counted(plan, g, dict(zip(axes, d)), g_axes, copies)) and all(d[pos[a]] == 0 for a in set(g_axes) if a not in shard[g] and a in filtered) \
                and all(d[pos[a]] == 0 for a in rank0) \
                and simulator_rankset.norm_counted(plan, g, dict(zip(axes, d)), sizes, bindings or {})  # rank0_only: only rank 0 of these axes contributes
            part[d] = q[(g, s)] * _twice(plan, g, sizes) if counted else Fraction(0)
        if root:  # each rank's norm, not its square
            part = {d: _exact_root(v) for d, v in part.items()}
        part = _norm_reduced(part, g_axes, how, blocks, pos, sizes)
        for d in devices:
            total[d] += part[d] ** 2 if root else part[d]
    eps_o = _overrides(plan, "clip_norm", "eps_before_reduce")
    if eps_o:  # ε on each rank's squared norm before the plan's reduction (simulator_perrank); single device: S + ε
        import simulator_perrank

        how = plan_clip[-1].verb if plan_clip else "reduce"
        eps, part = simulator_perrank.eps_part(plan, sizes, eps_o[-1], default_axes, how, bindings or {})
        total = {d: v + part[d] for d, v in total.items()}
        expected += eps
    if any(v != expected for v in total.values()):
        out.add(("clip",))
    ovf_o = _overrides(plan, "overflow", "reduce")
    # the overflow flag has its own reduction: the derived axes unless an overflow override says
    # otherwise (a clip-norm override leaves it alone)
    ovf_axes = list(ovf_o[-1].axes or ()) if ovf_o else [a for a in axes if a in sharded_somewhere]

    def overflow_differs(flags: dict) -> bool:
        any_flag = any(flags.values())
        buf = {d: any(flags[(g, shard_key(g, d))] for g in groups)
               for d in devices}
        for a in ovf_axes:
            sums: dict = {}
            for d, v in buf.items():
                key = d[:pos[a]] + d[pos[a] + 1:]
                sums[key] = sums.get(key, False) or v
            buf = {d: sums[d[:pos[a]] + d[pos[a] + 1:]] for d in buf}
        return any(v != any_flag for v in buf.values())

    # the random flags, and every single shard overflowing alone (the witness a random draw can miss:
    # another group's flag, seen by every device, hides a divergence)
    if overflow_differs(flags) or any(overflow_differs({k: k == one for k in flags}) for one in flags):
        out.add(("overflow",))
    return out


# --------------------------------------------------------------------------- driver


def violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict | None = None,
               trials: int = 3) -> set:
    import simulator_losses  # the loss terms' section, which reads this module's helpers
    import simulator_perrank  # per-rank operations on the update and the loss scale
    import simulator_rankclips  # two or more clips on sets of ranks for one group
    import simulator_rankset  # a clip or a divisor on a set of one axis's ranks
    import simulator_subgroups  # blocks of an axis's ranks, divisors on the last rank or all but it

    bindings = bindings or {}
    out = placement_violations(plan, sizes)
    for _ in range(trials):
        for g in groups_of(plan):
            if ("gi", g) not in out and not gi_ok(plan, g, sizes, rng, bindings):
                out.add(("gi", g))
        out |= norm_violations(plan, sizes, rng, bindings)
        out |= simulator_losses.term_violations(plan, sizes, rng, bindings)
        out |= simulator_perrank.update_violations(plan, sizes, rng, bindings)
        out |= simulator_perrank.scale_violations(plan, sizes, rng)
        out |= simulator_subgroups.update_violations(plan, sizes, rng, bindings)
        out |= simulator_rankset.update_violations(plan, sizes, rng, bindings)
        out |= simulator_rankset.product_violations(plan, sizes, rng, bindings)
        out |= simulator_rankclips.clip_violations(plan, sizes, rng, bindings)
        out |= simulator_subgroups.grad_block_violations(plan, sizes, rng, bindings)
    return out
