"""The z3 negation of ``SC clip_norm`` and ``SC overflow``: the observer's grad norm (or overflow
decision) differs from the global one.

Input: the query's ``Env``, a variable prefix and whether the value is the found-inf flag (boolean)
or the squared norm. Output: the constraints of the negation and a function turning a model of
them into the witness ``replay_norm.replay_norm`` re-checks.

Per group, the squared-norm partial sum (or the found-inf flag) of the shards is in product form,
like the token counts: along every axis the group is sharded over, the observer's own factor and
the sum of the other shards' factors (for the flag: whether the own shard, and whether some other
shard, overflows). What the plan reduces over a set of axes is then a product of one term per
axis, and so is the global value: two variables per group and axis. Unit vectors of every block
are product-form, so a difference on any assignment shows on one of them.
"""

from __future__ import annotations

from typing import Any, Callable

import z3

from ..solver.session import value_of
from . import clipagg, encode_rankcount, kvjoint, steps
from .encode import Env, _pow, _prod, subsets

Factors = tuple[dict[str, Any], dict[str, Any]]  # per shard axis: the observer's own term, the other shards'


def norm_negation(env: Env, prefix: str, boolean: bool) -> tuple[list, Callable[[Any], dict]]:
    """The observer's grad norm (or overflow decision) differs from the global one."""
    ctx = env.sess.ctx
    step = env.step
    axes = step.overflow_axes if boolean else step.clip_axes
    cons: list = []
    factors: dict[str, Factors] = {}
    computed_terms, expected_terms = [], []
    for g in step.groups:
        comp, exp, factors[g.group] = _group_terms(env, g, prefix, boolean, axes, cons)
        computed_terms.append(comp)
        expected_terms.append(exp)
    # a nonlinear aggregation of a value still partial over an axis (clipagg.pending): wrong there
    nonlinear = [] if boolean else [(g.group, a, env.size(a) >= 2) for g in step.groups
                                    for a in clipagg.pending(g, lambda a: True)]
    if boolean:
        cons.append(z3.Or(computed_terms) != z3.Or(expected_terms))
    else:
        wrong = sum(computed_terms, z3.RealVal(0, ctx)) != sum(expected_terms, z3.RealVal(0, ctx))
        cons.append(z3.Or(wrong, *[c for _, _, c in nonlinear]) if nonlinear else wrong)

    def extract(model: Any) -> dict:
        hit = next(((gr, a) for gr, a, c in nonlinear if value_of(model, c)), None)
        if hit is not None:
            return _pending_witness(env, model, *hit)
        blocks = _block_values(env, model, prefix, boolean, factors)
        return {"kind": "overflow" if boolean else "clip", "sizes": env.size_values(model), "blocks": blocks}

    return cons, extract


def _base(env: Env, prefix: str, group: str, boolean: bool) -> Any:
    """The axis-free part of the group's value (a group sharded over no axis still has one)."""
    return env.sess.bool(f"{prefix}_{group}_any") if boolean else env.sess.real(f"{prefix}_{group}_base")


def _group_terms(env: Env, g: steps.GroupModel, prefix: str, boolean: bool, axes: tuple[str, ...],
                 cons: list) -> tuple[Any, Any, Factors]:
    """The group's value as the plan reduces it (computed) and its global value (expected), with the
    own and other shards' terms along each axis it is sharded over; ``cons`` gains their side constraints."""
    g_axes = axes if boolean or g.clip_axes is None else g.clip_axes
    k = {a: g_axes.count(a) for a in sorted(set(g_axes))}
    own: dict[str, Any] = {}
    others: dict[str, Any] = {}
    base = _base(env, prefix, g.group, boolean)
    if not boolean:
        cons.append(base >= 0)
    comp = exp = base
    for a in g.shard_axes:
        term = _flag_term if boolean else _norm_term
        own[a], others[a], comp, exp = term(env, g, prefix, a, a in k, comp, exp, cons)
    for d in g.dims:  # K kv heads copied over an axis: the axis a multiple of K (a side constraint)
        if d.part == steps.COPY_PART or d.pin or d.joint:
            env.size(d)
    if not boolean:
        comp = _counted(env, g, k, comp)
    return comp, exp, (own, others)


