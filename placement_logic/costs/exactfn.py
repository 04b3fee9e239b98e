"""Closed forms compiled once to exact-rational Python functions (``fractions.Fraction``, never floats).

Input: named sympy expressions and the symbols that vary. Output: an ``ExactFunction``
whose call takes one exact value per symbol (int or ``Fraction``) and returns every
expression's exact value as a ``Fraction``; the same numbers as substituting the values
into the expressions in sympy (``compiled.exact_value``), at a small fraction of the cost,
which is what a sweep of many configurations needs.

The expressions are split into common subexpressions once (``sympy.cse``) and written as
one Python function over ``Fraction`` arithmetic: sums, products, integer powers, ``Max``
and ``Min``, ``floor`` and ``ceiling``, ``Mod``, ``Abs``, and ``Piecewise`` with relational
conditions. An expression with anything else (an irrational power, a function without an
exact rational meaning) is not compiled: ``compile_exact`` returns None and the caller
substitutes in sympy, as before. A point where the function fails (a division by zero in a
branch, no Piecewise branch that applies) raises ``ValueError``; the caller falls back to sympy
there too.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Mapping, Sequence

import sympy


class Unsupported(Exception):
    """An expression with a form the exact function cannot write."""


def _pow(base, n: int):
    return Fraction(base) ** n


def _no_branch():
    raise ValueError("no Piecewise branch applies")


_RELATIONS = {sympy.StrictGreaterThan: ">", sympy.GreaterThan: ">=", sympy.StrictLessThan: "<",
              sympy.LessThan: "<=", sympy.Equality: "==", sympy.Unequality: "!="}


class _Writer:
    """Python source of an expression over the names of symbols and of the subexpressions."""

    def __init__(self, names: Mapping[sympy.Symbol, str]):
        self.names = dict(names)
        self.constants: list[Fraction] = []

    def constant(self, value: Fraction) -> str:
        self.constants.append(value)
        return f"_c[{len(self.constants) - 1}]"

    def __call__(self, e) -> str:  # noqa: C901 - one branch per sympy form
        if e in self.names:
            return self.names[e]
        if e is sympy.true:
            return "True"
        if e is sympy.false:
            return "False"
        if e.is_Integer:
            return f"({int(e)})"
        if e.is_Rational:
            return self.constant(Fraction(int(e.p), int(e.q)))
        if e.is_Symbol:
            raise Unsupported(f"free symbol {e}")
        if e.is_Add:
            return "(" + " + ".join(self(a) for a in e.args) + ")"
        if e.is_Mul:
            return "(" + " * ".join(self(a) for a in e.args) + ")"
        if e.is_Pow:
            if not e.exp.is_Integer:
                raise Unsupported(f"power {e.exp}")
            return f"_pow({self(e.base)}, {int(e.exp)})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            return f"{'max' if isinstance(e, sympy.Max) else 'min'}({', '.join(self(a) for a in e.args)})"
        if isinstance(e, sympy.ceiling):
            return f"_ceil({self(e.args[0])})"
        if isinstance(e, sympy.floor):
            return f"_floor({self(e.args[0])})"
        if isinstance(e, sympy.Mod):
            return f"({self(e.args[0])} % {self(e.args[1])})"
        if isinstance(e, sympy.Abs):
            return f"abs({self(e.args[0])})"
        if isinstance(e, sympy.Piecewise):
            out = "_no_branch()"
            for value, cond in reversed(e.args):
                out = f"({self(value)} if {self(cond)} else {out})"
            return out
        if type(e) in _RELATIONS:
            return f"({self(e.lhs)} {_RELATIONS[type(e)]} {self(e.rhs)})"
        if isinstance(e, sympy.And):
            return "(" + " and ".join(self(a) for a in e.args) + ")"
        if isinstance(e, sympy.Or):
            return "(" + " or ".join(self(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(not {self(e.args[0])})"
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
    args = {s: f"a{k}" for k, s in enumerate(symbols)}
    try:
        subexprs, reduced = sympy.cse(list(exprs), symbols=sympy.numbered_symbols("_x"))
        writer = _Writer(args)
        lines = [f"def _f({', '.join(args.values())}):"]
        for k, (sym, e) in enumerate(subexprs):
            lines.append(f"    t{k} = {writer(e)}")
            writer.names[sym] = f"t{k}"
        lines.append(f"    return ({', '.join(writer(e) for e in reduced)}{',' if len(reduced) == 1 else ''})")
    except Unsupported:
        return None
    scope = {"_pow": _pow, "_ceil": math.ceil, "_floor": math.floor, "_no_branch": _no_branch,
             "_c": tuple(writer.constants)}
    exec(compile("\n".join(lines), "<exact closed forms>", "exec"), scope)  # noqa: S102 - source written above
    return ExactFunction(tuple(names), scope["_f"])
