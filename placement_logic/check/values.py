"""Value expressions to numbers: one walker for exact Fractions and for solver terms.

Input: an ``ir.Value`` and a leaf function mapping symbol names to numbers (Fractions,
or solver terms supplied by the caller). Output: the value built with the arithmetic
operators of those numbers. The walk is iterative (post-order with an explicit stack),
so deep user expressions cannot exhaust the Python stack; nothing is parsed or executed.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError


def fold(value: ir.Value, leaf: Callable[[str], Any], const: Callable[[Fraction], Any] = lambda c: c) -> Any:
    """Evaluate ``value``: constants via ``const``, symbols via ``leaf``, operators natively."""
    results: dict[int, Any] = {}
    stack: list[tuple[ir.Value, bool]] = [(value, False)]
    while stack:
        node, expanded = stack.pop()
        if isinstance(node, ir.Const):
            results[id(node)] = const(node.value)
        elif isinstance(node, ir.Sym):
            results[id(node)] = leaf(node.name)
        elif isinstance(node, ir.Op):
            if not expanded:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args)
                continue
            args = [results[id(a)] for a in node.args]
            results[id(node)] = _apply(node, args)
        else:
            raise DiagnosticError([Diagnostic("PL503", "a cost query cannot be used in a check override", node.span)])
    return results[id(value)]


def _apply(node: ir.Op, args: list[Any]) -> Any:
    op = node.op
    if op == "neg":
        return -args[0]
    if op == "+":
        return args[0] + args[1]
    if op == "-":
        return args[0] - args[1]
    if op == "*":
        return args[0] * args[1]
    if op == "/":
        return args[0] / args[1]
    if op == "^":
        exp = node.args[1]
        if not (isinstance(exp, ir.Const) and exp.value.denominator == 1):
            raise DiagnosticError([Diagnostic("PL203", "an exponent must be an integer constant", node.span)])
        n = int(exp.value)
        result = args[0] ** 0 if n == 0 else args[0]
        for _ in range(abs(n) - 1):
            result = result * args[0]
        return 1 / result if n < 0 else result
    raise DiagnosticError([Diagnostic("PL503", f"operator '{op}' is not understood by the checker", node.span)])


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
            raise DiagnosticError([Diagnostic("PL504", f"'{name}' has no value the checker can use")])
        active.add(name)
        memo[name] = fold(bindings[name], leaf)
        active.discard(name)
        return memo[name]

    return leaf


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "^": 4}


def show(value: ir.Value) -> str:
    """A value expression as DSL text (iterative, minimal parentheses)."""
    text: dict[int, tuple[str, int]] = {}
    stack: list[tuple[ir.Value, bool]] = [(value, False)]
    while stack:
        node, expanded = stack.pop()
        if isinstance(node, ir.Const):
            v = node.value
            text[id(node)] = (str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}", 9)
        elif isinstance(node, ir.Sym):
            text[id(node)] = (node.name, 9)
        elif isinstance(node, ir.Op):
            if not expanded:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args)
                continue
            p = _PREC.get(node.op, 9)
            parts = []
            for i, a in enumerate(node.args):
                s, ap = text[id(a)]
                if ap < p or (ap == p and i > 0 and node.op in "-/^"):
                    s = f"({s})"
                parts.append(s)
            text[id(node)] = ("-" + parts[0] if node.op == "neg" else f" {node.op} ".join(parts), p)
        else:
            text[id(node)] = (f"{node.kind}({node.plan})", 9)
    return text[id(value)][0]
