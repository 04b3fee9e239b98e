"""z3 encodings of the safety obligations of one step model.

Input: a ``StepModel``, a ``Session`` and a query tier (unbounded, or mesh sizes up to a
bound). Output: for each obligation the *negation* of its condition as z3 constraints and
a function turning a model of them into a plain witness dict for ``replay``.

Every condition quantifies over all devices, microbatches, token counts and gradient
values. The encodings stay finite and exact by symmetry: a value reduced over a set of
axes, seen from one observer device, is a sum over *blocks* of devices (those that
differ from a reference on exactly the dimensions in the block), so a block sum stands
for any assignment to the devices in it. Token counts: one variable per block of the
token dimensions, at least one token per device. Mesh sizes are integers >= 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable

import z3

from .. import ir
from ..solver.session import Session, value_of
from . import kvjoint, steps
from .values import fold, resolver


def subsets(items: tuple[str, ...]) -> list[frozenset[str]]:
    return [frozenset(c) for r in range(len(items) + 1) for c in combinations(items, r)]


@dataclass
class Env:
    """Mesh-size terms and side constraints for one query tier."""

    sess: Session
    step: steps.StepModel
    bindings: dict[str, ir.Value]
    pinned: dict[str, int]
    bound: int | None  # None: unbounded sizes (the for-all query)
    int_counts: bool
    equal_counts: bool
    sizes: dict[str, Any] = field(default_factory=dict)
    side: list = field(default_factory=list)
    counts_cap: int | None = None
    counts_pattern: tuple[int, int] | None = None  # (a, b): every shard's count fixed, a on the observer's, b elsewhere
    pins: set = field(default_factory=set)  # axes whose declared size a K/V copy layout needs (check.kvproduct)
    fixed: dict = field(default_factory=dict)  # axis -> the size the encoding itself holds it at (``fix``)

    def __post_init__(self) -> None:
        for name in self.step.axes + (steps.MICROBATCHES,):
            if name in self.pinned:
                self.sizes[name] = z3.IntVal(self.pinned[name], self.sess.ctx)
                continue
            v = self.sess.int(f"size_{name}")
            self.sizes[name] = v
            self.side.append(v >= 1)
            if self.bound is not None:
                self.side.append(v <= self.bound)

    def fix(self, axis: str, n: int) -> Any:
        """``axis == n``: a size the encoding holds the axis at in every witness, recorded as part of the
        verdict's scope (check.run: the sizes a proof covers)."""
        self.fixed.setdefault(axis, n)
        return self.sizes[axis] == n

    def size(self, dim: steps.GradDim | str) -> Any:
        if isinstance(dim, str):
            return self.sizes[dim]
        if dim.pin and dim.axis not in self.pins:  # an axis of whole kv heads: the layout's size (kvproduct)
            self.pins.add(dim.axis)
            self.side.append(self.fix(dim.axis, dim.pin))
        self.side += [self.fix(a, s) for a, s in dim.joint if a not in self.pins]  # kvjoint: declared sizes
        self.pins |= {a for a, _ in dim.joint}
        if dim.joint and not dim.part:  # an axis folded into the first joint axis's parts (kvjoint)
            return z3.IntVal(1, self.sess.ctx)
        if dim.part:
            return self.part_size(dim)
        if dim.tie:
            pp = self.sizes[dim.axis]
            return z3.If(pp >= 2, z3.IntVal(2, self.sess.ctx), z3.IntVal(1, self.sess.ctx))
        return self.sizes[dim.name if dim.axis is None else dim.axis]

    def part_size(self, dim: steps.GradDim) -> Any:
        """A part of a tensor axis of K kv heads: K heads, or axis/K copies of each (the axis a
        multiple of K: a side constraint, stated in the obligations' notes)."""
        if dim.part == steps.HEAD_PART:
            return z3.IntVal(dim.heads, self.sess.ctx)
        if dim.joint:  # n/K ranks of the joint index (kvjoint)
            return z3.IntVal(kvjoint.copies(dim), self.sess.ctx)
        key = f"{dim.axis}.copies"
        if key not in self.sizes:
            c = self.sess.int(f"size_{key}")
            self.sizes[key] = c
            self.side += [c >= 1, self.sizes[dim.axis] == dim.heads * c]
        return self.sizes[key]

    def real(self, x: Any) -> Any:
        return z3.ToReal(x) if z3.is_int(x) else x

    def value(self, v: ir.Value) -> Any:
        real_sizes = {k: z3.ToReal(t) for k, t in self.sizes.items()}
        for alias, name in self.step.size_aliases().items():
            real_sizes.setdefault(alias, real_sizes[name])
        leaf = resolver(self.bindings, real_sizes)
        return fold(v, leaf, const=self.sess.num)

    def size_values(self, model: Any) -> dict[str, int]:
        return {k: value_of(model, t) for k, t in self.sizes.items() if not k.endswith(".copies")}

    def count_var(self, name: str) -> Any:
        return self.sess.int(name) if self.int_counts else self.sess.real(name)


