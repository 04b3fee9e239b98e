"""IR value expressions to sympy, symbol bindings, and LaTeX display names.

Input: ``ir.Value`` trees (and an ``ir.Spec`` for its bindings). Output: exact sympy
expressions (one positive ``Symbol`` per ``Sym`` name, ``Rational`` constants), the
substitution map of a spec's bindings, and LaTeX through a ``LatexPrinter`` subclass whose
``symbol_names`` give readable names (``psi`` -> ``\\Psi``, axis ``dp`` -> ``N_{dp}``).

``Query`` nodes are turned into sympy through a callback supplied by the caller (the cost
engine supplies ``costs.query_value``). User text never reaches ``sympify``: expressions are
built node by node from the IR.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Iterable, Mapping

import sympy
from sympy.printing.latex import LatexPrinter

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError

QueryFn = Callable[[ir.Query], sympy.Expr]

_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
    "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
}
# Names whose capitalised Greek letter is what papers write (Ψ for the parameter count).
_CAPITAL = {"psi", "theta", "omega", "phi", "gamma", "delta", "lambda", "sigma", "pi", "xi", "upsilon"}


def symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of a spec name; every spec quantity is a positive number."""
    return sympy.Symbol(name, positive=True)


def rational(x: Fraction | int) -> sympy.Rational:
    x = Fraction(x)
    return sympy.Rational(x.numerator, x.denominator)


def _no_query(q: ir.Query) -> sympy.Expr:
    raise DiagnosticError([Diagnostic("PL401", f"cost query '{q.kind}({q.plan})' is not allowed here", q.span)])


def to_sympy(value: ir.Value, query: QueryFn | None = None) -> sympy.Expr:
    """Translate a value expression without recursion (post-order over an explicit stack)."""
    query = query or _no_query
    done: dict[int, sympy.Expr] = {}
    stack: list[tuple[ir.Value, bool]] = [(value, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if isinstance(node, ir.Const):
            done[id(node)] = rational(node.value)
        elif isinstance(node, ir.Sym):
            done[id(node)] = symbol(node.name)
        elif isinstance(node, ir.Query):
            done[id(node)] = query(node)
        elif isinstance(node, ir.Op):
            if not expanded:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args)
                continue
            done[id(node)] = _apply(node, [done[id(a)] for a in node.args])
        else:
            raise DiagnosticError([Diagnostic("PL400", f"not a value expression: {type(node).__name__}")])
    return done[id(value)]


def _apply(node: ir.Op, args: list[sympy.Expr]) -> sympy.Expr:
    op = node.op
    if op == "+":
        return sympy.Add(*args)
    if op == "*":
        return sympy.Mul(*args)
    if op == "-":
        return args[0] - sympy.Add(*args[1:]) if len(args) > 1 else -args[0]
    if op == "neg":
        return -args[0]
    if op == "/":
        if args[1] == 0:
            raise DiagnosticError([Diagnostic("PL204", "division by zero", node.span)])
        return args[0] / args[1]
    if op in ("^", "**"):
        return sympy.Pow(args[0], args[1])
    if op == "min":
        return sympy.Min(*args)
    if op == "max":
        return sympy.Max(*args)
    if op == "ceil":
        return sympy.ceiling(args[0])
    if op == "floor":
        return sympy.floor(args[0])
    raise DiagnosticError([Diagnostic("PL400", f"unknown operator '{op}' in a value expression", node.span)])


def resolve_bindings(bindings: Iterable[tuple[str, ir.Value]],
                     overrides: Mapping[str, Fraction] | None = None) -> dict[sympy.Symbol, sympy.Expr]:
    """The substitution map of a spec: each bound name to its value in terms of earlier ones.

    ``overrides`` (from ``--set``) replace a binding's value before later ones are resolved.
    Values are fully substituted, so the map can be applied in one ``xreplace``.
    """
    overrides = dict(overrides or {})
    out: dict[sympy.Symbol, sympy.Expr] = {}
    for name, value in bindings:
        if name in overrides:
            expr: sympy.Expr = rational(overrides.pop(name))
        else:
            expr = to_sympy(value).xreplace(out)
        out[symbol(name)] = expr
    for name, v in overrides.items():  # names that are symbols of the model but not bound
        out[symbol(name)] = rational(v)
    return out


# --------------------------------------------------------------------------- display names


def display_name(name: str, axes: Iterable[str] = ()) -> str:
    """LaTeX for a spec name: Greek names as letters, axis sizes as N_{axis}."""
    if name in set(axes):
        return rf"N_{{\mathrm{{{_tex_escape(name)}}}}}"
    base, _, sub = name.partition("_")
    if base.lower() in _GREEK:
        letter = base.lower()
        head = "\\" + (letter.capitalize() if letter in _CAPITAL and base == base.lower() else base)
    elif len(base) == 1:
        head = base
    else:
        head = rf"\mathrm{{{_tex_escape(base)}}}"
    return f"{head}_{{{_tex_escape(sub)}}}" if sub else head


def _tex_escape(text: str) -> str:
    return text.replace("\\", "").replace("_", r"\_").replace("{", "").replace("}", "")


class PlacementLatexPrinter(LatexPrinter):
    """sympy's LaTeX printer with readable symbol names and exact numbers kept whole."""

    def __init__(self, names: Mapping[sympy.Symbol, str] | None = None, **settings):
        settings.setdefault("symbol_names", dict(names or {}))
        settings.setdefault("mul_symbol", "dot")
        super().__init__(settings)

    def _print_Integer(self, expr):
        n = int(expr)
        if abs(n) >= 10**6:
            # 7500000000 -> 7.5 \cdot 10^{9}, exact: only trailing zeros are folded
            digits = str(abs(n)).rstrip("0")
            exp = len(str(abs(n))) - 1
            mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
            sign = "-" if n < 0 else ""
            return rf"{sign}{mant} \cdot 10^{{{exp}}}"
        return str(n)


def symbol_names(exprs: Iterable[sympy.Expr], axes: Iterable[str] = ()) -> dict[sympy.Symbol, str]:
    axes = tuple(axes)
    names: dict[sympy.Symbol, str] = {}
    for e in exprs:
        for s in getattr(e, "free_symbols", ()):
            names[s] = display_name(s.name, axes)
    return names


def latex(expr: sympy.Expr, axes: Iterable[str] = ()) -> str:
    return PlacementLatexPrinter(symbol_names([expr], axes)).doprint(expr)
