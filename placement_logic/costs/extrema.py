"""Exact values of formulas at rational points, and maxima and minima built without sympy's
search for an order where there is none.

Input: sympy expressions in the spec's positive symbols (``costs.symbolic.symbol``) and
``Fraction`` values of those symbols. Output: a formula's exact value at a point
(``exact_at``, computed with ``Fraction`` over the tree: sums, products, integer powers,
maxima and minima), whether arguments are ordered differently at two points
(``unordered``), and ``extremum``, a ``sympy.Max``/``Min`` equal to sympy's evaluation.
"""

from __future__ import annotations

import math
import operator
from fractions import Fraction
from itertools import product
from operator import itemgetter
from typing import Callable, Iterable, Mapping

import sympy


class _NotExact(Exception):
    """A node the exact evaluator does not take (a float, a free symbol, a function other
    than those ``exact_at`` names, a non-integer power, a division by zero, a piecewise form
    none of whose conditions holds)."""


def _exact_at(expr: sympy.Basic, values: Mapping[sympy.Basic, Fraction]) -> Fraction:
    if expr.is_Rational:
        return Fraction(int(expr.p), int(expr.q))
    if expr.is_Symbol:
        v = values.get(expr)
        if v is None:
            raise _NotExact()
        return v
    if expr.is_Add:
        return sum((_exact_at(a, values) for a in expr.args), Fraction(0))
    if expr.is_Mul:
        out = Fraction(1)
        for a in expr.args:
            out *= _exact_at(a, values)
        return out
    if expr.is_Pow:
        e = expr.exp
        if not e.is_Integer:
            raise _NotExact()
        b = _exact_at(expr.base, values)
        if b == 0 and e < 0:
            raise _NotExact()  # sympy's value is zoo
        return b ** int(e)
    if isinstance(expr, (sympy.Max, sympy.Min)):
        args = [_exact_at(a, values) for a in expr.args]
        return max(args) if isinstance(expr, sympy.Max) else min(args)
    if isinstance(expr, sympy.Piecewise):  # the value of the first branch whose condition holds
        for value, cond in expr.args:
            if _holds(cond, values):
                return _exact_at(value, values)
        raise _NotExact()  # no branch applies
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        x = _exact_at(expr.args[0], values)
        return Fraction(math.floor(x) if isinstance(expr, sympy.floor) else math.ceil(x))
    raise _NotExact()


_RELATIONS = {sympy.StrictGreaterThan: operator.gt, sympy.GreaterThan: operator.ge, sympy.StrictLessThan: operator.lt,
              sympy.LessThan: operator.le, sympy.Equality: operator.eq, sympy.Unequality: operator.ne}


def _holds(cond: sympy.Basic, values: Mapping[sympy.Basic, Fraction]) -> bool:
    """Whether a Piecewise condition holds once its symbols take ``values``: a comparison of two
    exact values, a conjunction, disjunction or negation of such, or true or false."""
    if cond is sympy.true or cond is sympy.false:
        return cond is sympy.true
    rel = _RELATIONS.get(type(cond))
    if rel is not None:
        return rel(_exact_at(cond.lhs, values), _exact_at(cond.rhs, values))
    if isinstance(cond, sympy.And):
        return all(_holds(c, values) for c in cond.args)
    if isinstance(cond, sympy.Or):
        return any(_holds(c, values) for c in cond.args)
    if isinstance(cond, sympy.Not):
        return not _holds(cond.args[0], values)
    raise _NotExact()


def exact_at(expr: sympy.Basic, values: Mapping[sympy.Basic, Fraction]) -> Fraction | None:
    """The exact rational value of ``expr`` with each symbol given its value in ``values``
    (``rational_values``), computed with ``Fraction`` over the expression's tree: sums,
    products, integer powers, maxima and minima, floors and ceilings of rationals, and
    piecewise forms (the first branch whose condition, comparisons of such values joined by
    and, or and not, holds). ``None`` where the tree holds
    anything else or a symbol ``values`` lacks; where it is not ``None`` it is the number
    ``expr.xreplace(subs)`` evaluates to, without building the sympy expressions between."""
    try:
        return _exact_at(expr, values)
    except _NotExact:
        return None


def rational_values(subs: Mapping[sympy.Symbol, sympy.Expr]) -> dict[sympy.Symbol, Fraction]:
    """The bindings of ``subs`` whose values are rational numbers, as ``Fraction``."""
    return {s: Fraction(int(v.p), int(v.q)) for s, v in subs.items() if getattr(v, "is_Rational", False)}


