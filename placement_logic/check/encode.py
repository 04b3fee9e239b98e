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
from . import steps as st
from ..solver.session import Session, value_of
from .values import fold, resolver


def subsets(items: tuple[str, ...]) -> list[frozenset[str]]:
    return [frozenset(c) for r in range(len(items) + 1) for c in combinations(items, r)]


@dataclass
class Env:
    """Mesh-size terms and side constraints for one query tier."""

    sess: Session
    step: st.StepModel
    bindings: dict[str, ir.Value]
    pinned: dict[str, int]
    bound: int | None  # None: unbounded sizes (the for-all query)
    int_counts: bool
    equal_counts: bool
    sizes: dict[str, Any] = field(default_factory=dict)
    side: list = field(default_factory=list)
    counts_cap: int | None = None

    def __post_init__(self) -> None:
        for name in self.step.axes + (st.MICROBATCHES,):
            if name in self.pinned:
                self.sizes[name] = z3.IntVal(self.pinned[name], self.sess.ctx)
                continue
            v = self.sess.int(f"size_{name}")
            self.sizes[name] = v
            self.side.append(v >= 1)
            if self.bound is not None:
                self.side.append(v <= self.bound)

    def size(self, dim: st.GradDim | str) -> Any:
        if isinstance(dim, str):
            return self.sizes[dim]
        if dim.tie:
            pp = self.sizes[dim.axis]
            return z3.If(pp >= 2, z3.IntVal(2, self.sess.ctx), z3.IntVal(1, self.sess.ctx))
        return self.sizes[dim.name if dim.axis is None else dim.axis]

    def real(self, x: Any) -> Any:
        return z3.ToReal(x) if z3.is_int(x) else x

    def value(self, v: ir.Value) -> Any:
        real_sizes = {k: z3.ToReal(t) for k, t in self.sizes.items()}
        for alias, name in self.step.size_aliases().items():
            real_sizes.setdefault(alias, real_sizes[name])
        leaf = resolver(self.bindings, real_sizes)
        return fold(v, leaf, const=self.sess.num)

    def size_values(self, model: Any) -> dict[str, int]:
        return {k: value_of(model, t) for k, t in self.sizes.items()}

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


def token_blocks(env: Env, token_dims: tuple[st.GradDim, ...], prefix: str) -> tuple[dict, list]:
    """Block token-count variables relative to a reference shard, with feasibility constraints."""
    one = z3.IntVal(1, env.sess.ctx)
    names = tuple(d.name for d in token_dims)
    by_name = {d.name: d for d in token_dims}
    blocks: dict[frozenset[str], Any] = {}
    cons: list = []
    c = env.count_var(f"{prefix}_c")
    if env.equal_counts:
        cons.append(c >= 1)
    for b in subsets(names):
        var = env.count_var(f"{prefix}_N_{'_'.join(sorted(b)) or 'own'}")
        blocks[b] = var
        devices = _prod([env.size(by_name[n]) - 1 for n in sorted(b)], one)
        if env.equal_counts:
            cons.append(var == c * devices)
        elif b:
            cons.append(var >= devices)
            cons.append(z3.Implies(z3.Or([env.size(by_name[n]) == 1 for n in sorted(b)]), var == 0))
        else:
            cons.append(var >= 1)
        if env.counts_cap is not None:
            cons.append(var <= env.counts_cap * (devices if b else one))
    return blocks, cons


def gi_negation(env: Env, g: st.GroupModel, prefix: str) -> tuple[list, Callable[[Any], dict]]:
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
        if d.kind in (st.TOKEN, st.SPLIT):
            agree[d.name] = env.sess.bool(f"{prefix}_agree_{d.name}")
            cons.append(z3.Implies(n == 1, agree[d.name]))
        if d.implicit or d.kind == st.SHARDED:
            if d.k >= 1:
                leaks.append((d.name, n >= 2))
            continue
        if d.kind == st.INVARIANT:
            mult = mult * env.real(_pow(n, d.k, one))
        elif d.k == 0:
            mult = mult * z3.If(agree[d.name], rone, z3.RealVal(0, ctx))
        else:
            mult = mult * env.real(_pow(n, d.k - 1, one))
    tdims = g.token_dims
    blocks, bcons = token_blocks(env, tdims, prefix)
    cons += bcons
    total = sum((env.real(v) for v in blocks.values()), z3.RealVal(0, ctx))
    norm_set = frozenset(g.norm_dims)
    slab = sum((env.real(v) for b, v in blocks.items() if b <= norm_set), z3.RealVal(0, ctx))
    for name in sorted(norm_set):  # a repeated reduction of the count multiplies it by the size
        times = g.norm_dims.count(name)
        if times > 1:
            slab = slab * env.real(_pow(env.size(g.dim(name)), times - 1, one))
    if g.divisor_value is not None:
        divisor = env.value(g.divisor_value)
    else:
        divisor = env.real(_prod([env.size(a) for a in g.divisor_axes], one))
    leak_any = z3.Or([c for _, c in leaks]) if leaks else z3.BoolVal(False, ctx)
    wrong = mult * total != slab * divisor
    cons.append(z3.Or(leak_any, wrong))

    def extract(model: Any) -> dict:
        leak = next((name for name, c in leaks if value_of(model, c)), None)
        counts = {b: value_of(model, v) for b, v in blocks.items()}
        return {
            "kind": "gi",
            "group": g.group,
            "sizes": env.size_values(model),
            "agree": {k: value_of(model, v) for k, v in agree.items()},
            "counts": counts,
            "leak": leak,
        }

    return cons, extract


