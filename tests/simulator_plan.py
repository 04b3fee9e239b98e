"""The simulator's reading of a plan (tests/simulator.py): each parameter group's roles, modes and gradient
class, the type of its gradient contribution along each axis (docs/semantics.md's table), the schedule's
reductions of its gradient, the overrides that concern it, concrete values of symbolic sizes; and the exact
collectives on per-device buffers (a dict from device coordinates to a value) the simulator executes.
Independent of the checker's code (it imports nothing from ``placement_logic.check``)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

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


# --------------------------------------------------------------------------- collectives on buffers


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


def _allmax(buf: dict, i: int) -> dict:
    best: dict = {}
    for d, v in buf.items():
        key = d[:i] + d[i + 1:]
        best[key] = max(best.get(key, v), v)
    return {d: best[d[:i] + d[i + 1:]] for d in buf}