_PROBES = (Fraction(1), Fraction(4096), Fraction(2), Fraction(64), Fraction(1, 2))
_PROBE_PAIRS = tuple((v.numerator, v.denominator) for v in _PROBES)  # as ``_exact_fn`` takes them


def unordered(args: Iterable[sympy.Expr]) -> bool:
    """True when each two of ``args`` are ordered differently at two points of their domain:
    exact values (``exact_at``) at positive rational values of their symbols show one larger
    at one point and smaller at the other. No sound procedure then proves either larger, so
    sympy's ``Max``/``Min`` evaluation (``_find_localzeros``, which tries to prove ``a >= b``
    from the assumptions, and was most of a cold report's time) would keep every argument,
    and ``Max(*args, evaluate=False)`` is the same expression. Only for arguments that are not
    themselves maxima or minima (which sympy's evaluation flattens and collapses) and whose
    symbols are the spec's positive symbols (``symbol``), four at most; otherwise False,
    and so is any pair not found apart (sympy then decides)."""
    args = list(args)
    if len(args) < 2 or any(isinstance(a, (sympy.Max, sympy.Min)) for a in args):
        return False
    symbols = sorted(set().union(*(a.free_symbols for a in args)), key=lambda s: s.name)
    if not symbols or len(symbols) > 4 or any(s != sympy.Symbol(s.name, positive=True) for s in symbols):
        return False
    apart = {(i, j): [False, False] for i in range(len(args)) for j in range(i + 1, len(args))}
    try:
        fns = [_exact_fn(a, symbols) for a in args]  # each tree walked once, then evaluated at every point
        for point in product(_PROBE_PAIRS, repeat=len(symbols)):
            values = [f(point) for f in fns]
            if _apart(values, apart):
                return True
    except _NotExact:
        return False
    return False


def _apart(values: list, apart: dict) -> bool:
    """Records in ``apart`` which of each two ``values`` (exact fractions as ``_exact_fn``'s
    pairs) is larger; True once every pair was seen both ways."""
    for (i, j), seen in apart.items():
        (a, b), (c, d) = values[i], values[j]
        x, y = a * d, c * b  # denominators are positive: the order of a/b and c/d
        if x > y:
            seen[0] = True
        elif x < y:
            seen[1] = True
    return all(all(seen) for seen in apart.values())


# The probe's arithmetic: an exact fraction as a pair (numerator, denominator) of ints, the
# denominator positive and the pair not reduced (no gcd at each step, as ``Fraction`` takes:
# most of the probe's time); two are compared by cross-multiplying.

