"""The one walker over IR value expressions, with a per-target operator table.

Input: an ``ir.Value`` and a ``Target`` (what a constant, a symbol and a cost query become,
and one function per operator). Output: the value built in that target: exact Fractions
or z3 terms (the checker), sympy expressions (the cost engine), text (printing). The walk
is iterative (post-order over an explicit stack, shared subexpressions evaluated once), so
deep user expressions cannot exhaust the Python stack; nothing is parsed or executed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Mapping

from .nodes import Const, Op, Query, Sym, Value


def _no_query(q: Query) -> Any:
    raise ValueError(f"a cost query is not a value here: {q.kind}({q.plan})")


def _unknown(node: Op) -> Any:
    raise ValueError(f"unknown operator '{node.op}'")


@dataclass(frozen=True)
class Target:
    """How one target builds values: leaves, and an operator table ``op -> f(node, args)``."""

    const: Callable[[Fraction], Any]
    sym: Callable[[str], Any]
    ops: Mapping[str, Callable[[Op, list], Any]]
    query: Callable[[Query], Any] = _no_query
    unknown: Callable[[Op], Any] = _unknown  # called for an operator the table lacks (raises)
    other: Callable[[Any], Any] = field(default=lambda node: _unknown(node))


def evaluate(value: Value, target: Target) -> Any:
    done: dict[int, Any] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if isinstance(node, Const):
            done[id(node)] = target.const(node.value)
        elif isinstance(node, Sym):
            done[id(node)] = target.sym(node.name)
        elif isinstance(node, Query):
            done[id(node)] = target.query(node)
        elif isinstance(node, Op):
            if not expanded:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args)
                continue
            fn = target.ops.get(node.op)
            done[id(node)] = fn(node, [done[id(a)] for a in node.args]) if fn else target.unknown(node)
        else:
            done[id(node)] = target.other(node)
    return done[id(value)]


# --------------------------------------------------------------------------- arithmetic (numbers, z3 terms)


def _int_power(node: Op, args: list) -> Any:
    exp = node.args[1]
    if not (isinstance(exp, Const) and exp.value.denominator == 1):
        raise ValueError("an exponent must be an integer constant")
    n = int(exp.value)
    result = args[0] ** 0 if n == 0 else args[0]
    for _ in range(abs(n) - 1):
        result = result * args[0]
    return 1 / result if n < 0 else result


ARITHMETIC: dict[str, Callable[[Op, list], Any]] = {
    "neg": lambda n, a: -a[0],
    "+": lambda n, a: a[0] + a[1],
    "-": lambda n, a: a[0] - a[1],
    "*": lambda n, a: a[0] * a[1],
    "/": lambda n, a: a[0] / a[1],
    "^": _int_power,
}


# Exact numbers are kept below this many bits in numerator and denominator (about 3,600
# decimal digits: under Python's 4,300-digit limit for printing an integer). A value past
# it is an error of the spec (PL209), found before the number is built, so an exponent
# tower never hangs.
MAX_BITS = 12_000


class TooLarge(ArithmeticError):
    """An exact value whose numerator or denominator would exceed ``MAX_BITS`` bits."""


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _guard(x: Fraction) -> Fraction:
    if _bits(x) > MAX_BITS:
        raise TooLarge(x)
    return x


def _checked_power(node: Op, args: list) -> Fraction:
    exp = node.args[1]
    if not (isinstance(exp, Const) and exp.value.denominator == 1):
        raise ValueError("an exponent must be an integer constant")
    n = int(exp.value)
    if n < 0 and args[0] == 0:
        raise ZeroDivisionError("zero to a negative power")
    if _bits(args[0]) * abs(n) > MAX_BITS + abs(n):  # estimated before the power is built
        raise TooLarge(node)
    return _guard(Fraction(args[0]) ** n)


NUMBERS: dict[str, Callable[[Op, list], Any]] = {
    "neg": lambda n, a: -a[0],
    "+": lambda n, a: _guard(a[0] + a[1]),
    "-": lambda n, a: _guard(a[0] - a[1]),
    "*": lambda n, a: _guard(a[0] * a[1]) if _bits(a[0]) + _bits(a[1]) <= 2 * MAX_BITS else _raise(TooLarge(n)),
    "/": lambda n, a: _guard(a[0] / a[1]) if _bits(a[0]) + _bits(a[1]) <= 2 * MAX_BITS else _raise(TooLarge(n)),
    "^": _checked_power,
}


def _raise(exc: Exception) -> Any:
    raise exc


def fold_strict(value: Value | None, bindings: Mapping[str, Value], depth: int = 0) -> Fraction | None:
    """A value as an exact number through ``bindings`` (name -> value), or None when a symbol
    stays free; raises ``ZeroDivisionError`` when it divides by zero and ``TooLarge`` past
    ``MAX_BITS``."""
    if value is None or depth > 64:  # 64: no binding chain is longer; a cycle ends here
        return None

    def sym(name: str):
        n = fold_strict(bindings.get(name), bindings, depth + 1)
        if n is None:
            raise LookupError(name)
        return n

    try:
        return evaluate(value, Target(const=lambda v: v, sym=sym, ops=NUMBERS))
    except (LookupError, ValueError):
        return None


def fold(value: Value | None, bindings: Mapping[str, Value], depth: int = 0) -> Fraction | None:
    """A value as an exact number through ``bindings`` (name -> value), or None when a symbol
    stays free, an exponent is not an integer constant, it divides by zero or it is too
    large to hold exactly (``MAX_BITS``)."""
    try:
        return fold_strict(value, bindings, depth)
    except (ZeroDivisionError, TooLarge):
        return None


# --------------------------------------------------------------------------- text


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "^": 4}


def _text_op(node: Op, args: list[tuple[str, int]]) -> tuple[str, int]:
    if node.op == "neg":
        inner, ip = args[0]
        return (f"-({inner})" if isinstance(node.args[0], Op) else f"-{inner}", _PREC["neg"])
    p = _PREC.get(node.op, 9)
    parts = []
    for i, (text, ap) in enumerate(args):
        if ap < p or (i == 1 and ap == p and node.op in "-/^") or (i == 0 and node.op == "^" and ap == p):
            text = f"({text})"
        parts.append(text)
    return (f" {node.op} ".join(parts), p)


def _text_const(v: Fraction) -> tuple[str, int]:
    return (str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}", 9)


def _text_query(q: Query) -> tuple[str, int]:
    args = q.plan + (f", {q.arg}" if q.arg else "")
    return (f"{q.kind}({args})", 9)


TEXT = Target(const=_text_const, sym=lambda name: (name, 9), ops={op: _text_op for op in _PREC},
              query=_text_query, unknown=lambda node: (f"{node.op}(...)", 9))


def show(value: Value) -> str:
    """Plain-text spelling of a value expression (minimal parentheses; for reports, not parsing)."""
    return evaluate(value, TEXT)[0]