def _prod(terms: list, one: Any) -> Any:
    out = one
    for t in terms:
        out = out * t
    return out


def _pow(base: Any, k: int, one: Any) -> Any:
    return _prod([base] * k, one)


# --------------------------------------------------------------------------- gradient integrity


@dataclass
class Counts:
    """Token counts in product form: along every token dimension a, the reference shard's
    own factor ``own[a]`` (at least 1) and the sum ``others[a]`` of the factors of the
    other n_a - 1 shards. The count of a device is the product of its factors, so the sum
    over any block of devices (those that differ from the reference on exactly the
    dimensions of the block) is a product of one term per dimension, and the token count
    summed over a set of dimensions is a product of (own + others) terms: 2 variables per
    dimension instead of one per block. Sums of counts are linear in the per-device counts,
    and product-form vectors span them (the unit vector of every block is one), so an
    identity between such sums that holds on every product-form assignment holds on all."""

    dims: tuple[steps.GradDim, ...]
    own: dict[str, Any]
    others: dict[str, Any]

    def sum_over(self, names, real) -> Any:
        """The token count summed over the dimensions ``names`` (the reference's own factor on the rest)."""
        out = None
        for d in self.dims:
            term = real(self.own[d.name]) + real(self.others[d.name]) if d.name in names else real(self.own[d.name])
            out = term if out is None else out * term
        return out

    def blocks(self, model: Any) -> dict[frozenset[str], Any]:
        """Block sums at a model (for the concrete replay, which enumerates devices anyway)."""
        own = {n: value_of(model, v) for n, v in self.own.items()}
        others = {n: value_of(model, v) for n, v in self.others.items()}
        names = tuple(d.name for d in self.dims)
        out = {}
        for b in subsets(names):
            v = 1
            for n in names:
                v = v * (others[n] if n in b else own[n])
            out[b] = v
        return out


def token_counts(env: Env, token_dims: tuple[steps.GradDim, ...], prefix: str) -> tuple[Counts, list]:
    """Product-form token-count variables relative to a reference shard, with feasibility constraints."""
    cons: list = []
    own, others = {}, {}
    for d in token_dims:
        u, v = env.count_var(f"{prefix}_t_{d.name}"), env.count_var(f"{prefix}_T_{d.name}")
        own[d.name], others[d.name] = u, v
        n = env.size(d)
        cons.append(u >= 1)
        if env.counts_pattern is not None:
            a, b = env.counts_pattern
            cons += [u == a, v == b * (n - 1)]
        elif env.equal_counts:
            cons.append(v == u * (n - 1))
        else:
            cons.append(v >= n - 1)
            cons.append(z3.Implies(n == 1, v == 0))
        if env.counts_cap is not None:
            cons.append(u <= env.counts_cap)
            cons.append(v <= env.counts_cap * (n - 1))
    return Counts(tuple(token_dims), own, others), cons