def _flag_term(env: Env, g: steps.GroupModel, prefix: str, a: str, reduced: bool, comp: Any, exp: Any,
               cons: list) -> tuple[Any, Any, Any, Any]:
    """Along shard axis ``a``: whether the own shard and whether some other shard overflows."""
    u, v = env.sess.bool(f"{prefix}_{g.group}_{a}_own"), env.sess.bool(f"{prefix}_{g.group}_{a}_others")
    cons.append(z3.Implies(env.size(a) == 1, z3.Not(v)))
    exp = z3.And(exp, z3.Or(u, v))
    comp = z3.And(comp, z3.Or(u, v) if reduced else u)
    return u, v, comp, exp


def _norm_term(env: Env, g: steps.GroupModel, prefix: str, a: str, reduced: bool, comp: Any, exp: Any,
               cons: list) -> tuple[Any, Any, Any, Any]:
    """Along shard axis ``a``: the own shard's squared norm and the other shards' sum."""
    u, v = env.sess.real(f"{prefix}_{g.group}_{a}_own"), env.sess.real(f"{prefix}_{g.group}_{a}_others")
    cons += [u >= 0, v >= 0, z3.Implies(env.size(a) == 1, v == 0)]
    cons += [v == 0] if a in kvjoint.folded(g) else []  # its heads are the first joint axis's
    exp = exp * (u + v)
    if reduced and any(x[0] == a for x in g.clip_ranks):  # count_on_ranks (encode_rankcount)
        comp = comp * encode_rankcount.sharded_factor(env, g, u, v)
    else:
        comp = comp * ((u + v) if reduced and a not in g.clip_rank0 else u)  # rank0_only: rank 0's piece
    return u, v, comp, exp


def _counted(env: Env, g: steps.GroupModel, k: dict[str, int], comp: Any) -> Any:
    """The computed squared norm times the copies the reductions count (``k``: times reduced per axis),
    a double count, and the divisions of an average."""
    one = z3.IntVal(1, env.sess.ctx)
    factor = one
    for a, times in k.items():
        # reduced over an axis the group is sharded over, or one where its copies are counted
        # once (the duplicate filter), the first reduction sums distinct values; otherwise every
        # reduction sums copies of the same value and multiplies it
        ranked = any(x[0] == a for x in g.clip_ranks)  # count_on_ranks: its named copies (encode_rankcount)
        dedupe = a in g.shard_axes or a in g.clip_filter or a in g.clip_rank0 or ranked
        if ranked and a not in g.shard_axes:
            factor = factor * encode_rankcount.copies(env, g)
        if g.clip_agg != "max":  # the max of copies is the copy (of shards: ``nonlinear`` above)
            factor = factor * _pow(env.size(a), times - 1 if dedupe else times, one)
            if a in g.clip_copies and a not in g.clip_rank0:  # kv heads' copies each counted (kvnorm)
                factor = factor * env.size(next(d for d in g.dims if d.part == steps.COPY_PART and d.axis == a))
    dc = one
    if g.double_count:
        tie = [d for d in g.dims if d.tie]
        dc = env.size(tie[0]) if tie else z3.IntVal(2, env.sess.ctx)
    comp = comp * env.real(factor * dc)
    if g.clip_agg == "average":  # every reduction divides by the axis size (clipagg)
        comp = comp / env.real(_prod([_pow(env.size(a), t, one) for a, t in k.items()], one))
    return comp


def _pending_witness(env: Env, model: Any, group: str, a: str) -> dict:
    """Two ranks along the axis holding 1 each (perfect squares: exact roots)."""
    step = env.step
    g = step.group(group)
    blocks = {(x.group, b): 0 for x in step.groups for b in subsets(x.shard_axes)}
    blocks[(group, frozenset())] = 1
    if a in g.shard_axes:
        blocks[(group, frozenset({a}))] = 1
    return {"kind": "clip", "sizes": env.size_values(model), "blocks": blocks, "pending": a}


def _block_values(env: Env, model: Any, prefix: str, boolean: bool, factors: dict[str, Factors]) -> dict:
    """Each group's value on each block of its shard axes (the other shards' terms on the block's axes)."""
    blocks = {}
    for g in env.step.groups:
        own, others = factors[g.group]
        base = value_of(model, _base(env, prefix, g.group, boolean))
        for b in subsets(g.shard_axes):
            v = base
            for a in g.shard_axes:
                x = value_of(model, others[a] if a in b else own[a])
                v = (v and x) if boolean else v * x
            blocks[(g.group, b)] = v
    return blocks
