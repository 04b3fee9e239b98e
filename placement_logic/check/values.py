"""Value expressions to numbers: exact Fractions and solver terms, through the IR's walker.

Input: an ``ir.Value`` and a leaf function mapping symbol names to numbers (Fractions,
or solver terms supplied by the caller). Output: the value built with the arithmetic
operators of those numbers. The walk is iterative (post-order with an explicit stack),
so deep user expressions cannot exhaust the Python stack; nothing is parsed or executed.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.walker import ARITHMETIC, Target, evaluate


def _check_error(code: str, message: str, node) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, node.span)])


def _power(node: ir.Op, args: list[Any]) -> Any:
    try:
        return ARITHMETIC["^"](node, args)
    except ValueError:
        raise _check_error(Code.BAD_EXPONENT, "an exponent must be an integer constant", node) from None


CHECK_OPS = {**ARITHMETIC, "^": _power}


def _query(node) -> Any:
    raise _check_error(Code.CHECK_VALUE, "a cost query cannot be used in a check override", node)


def _unknown(node: ir.Op) -> Any:
    raise _check_error(Code.CHECK_VALUE, f"operator '{node.op}' is not understood by the checker", node)


def fold(value: ir.Value, leaf: Callable[[str], Any], const: Callable[[Fraction], Any] = lambda c: c) -> Any:
    """Evaluate ``value``: constants via ``const``, symbols via ``leaf``, operators natively
    (the IR walker with the checker's operator table)."""
    return evaluate(value, Target(const=const, sym=leaf, ops=CHECK_OPS, query=_query, unknown=_unknown,
                                  other=_query))


def resolver(bindings: dict[str, ir.Value], sizes: dict[str, Any]) -> Callable[[str], Any]:
    """A leaf function: sizes first (mesh axes, microbatches), then ``let`` bindings, memoised."""
    memo: dict[str, Any] = {}
    active: set[str] = set()

    def leaf(name: str) -> Any:
        if name in sizes:
            return sizes[name]
        if name in memo:
            return memo[name]
        if name not in bindings or name in active:
            raise DiagnosticError([Diagnostic(Code.UNBOUND_CHECK_SYMBOL, f"'{name}' has no value the checker can use")])
        active.add(name)
        memo[name] = fold(bindings[name], leaf)
        active.discard(name)
        return memo[name]

    return leaf


def show(value: ir.Value) -> str:
    """A value expression as text (the IR's one printer)."""
    return ir.show(value)