def gi_negation(env: Env, g: steps.GroupModel, prefix: str) -> tuple[list, Callable[[Any], dict]]:
    """Constraints true exactly when group ``g``'s gradient differs from the global-batch one."""
    ctx = env.sess.ctx
    one = z3.IntVal(1, ctx)
    rone = z3.RealVal(1, ctx)
    agree: dict[str, Any] = {}
    cons: list = []
    mult = rone
    leaks = []
    for d in g.dims:
        n = env.size(d)
        if d.kind in (steps.TOKEN, steps.SPLIT):
            agree[d.name] = env.sess.bool(f"{prefix}_agree_{d.name}")
            cons.append(z3.Implies(n == 1, agree[d.name]))
        if d.implicit or d.kind == steps.SHARDED:
            if d.k >= 1:
                leaks.append((d.name, n >= 2))
            continue
        if d.kind == steps.INVARIANT:
            mult = mult * env.real(_pow(n, d.k, one))
        elif d.k == 0:
            mult = mult * z3.If(agree[d.name], rone, z3.RealVal(0, ctx))
        else:
            mult = mult * env.real(_pow(n, d.k - 1, one))
    tdims = g.token_dims
    counts, ccons = token_counts(env, tdims, prefix)
    cons += ccons
    total = counts.sum_over({d.name for d in tdims}, env.real)
    norm_set = frozenset(g.norm_dims)
    slab = counts.sum_over(norm_set, env.real)
    if g.objective == "sum":  # no token count anywhere: the reference and every device sum over tokens
        total = rone
        if g.path_count != "count":  # (a loss term's path may still divide by a count: check.losses)
            slab = rone
            norm_set = frozenset()
    elif g.objective == "unit_mean":  # a loss term's value per device and microbatch, averaged over all of them
        total = env.real(_prod([env.size(d) for d in tdims], one))  # (check.losses): the number of such values
        if not norm_set:
            slab = rone  # the path takes each value as it is, no token count
    if g.path_count == "none":  # a loss term's path that takes no count (loss[T]: sum, check.losses)
        slab = rone
        norm_set = frozenset()
    token_names = {d.name for d in tdims}
    for name in sorted(norm_set):
        # a reduction of the count over an axis it is already replicated on multiplies it by the
        # size: every reduction after the first over a token axis, every one over another axis
        times = g.norm_dims.count(name)
        extra = times - 1 if name in token_names else times
        if extra > 0:
            slab = slab * env.real(_pow(env.size(name), extra, one))
    if g.divisor_value is not None:
        divisor = env.value(g.divisor_value)
    else:
        divisor = env.real(_prod([env.size(a) for a in g.divisor_axes], one))
    leak_any = z3.Or([c for _, c in leaks]) if leaks else z3.BoolVal(False, ctx)
    wrong = mult * total != slab * divisor
    cons.append(z3.Or(leak_any, wrong))

    def extract(model: Any) -> dict:
        leak = next((name for name, c in leaks if value_of(model, c)), None)
        return {
            "kind": "gi",
            "group": g.group,
            "sizes": env.size_values(model),
            "agree": {k: value_of(model, v) for k, v in agree.items()},
            "counts": counts.blocks(model),
            "leak": leak,
        }

    return cons, extract


def gi_replica_negation(env: Env, g: steps.GroupModel, prefix: str) -> tuple[list, Callable[[Any], dict]]:
    """Two replicas of the same update (differing on replicated axes) end with different gradients."""
    ctx = env.sess.ctx
    rone, rzero = z3.RealVal(1, ctx), z3.RealVal(0, ctx)
    replica_split = [d for d in g.dims if d.replica and d.kind in (steps.TOKEN, steps.SPLIT) and d.k == 0 and not d.implicit]
    if not replica_split:
        return [z3.BoolVal(False, ctx)], lambda model: {}
    cons = []
    agree1, agree2 = {}, {}
    diff = []
    for d in replica_split:
        a1, a2 = env.sess.bool(f"{prefix}_o1_{d.name}"), env.sess.bool(f"{prefix}_o2_{d.name}")
        agree1[d.name], agree2[d.name] = a1, a2
        cons.append(z3.Implies(env.size(d) == 1, z3.And(a1, a2)))
        diff.append(z3.And(a1, z3.Not(a2)))
    w1 = _prod([z3.If(v, rone, rzero) for v in agree1.values()], rone)
    w2 = _prod([z3.If(v, rone, rzero) for v in agree2.values()], rone)
    cons.append(z3.Or(diff))
    cons.append(w1 != w2)

    def extract(model: Any) -> dict:
        axis = next(n for n in agree1 if value_of(model, agree1[n]) and not value_of(model, agree2[n]))
        return {"kind": "replica", "group": g.group, "sizes": env.size_values(model), "axis": axis}

    return cons, extract


