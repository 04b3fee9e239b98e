"""The z3 terms of check.rankcount: a group's squared norm counted on a set of one axis's ranks.

Input: the query's ``Env`` and a group's ``(axis, ranks)``. Output: the number of the axis's ranks
the set names at the query's sizes (``named_count``), the factor the group's pieces along a sharded
axis contribute (``sharded_factor``) and the copies a replicated group counts (``copies``); and, for
PL259, whether a rank is a rank of the axis at no size at all (``never_in_range``, its own query).
"""

from __future__ import annotations

from typing import Any

import z3

from .. import ir
from ..diagnostics import DiagnosticError
from .values import fold, resolver


def _ranks(env, ranks) -> list:
    out = [env.value(r) for r in ranks]
    return [r if z3.is_expr(r) else z3.RealVal(str(r), env.sess.ctx) for r in out]  # a let folds to a number


def named_count(env, axis: str, ranks) -> Any:
    """How many distinct ranks of ``axis`` (size n) the set names: a value names rank k where it is the
    whole number k in [0, n); a value equal to an earlier one names no new rank."""
    n = z3.ToReal(env.size(axis))
    rs = _ranks(env, ranks)
    one, zero = z3.RealVal(1, env.sess.ctx), z3.RealVal(0, env.sess.ctx)
    terms = [z3.If(z3.And(z3.IsInt(r), r >= 0, r < n, *[r != q for q in rs[:i]]), one, zero) for i, r in enumerate(rs)]
    return sum(terms, zero)


def sharded_factor(env, g, u, v) -> Any:
    """The factor of the group's pieces along its one rank-set axis (sharded there): the observer's piece
    u and the others' sum v, both counted where every rank is named, none where no rank is, and (some
    named, some not) the piece on a named rank alone: u, the others put on ranks that are not named."""
    a, ranks = g.clip_ranks[0]
    c, n = named_count(env, a, ranks), z3.ToReal(env.size(a))
    return z3.If(c == n, u + v, z3.If(c == 0, z3.RealVal(0, env.sess.ctx), u))


def copies(env, g) -> Any:
    """The copies a group replicated over its rank-set axis counts there: one per named rank."""
    a, ranks = g.clip_ranks[0]
    return named_count(env, a, ranks)


def never_in_range(plan: ir.Plan, axes: tuple[str, ...], rank: ir.Value) -> bool:
    """True where no sizes (each mesh axis a whole number >= 1) make ``rank`` a whole number in [0, n), n the
    product of the ``axes``' sizes: unsat of its own query. A rank naming a ``let`` the checker cannot fold, or an
    undecided query: False."""
    ctx = z3.Context()
    sizes = {a: z3.Int(f"size_{a}", ctx) for a in plan.mesh.names}
    try:
        r = fold(rank, resolver({}, {a: z3.ToReal(t) for a, t in sizes.items()}), const=lambda c: z3.RealVal(str(c), ctx))
    except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
        return False
    if any(a not in sizes for a in axes):
        return False
    r = r if z3.is_expr(r) else z3.RealVal(str(r), ctx)
    n = sizes[axes[0]]
    for a in axes[1:]:
        n = n * sizes[a]
    s = z3.Solver(ctx=ctx)
    s.set("timeout", 2000)
    s.add(*[t >= 1 for t in sizes.values()], z3.IsInt(r), r >= 0, r < z3.ToReal(n))
    return s.check() == z3.unsat
