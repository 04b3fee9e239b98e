"""Closed forms compiled once to exact-rational Python functions (``fractions.Fraction``, never floats).

Input: named sympy expressions and the symbols that vary. Output: an ``ExactFunction``
whose call takes one exact value per symbol (int or ``Fraction``) and returns every
expression's exact value as a ``Fraction``; the same numbers as substituting the values
into the expressions in sympy (``compiled.exact_value``), at a small fraction of the cost,
which is what a sweep of many configurations needs.

The expressions are split into common subexpressions once (``sympy.cse``) and turned into a
tree of Python closures over ``Fraction`` arithmetic (no source text is written or run): sums, products, integer powers, ``Max``
and ``Min``, ``floor`` and ``ceiling``, ``Mod``, ``Abs``, and ``Piecewise`` with relational
conditions. An expression with anything else (an irrational power, a function without an
exact rational meaning) is not compiled: ``compile_exact`` returns None and the caller
substitutes in sympy, as before. A point where the function fails (a division by zero in a
branch, no Piecewise branch that applies) raises ``ValueError``; the caller falls back to sympy
there too.
"""

from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import Callable, Mapping, Sequence

import sympy


class Unsupported(Exception):
    """An expression with a form the exact function cannot write."""


def _pow(base, n: int):
    return Fraction(base) ** n


def _no_branch():
    raise ValueError("no Piecewise branch applies")


_RELATIONS = {sympy.StrictGreaterThan: operator.gt, sympy.GreaterThan: operator.ge, sympy.StrictLessThan: operator.lt,
              sympy.LessThan: operator.le, sympy.Equality: operator.eq, sympy.Unequality: operator.ne}

Node = Callable[[list], object]  # the values of the symbols and subexpressions so far -> the node's value


def _constant(c) -> Node:
    return lambda v: c


def _fold(op, fs: list[Node]) -> Node:
    first, rest = fs[0], fs[1:]

    def f(v):
        t = first(v)
        for g in rest:
            t = op(t, g(v))
        return t
    return f


def _piecewise(pairs: list[tuple[Node, Node]]) -> Node:
    def f(v):
        for value, cond in pairs:
            if cond(v):
                return value(v)
        return _no_branch()
    return f


class _Compiler:
    """An expression as a tree of Python closures over the positions of symbols and subexpressions
    (no source text is written or run)."""

    def __init__(self, slots: Mapping[sympy.Symbol, int]):
        self.slots = dict(slots)

    def __call__(self, e) -> Node:  # noqa: C901 - one branch per sympy form
        if e in self.slots:
            return operator.itemgetter(self.slots[e])
        if e is sympy.true or e is sympy.false:
            return _constant(e is sympy.true)
        if e.is_Integer:
            return _constant(int(e))
        if e.is_Rational:
            return _constant(Fraction(int(e.p), int(e.q)))
        if e.is_Symbol:
            raise Unsupported(f"free symbol {e}")
        if e.is_Add:
            return _fold(operator.add, [self(a) for a in e.args])
        if e.is_Mul:
            return _fold(operator.mul, [self(a) for a in e.args])
        if e.is_Pow:
            if not e.exp.is_Integer:
                raise Unsupported(f"power {e.exp}")
            base, n = self(e.base), int(e.exp)
            return lambda v: _pow(base(v), n)
        if isinstance(e, (sympy.Max, sympy.Min)):
            pick, fs = (max if isinstance(e, sympy.Max) else min), [self(a) for a in e.args]
            return lambda v: pick(f(v) for f in fs)
        if isinstance(e, (sympy.ceiling, sympy.floor, sympy.Abs)):
            one = {sympy.ceiling: math.ceil, sympy.floor: math.floor, sympy.Abs: abs}[type(e)]
            arg = self(e.args[0])
            return lambda v: one(arg(v))
        if isinstance(e, sympy.Mod):
            return _fold(operator.mod, [self(e.args[0]), self(e.args[1])])
        if isinstance(e, sympy.Piecewise):
            return _piecewise([(self(value), self(cond)) for value, cond in e.args])
        if type(e) in _RELATIONS:
            return _fold(_RELATIONS[type(e)], [self(e.lhs), self(e.rhs)])
        if isinstance(e, (sympy.And, sympy.Or)):
            test, fs = (all if isinstance(e, sympy.And) else any), [self(a) for a in e.args]
            return lambda v: test(f(v) for f in fs)
        if isinstance(e, sympy.Not):
            arg = self(e.args[0])
            return lambda v: not arg(v)
        raise Unsupported(type(e).__name__)


class ExactFunction:
    """Named expressions' exact values at a point: ``f(*values)`` -> {name: Fraction}."""

    def __init__(self, names: tuple[str, ...], fn: Callable):
        self.names = names
        self._fn = fn

    def __call__(self, *values) -> dict[str, Fraction]:
        try:
            out = self._fn(*(Fraction(v) for v in values))
        except (ZeroDivisionError, ValueError, TypeError) as exc:
            raise ValueError(f"no exact value at this point: {exc}") from None
        return {n: Fraction(v) for n, v in zip(self.names, out)}


def compile_exact(names: Sequence[str], exprs: Sequence[sympy.Expr],
                  symbols: Sequence[sympy.Symbol]) -> ExactFunction | None:
    """One exact-rational function of ``symbols`` for every expression, or None when one of them
    has a form it cannot write (the caller substitutes in sympy then)."""
    compiler = _Compiler({s: k for k, s in enumerate(symbols)})
    try:
        subexprs, reduced = sympy.cse(list(exprs), symbols=sympy.numbered_symbols("_x"))
        temps = []
        for k, (sym, e) in enumerate(subexprs):
            temps.append(compiler(e))
            compiler.slots[sym] = len(symbols) + k
        outs = [compiler(e) for e in reduced]
    except Unsupported:
        return None

    def fn(*values):
        v = list(values)
        for t in temps:
            v.append(t(v))
        return tuple(f(v) for f in outs)
    return ExactFunction(tuple(names), fn)
