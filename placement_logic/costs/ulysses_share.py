"""The largest rank's heads per position and peer of a Ulysses all-to-all under a stated head split, as a
formula in the tensor and Ulysses sizes (ir.ulysses_split.share, docs/costs.md).

With n = ceil(h/g) query heads on the largest rank (``floor``: floor(h/g)), h = heads/t and k kv heads per
tensor rank, the share is n + ceil(n·k/h) (``repeat``: a run aligned to the kv groups, exact wherever one
of n and h/k divides the other, so for every power-of-two size) or n + ceil(k/g) (``split``: rank 0 has the
most of both). The sizes where the exact count (enumerated over t dividing the heads and g up to h + 1;
beyond h every rank holds at most one head) differs from that form are cases of a ``Piecewise``, so the
formula is exact at every size; with the heads a symbol it is the aligned form.
"""

from __future__ import annotations

import functools

import sympy

from ..ir.ulysses_split import local, share


def _form(rule: str, kv_rule: str, h, k, g):
    most = sympy.floor if rule == "floor" else sympy.ceiling
    n = most(h / g)
    if kv_rule == "repeat":
        return 2 * n if k is h else n + sympy.ceiling(n * k / h)
    return n + most(k / g)


def _value(rule: str, kv_rule: str, h: int, k: int, g: int) -> int:
    """``_form`` at numbers."""
    n = h // g if rule == "floor" else -(-h // g)
    if kv_rule == "repeat":
        return n + -(-n * k // h)
    return n + (k // g if rule == "floor" else -(-k // g))


@functools.lru_cache(maxsize=256)
def heads_share(rule: str, kv_rule: str, heads: sympy.Expr, kv: sympy.Expr, t: sympy.Expr, g: sympy.Expr) -> sympy.Expr:
    """The share at tensor size t (a product of axis sizes, or 1) and Ulysses size g; heads and kv as the model's."""
    if heads.is_Integer and kv.is_Integer and t.is_Integer and g.is_Integer and int(heads) % int(t) == 0:
        h, k = local(int(heads), int(kv), int(t))
        if h % k == 0 and int(g) >= 2:  # every size a number: the count itself
            return sympy.Integer(share(rule, kv_rule, h, k, int(g)))
    h_t = heads / t
    kv_t = h_t if kv == heads else sympy.Max(1, sympy.floor(kv / t))
    base = _form(rule, kv_rule, h_t, kv_t, g)
    cases = []
    if heads.is_Integer and kv.is_Integer:
        a = int(heads)
        for tv in ([int(t)] if t.is_number else [d for d in range(1, a + 1) if a % d == 0]):
            h, k = local(a, int(kv), tv)
            if a % tv or h % k:
                continue
            for gv in ([int(g)] if g.is_number else range(2, h + 2)):  # at a numeric size: its case alone
                exact = share(rule, kv_rule, h, k, gv)
                if _value(rule, kv_rule, a // tv, h if int(kv) == a else max(1, int(kv) // tv), gv) != exact:
                    cond = sympy.Eq(g, gv) if t.is_number else sympy.And(sympy.Eq(t, tv), sympy.Eq(g, gv))
                    cases.append((sympy.Integer(exact), cond))
    # each case a distinct pair of sizes, the form after them: no case shadows another, so the pieces are kept as
    # written (sympy's own collapsing of the arguments compares every pair of conditions: minutes for 60 cases)
    return sympy.Piecewise(*cases, (base, True), evaluate=False) if cases else base