# --------------------------------------------------------------------------- global reductions (the grad norm and
# the overflow decision: check.encode_norm)


def seed_negation(env: Env) -> tuple[list, Callable[[Any], dict]]:
    """Two tensor-parallel ranks whose residual-region dropout seeds break the rule."""
    step = env.step
    return axes_negation(env, "seed", [(a, env.sess.true()) for a in step.tensor_axes
                                       if (a in step.seed_vary) != step.sequence_parallel])


def axes_negation(env: Env, kind: str, bad_axes: list[tuple[str, Any]]) -> tuple[list, Callable[[Any], dict]]:
    """Generic: some listed axis (with its extra condition) has size >= 2."""
    ctx = env.sess.ctx
    conds = [(a, z3.And(env.size(a) >= 2, extra)) for a, extra in bad_axes]
    cons = [z3.Or([c for _, c in conds])] if conds else [z3.BoolVal(False, ctx)]

    def extract(model: Any) -> dict:
        axis = next(a for a, c in conds if value_of(model, c))
        return {"kind": kind, "sizes": env.size_values(model), "axis": axis}

    return cons, extract


def typing_negation(env: Env) -> tuple[list, Callable[[Any], dict]]:
    """CR02: some group's value on some dimension is left partial, doubled or mixed."""
    ctx = env.sess.ctx
    conds = []
    for g in env.step.groups:
        for d in g.dims:
            if d.name == steps.MICROBATCHES:
                continue
            bad = (d.kind in (steps.TOKEN, steps.SPLIT) and not d.implicit and d.k != 1) or (
                (d.kind in (steps.INVARIANT, steps.SHARDED) or d.implicit) and d.k >= 1
            )
            if bad:
                conds.append(((g.group, d.name), env.size(d) >= 2))
    cons = [z3.Or([c for _, c in conds])] if conds else [z3.BoolVal(False, ctx)]

    def extract(model: Any) -> dict:
        group, dim = next(key for key, c in conds if value_of(model, c))
        return {"kind": "typing", "sizes": env.size_values(model), "group": group, "dim": dim}

    return cons, extract


def flag_negation(env: Env, kind: str, violated: bool, needs_m: bool = False) -> tuple[list, Callable[[Any], dict]]:
    """A structural violation that holds whenever it is present (optionally needing m >= 2)."""
    ctx = env.sess.ctx
    cond = z3.BoolVal(violated, ctx)
    if needs_m:
        cond = z3.And(cond, env.size(steps.MICROBATCHES) >= 2)

    def extract(model: Any) -> dict:
        return {"kind": kind, "sizes": env.size_values(model)}

    return [cond], extract


def any_negation(env: Env, parts: list[tuple[list, Callable[[Any], dict]]], prefix: str
                 ) -> tuple[list, Callable[[Any], dict]]:
    """Some of several negations holds (a choice variable per part); the witness is that part's."""
    if len(parts) == 1:
        return parts[0]
    pick = [env.sess.bool(f"{prefix}_pick_{i}") for i in range(len(parts))]
    cons = [z3.Or(*pick)] + [z3.Implies(b, z3.And(*c)) for b, (c, _) in zip(pick, parts)]

    def extract(model: Any) -> dict:
        i = next(i for i, b in enumerate(pick) if value_of(model, b))
        return parts[i][1](model)

    return cons, extract