def gi_replica_negation(env: Env, g: st.GroupModel, prefix: str) -> tuple[list, Callable[[Any], dict]]:
    """Two replicas of the same update (differing on replicated axes) end with different gradients."""
    ctx = env.sess.ctx
    rone, rzero = z3.RealVal(1, ctx), z3.RealVal(0, ctx)
    replica_split = [d for d in g.dims if d.replica and d.kind in (st.TOKEN, st.SPLIT) and d.k == 0 and not d.implicit]
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


# --------------------------------------------------------------------------- global reductions


def norm_negation(env: Env, prefix: str, boolean: bool) -> tuple[list, Callable[[Any], dict]]:
    """The observer's grad norm (or overflow decision) differs from the global one."""
    ctx = env.sess.ctx
    step = env.step
    axes = step.overflow_axes if boolean else step.clip_axes
    one = z3.IntVal(1, ctx)
    computed = [] if boolean else z3.RealVal(0, ctx)
    expected = [] if boolean else z3.RealVal(0, ctx)
    cons: list = []
    blocks: dict[tuple[str, frozenset[str]], Any] = {}
    for g in step.groups:
        shard = g.shard_axes
        g_axes = axes if boolean or g.clip_axes is None else g.clip_axes
        k = {a: g_axes.count(a) for a in sorted(set(g_axes))}
        for b in subsets(shard):
            name = f"{prefix}_{g.group}_{'_'.join(sorted(b)) or 'own'}"
            v = env.sess.bool(name) if boolean else env.sess.real(name)
            blocks[(g.group, b)] = v
            empty = z3.Or([env.size(a) == 1 for a in sorted(b)]) if b else z3.BoolVal(False, ctx)
            if boolean:
                cons.append(z3.Implies(empty, z3.Not(v)))
                expected.append(v)
                if b <= set(k):
                    computed.append(v)
            else:
                cons.append(v >= 0)
                cons.append(z3.Implies(empty, v == 0))
                expected = expected + v
                if b <= set(k):
                    factor = one
                    for a, times in k.items():
                        factor = factor * _pow(env.size(a), times - 1, one)
                    dc = one
                    if g.double_count:
                        tie = [d for d in g.dims if d.tie]
                        dc = env.size(tie[0]) if tie else z3.IntVal(2, ctx)
                    computed = computed + v * env.real(factor * dc)
    if boolean:
        cons.append(z3.Or(computed) != z3.Or(expected))
    else:
        cons.append(computed != expected)

    def extract(model: Any) -> dict:
        return {
            "kind": "overflow" if boolean else "clip",
            "sizes": env.size_values(model),
            "blocks": {key: value_of(model, v) for key, v in blocks.items()},
        }

    return cons, extract


def seed_negation(env: Env) -> tuple[list, Callable[[Any], dict]]:
    """Two tensor-parallel ranks whose residual-region dropout seeds break the rule."""
    ctx = env.sess.ctx
    step = env.step
    bad = []
    for a in step.tensor_axes:
        varies = a in step.seed_vary
        if varies != step.sequence_parallel:
            bad.append((a, env.size(a) >= 2))
    cons = [z3.Or([c for _, c in bad])] if bad else [z3.BoolVal(False, ctx)]

    def extract(model: Any) -> dict:
        axis = next(a for a, c in bad if value_of(model, c))
        return {"kind": "seed", "sizes": env.size_values(model), "axis": axis}

    return cons, extract


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
            if d.name == st.MICROBATCHES:
                continue
            bad = (d.kind in (st.TOKEN, st.SPLIT) and not d.implicit and d.k != 1) or (
                (d.kind in (st.INVARIANT, st.SHARDED) or d.implicit) and d.k >= 1
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
        cond = z3.And(cond, env.size(st.MICROBATCHES) >= 2)

    def extract(model: Any) -> dict:
        return {"kind": kind, "sizes": env.size_values(model)}

    return [cond], extract