def _add(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    if x[1] == y[1]:
        return x[0] + y[0], x[1]
    return x[0] * y[1] + y[0] * x[1], x[1] * y[1]


def _greater(x: tuple[int, int], y: tuple[int, int]) -> bool:
    return x[0] * y[1] > y[0] * x[1]


def _exact_fn(expr: sympy.Basic, symbols: list) -> Callable:
    """``exact_at(expr, dict(zip(symbols, point)))`` as a function of ``point`` (a tuple of
    (numerator, denominator) pairs of ints, one per symbol, denominators positive), returning
    the value as such a pair: the tree walked once into closures with ``_exact_at``'s
    arithmetic; a node it does not take raises ``_NotExact`` here, a point without a value
    (an integer power of zero with a negative exponent) when called."""
    if expr.is_Rational:
        c = (int(expr.p), int(expr.q))
        return lambda pt: c
    if expr.is_Symbol:
        if expr not in symbols:
            raise _NotExact()
        return itemgetter(symbols.index(expr))
    if expr.is_Add or expr.is_Mul:
        fs = [_exact_fn(a, symbols) for a in expr.args]
        if expr.is_Add:
            def add(pt):
                out = (0, 1)
                for f in fs:
                    out = _add(out, f(pt))
                return out
            return add

        def mul(pt):
            n, d = 1, 1
            for f in fs:
                a, b = f(pt)
                n, d = n * a, d * b
            return n, d
        return mul
    if expr.is_Pow:
        if not expr.exp.is_Integer:
            raise _NotExact()
        base, e = _exact_fn(expr.base, symbols), int(expr.exp)

        def power(pt):
            n, d = base(pt)
            if e >= 0:
                return n ** e, d ** e
            if n == 0:
                raise _NotExact()  # sympy's value is zoo
            n, d = d ** -e, n ** -e
            return (-n, -d) if d < 0 else (n, d)
        return power
    if isinstance(expr, (sympy.Max, sympy.Min)):
        larger = isinstance(expr, sympy.Max)
        fs = [_exact_fn(a, symbols) for a in expr.args]

        def pick(pt):
            out = None
            for f in fs:
                v = f(pt)
                if out is None or (_greater(v, out) if larger else _greater(out, v)):
                    out = v
            return out
        return pick
    raise _NotExact()


def extremum(kind: type, *args: sympy.Expr) -> sympy.Expr:
    """``kind(*args)`` (``sympy.Max`` or ``sympy.Min``), skipping sympy's search for an order
    between the arguments when ``unordered`` shows that there is none (the same expression)."""
    if unordered(args):
        return kind(*args, evaluate=False)
    return kind(*args)


# A formula as a Laurent polynomial in positive symbols: {exponents (one per symbol): coefficient}.
_MAX_TERMS = 4096  # past this many terms the expansion is given up (no claim: sympy decides)


def _laurent(expr: sympy.Basic, symbols: list) -> dict[tuple[int, ...], Fraction]:
    """``expr`` expanded as a Laurent polynomial in ``symbols`` (sums, products, integer powers
    of symbols, non-negative integer powers of sums), zero coefficients dropped; ``_NotExact``
    for any other node or an expansion past ``_MAX_TERMS`` terms."""
    if expr.is_Rational:
        return {(0,) * len(symbols): Fraction(int(expr.p), int(expr.q))} if expr != 0 else {}
    if expr.is_Symbol:
        if expr not in symbols:
            raise _NotExact()
        i = symbols.index(expr)
        return {tuple(1 if j == i else 0 for j in range(len(symbols))): Fraction(1)}
    if expr.is_Add:
        out: dict[tuple[int, ...], Fraction] = {}
        for a in expr.args:
            for k, c in _laurent(a, symbols).items():
                out[k] = out.get(k, 0) + c
        return {k: c for k, c in out.items() if c}
    if expr.is_Mul:
        out = {(0,) * len(symbols): Fraction(1)}
        for a in expr.args:
            out = _times(out, _laurent(a, symbols))
        return out
    if expr.is_Pow and expr.exp.is_Integer:
        e = int(expr.exp)
        if expr.base.is_Symbol:
            (k, c), = _laurent(expr.base, symbols).items()
            return {tuple(x * e for x in k): c}
        if 0 <= e <= 8:
            base, out = _laurent(expr.base, symbols), {(0,) * len(symbols): Fraction(1)}
            for _ in range(e):
                out = _times(out, base)
            return out
    raise _NotExact()


def _times(x: dict, y: dict) -> dict:
    out: dict[tuple[int, ...], Fraction] = {}
    for k1, c1 in x.items():
        for k2, c2 in y.items():
            k = tuple(a + b for a, b in zip(k1, k2))
            out[k] = out.get(k, 0) + c1 * c2
    if len(out) > _MAX_TERMS:
        raise _NotExact()
    return {k: c for k, c in out.items() if c}


def dominant(args: Iterable[sympy.Expr]) -> int | None:
    """The index of the one of two arguments that is larger than the other at every positive
    value of their symbols, shown exactly: their difference, expanded as a Laurent polynomial
    in the spec's positive symbols (``symbol``), is not zero and has no negative coefficient
    (a sum of positive terms). ``None`` when that is not shown (more or fewer than two
    arguments, a number, a maximum or minimum, any other node or symbol)."""
    args = list(args)
    if len(args) != 2 or any(a.is_number or isinstance(a, (sympy.Max, sympy.Min)) for a in args):
        return None
    symbols = sorted(set().union(*(a.free_symbols for a in args)), key=lambda s: s.name)
    if any(s != sympy.Symbol(s.name, positive=True) for s in symbols):
        return None
    try:
        x, y = (_laurent(a, symbols) for a in args)
    except _NotExact:
        return None
    diff = {k: y.get(k, 0) - x.get(k, 0) for k in x.keys() | y.keys()}
    coefficients = [c for c in diff.values() if c]
    if coefficients and all(c > 0 for c in coefficients):
        return 1
    if coefficients and all(c < 0 for c in coefficients):
        return 0
    return None
