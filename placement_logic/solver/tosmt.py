"""sympy expressions to z3 terms, walking the expression tree (nothing is parsed).

Input: an exact sympy expression built by the cost engine (``Add``, ``Mul``, ``Pow`` with
an integer exponent, ``Rational``, ``Symbol``, ``Min``, ``Max``) and a map from symbol
names to z3 terms. Output: the z3 real-valued term with the same value wherever every
denominator is non-zero. The walk is iterative, so deep expressions cannot exhaust the
Python stack.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Mapping

import sympy
import z3


def as_expr(x) -> sympy.Basic:
    """A sympy object for a number the engine produced (int, Fraction) or a sympy object."""
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, Fraction):
        return sympy.Rational(x.numerator, x.denominator)
    raise TypeError(f"not a number or sympy expression: {type(x).__name__}")


class Untranslatable(ValueError):
    """The expression uses a construct that has no exact z3 counterpart here."""


def _real(term: z3.ArithRef) -> z3.ArithRef:
    return z3.ToReal(term) if z3.is_int(term) else term


def to_z3(expr: sympy.Expr, env: Mapping[str, z3.ArithRef], ctx: z3.Context) -> z3.ArithRef:
    """Translate ``expr``; every symbol must be named in ``env``."""
    done: dict[sympy.Basic, z3.ArithRef] = {}
    stack: list[tuple[sympy.Basic, bool]] = [(as_expr(expr), False)]
    while stack:
        node, expanded = stack.pop()
        if node in done:
            continue
        if node.is_Rational:
            done[node] = z3.RealVal(f"{node.p}/{node.q}", ctx) if node.q != 1 else z3.RealVal(node.p, ctx)
            continue
        if node.is_Symbol:
            if node.name not in env:
                raise Untranslatable(f"no solver term for symbol {node.name}")
            done[node] = _real(env[node.name])
            continue
        if not isinstance(node, (sympy.Add, sympy.Mul, sympy.Pow, sympy.Min, sympy.Max)):
            raise Untranslatable(f"cannot translate {type(node).__name__}")
        args = node.args[:1] if isinstance(node, sympy.Pow) else node.args
        if not expanded:
            stack.append((node, True))
            stack.extend((a, False) for a in args)
            continue
        vals = [done[a] for a in args]
        if isinstance(node, sympy.Add):
            out = vals[0]
            for v in vals[1:]:
                out = out + v
        elif isinstance(node, sympy.Mul):
            out = vals[0]
            for v in vals[1:]:
                out = out * v
        elif isinstance(node, sympy.Pow):
            exp = node.args[1]
            if not exp.is_Integer:
                raise Untranslatable(f"non-integer exponent {exp}")
            k = int(exp)
            out = z3.RealVal(1, ctx)
            for i in range(abs(k)):
                out = vals[0] if i == 0 else out * vals[0]
            if k < 0:
                out = z3.RealVal(1, ctx) / out
        else:
            pick = (lambda a, b: a <= b) if isinstance(node, sympy.Min) else (lambda a, b: a >= b)
            out = vals[0]
            for v in vals[1:]:
                out = z3.If(pick(out, v), out, v)
        done[node] = out
    return done[as_expr(expr)]


def denominators(expr: sympy.Expr) -> list[sympy.Expr]:
    """The bases raised to negative powers anywhere in ``expr`` (each must be non-zero)."""
    out = []
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow) and node.args[1].is_negative:
            out.append(node.args[0])
    return list(dict.fromkeys(out))
