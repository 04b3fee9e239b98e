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
from functools import lru_cache
from typing import Callable, Iterable, Mapping

import sympy
from sympy.printing.latex import LatexPrinter

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.walker import Target, evaluate
from . import lazytensor

lazytensor.defer()  # sympy's tensor module, not loaded by the first sum (costs.lazytensor)

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


_SPEC_ASSUMPTIONS = sympy.Symbol("x", positive=True).assumptions0  # what ``symbol`` knows of every spec name


def rational(x: Fraction | int) -> sympy.Rational:
    x = Fraction(x)
    return sympy.Rational(x.numerator, x.denominator)


@lru_cache(maxsize=65536)
def at_least(x: sympy.Expr, bound: sympy.Rational):
    """``x >= bound``: sympy's relation, or its truth where sympy decides it (an assumption query
    on ``x - bound``, most of a tabulated figure's time). Kept per (size, bound) in the process:
    the tables of one size (NCCL's protocols, a link's curve, a kernel's efficiency) share their
    bounds, and the same sizes come back in structures alike. A size that is a positive
    constant times powers of spec symbols (known only to be positive) takes every positive
    value, so sympy cannot decide it against a positive bound: the relation is built as sympy
    builds an undecided one, without the query."""
    if bound.is_positive and _fills_the_positives(x):
        return sympy.GreaterThan(x, bound, evaluate=False)
    return x >= bound


def _fills_the_positives(x: sympy.Expr) -> bool:
    """``x`` is a sum of terms c · f₁ ⋯ fₖ (c a positive rational; each f a spec symbol, or a
    minimum or maximum of positive rationals and spec symbols, to a nonzero rational power) in
    which one spec symbol s, outside every minimum and maximum, stands in every term to a power
    of the same sign: with the other symbols fixed x is Σ Kᵢ·s^eᵢ (each K > 0), continuous,
    tending to 0 at one end of (0, ∞) and to ∞ at the other, so its values are all of (0, ∞)."""
    if not isinstance(x, sympy.Expr) or x.is_number:
        return False
    common: dict | None = None  # spec symbol -> whether its power is positive, alike in every term so far
    inner: set = set()  # the symbols inside a minimum or maximum
    for term in sympy.Add.make_args(x):
        coeff, rest = term.as_coeff_Mul()
        if not (coeff.is_Rational and coeff.is_positive):
            return False
        signs = {}
        for f in sympy.Mul.make_args(rest):
            base, e = f.as_base_exp()
            if not (e.is_Rational and e != 0):
                return False
            if _spec_symbol(base):
                signs[base] = e > 0
            elif isinstance(base, (sympy.Min, sympy.Max)) and all(
                    (a.is_Rational and a.is_positive) or _spec_symbol(a) for a in base.args):
                inner |= base.free_symbols
            else:
                return False
        common = signs if common is None else {a: p for a, p in common.items() if signs.get(a) is p}
        if not common:
            return False
    return any(a not in inner for a in common)


def _spec_symbol(e) -> bool:
    return e.is_Symbol and e.assumptions0 == _SPEC_ASSUMPTIONS


def _no_query(q: ir.Query) -> sympy.Expr:
    raise DiagnosticError([Diagnostic(Code.QUERY_NOT_ALLOWED, f"cost query '{q.kind}({q.plan})' is not allowed here", q.span)])


def _div(node: ir.Op, args: list[sympy.Expr]) -> sympy.Expr:
    if args[1] == 0:
        raise DiagnosticError([Diagnostic(Code.DIVISION_BY_ZERO, "division by zero", node.span)])
    return args[0] / args[1]


SYMPY_OPS = {
    "+": lambda n, a: sympy.Add(*a),
    "*": lambda n, a: sympy.Mul(*a),
    "-": lambda n, a: a[0] - sympy.Add(*a[1:]) if len(a) > 1 else -a[0],
    "neg": lambda n, a: -a[0],
    "/": _div,
    "^": lambda n, a: sympy.Pow(a[0], a[1]),
    "**": lambda n, a: sympy.Pow(a[0], a[1]),
    "min": lambda n, a: sympy.Min(*a),
    "max": lambda n, a: sympy.Max(*a),
    "ceil": lambda n, a: sympy.ceiling(a[0]),
    "floor": lambda n, a: sympy.floor(a[0]),
}


def _unknown_op(node: ir.Op) -> sympy.Expr:
    raise DiagnosticError([Diagnostic(Code.BAD_VALUE_EXPRESSION, f"unknown operator '{node.op}' in a value expression", node.span)])


def _not_a_value(node) -> sympy.Expr:
    raise DiagnosticError([Diagnostic(Code.BAD_VALUE_EXPRESSION, f"not a value expression: {type(node).__name__}")])


def to_sympy(value: ir.Value, query: QueryFn | None = None) -> sympy.Expr:
    """Translate a value expression (the IR walker with the sympy operator table)."""
    return evaluate(value, Target(const=rational, sym=symbol, ops=SYMPY_OPS, query=query or _no_query,
                                  unknown=_unknown_op, other=_not_a_value))


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
        self._printed: dict[sympy.Basic, str] = {}

    def doprint(self, expr) -> str:
        # kept per formula: breaking a long formula into lines prints each part again
        if not isinstance(expr, sympy.Basic):
            return super().doprint(expr)
        out = self._printed.get(expr)
        if out is None:
            out = self._printed[expr] = super().doprint(expr)
        return out

    def _print_Integer(self, expr):
        return grouped(int(expr))

    def _print_Rational(self, expr):
        if expr.q == 1:
            return grouped(int(expr.p))
        sign = "- " if expr.p < 0 else ""
        return rf"{sign}\frac{{{grouped(abs(int(expr.p)))}}}{{{grouped(int(expr.q))}}}"


def grouped(n: int) -> str:
    """An integer as papers print it: whole, digits in groups of three joined by a thin space
    (``67\\,108\\,864``) from five digits on; never folded into a power of ten."""
    digits = str(abs(n))
    if len(digits) > 4:
        head = len(digits) % 3 or 3
        digits = r"\,".join([digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)])
    return ("-" if n < 0 else "") + digits


# Widths in points of 10 pt Computer Modern math, for estimating how wide a formula sets.
_OPS = {"+": 12.2, "-": 12.2, "=": 13.3, "<": 13.3, ">": 13.3, ",": 4.4, "(": 3.9, ")": 3.9, "[": 2.8, "]": 2.8,
        "|": 2.8, "/": 5.0, "*": 5.0, "!": 2.8, "'": 2.8, ".": 2.8, ":": 2.8, ";": 4.4}
_COMMANDS = {"cdot": 7.8, "times": 12.2, "leq": 13.3, "geq": 13.3, "neq": 13.3, ",": 1.7, ";": 2.8, "quad": 10.0,
             "qquad": 20.0, "min": 17.0, "max": 19.5, "log": 13.0, "lfloor": 4.4, "rfloor": 4.4, "lceil": 4.4,
             "rceil": 4.4, "{": 5.0, "}": 5.0, "infty": 10.0, "ldots": 13.0, "cdots": 13.0}
_DELIMITERS = {"left": 1.25, "right": 1.25, "bigl": 1.2, "bigr": 1.2, "Bigl": 1.5, "Bigr": 1.5}


def tex_width(tex: str) -> float:
    """An estimate, in points at 10 pt, of how wide a display formula of the LaTeX the report
    prints sets: digits and letters at their Computer Modern widths, sub- and superscripts at
    70 %, a fraction as its wider part, delimiters grown with what they enclose. Checked
    against TeX's own widths of every formula the shipped examples give: 0.9 to 1.1 times them,
    so with its 10 % margin never below)."""
    width, _ = _width(tex, 0, 1.0, 0)
    return width * 1.1  # the margin that keeps it an over-estimate


def _group(tex: str, i: int, scale: float, depth: int, text: bool = False) -> tuple[float, int]:
    """The width of a ``{...}`` group (or one token) starting at ``i``."""
    if i < len(tex) and tex[i] == "{":
        return _width(tex, i + 1, scale, depth, stop="}", text=text)
    return _width(tex, i, scale, depth, single=True, text=text)


def _width(tex: str, i: int, scale: float, depth: int, stop: str | None = None,
           single: bool = False, text: bool = False) -> tuple[float, int]:
    total = 0.0
    while i < len(tex):
        ch = tex[i]
        if stop is not None and ch == stop:
            return total, i + 1
        if ch == "{":
            w, i = _width(tex, i + 1, scale, depth, stop="}")
            total += w
        elif ch in "_^":
            w, i = _group(tex, i + 1, scale * 0.7 if scale > 0.5 else scale, depth)
            total += w
        elif ch == "\\":
            j = i + 1
            while j < len(tex) and tex[j].isalpha():
                j += 1
            name = tex[i + 1:j] if j > i + 1 else tex[i + 1:i + 2]
            i = j if j > i + 1 else i + 2
            if name in ("frac", "tfrac", "dfrac"):
                sub = scale * 0.7 if depth >= 1 or name == "tfrac" else scale
                num, i = _group(tex, i, sub, depth + 1)
                den, i = _group(tex, i, sub, depth + 1)
                total += max(num, den) + 2.4 * scale
            elif name in ("mathrm", "text", "mathit", "texttt", "operatorname"):
                w, i = _group(tex, i, scale, depth, text=name in ("text", "texttt"))
                total += w
            elif name in _DELIMITERS:
                grow = _DELIMITERS[name] if depth == 0 else 1.0
                total += 3.9 * scale * grow + (0 if tex[i:i + 1] != "\\" else 1.1 * scale)
                if tex[i:i + 1] == "\\":  # \left\{: the brace is part of the delimiter
                    i += 2
                elif i < len(tex):
                    i += 1
            else:
                total += _COMMANDS.get(name, 8.0) * scale  # a Greek letter or another symbol
        elif ch.isspace():
            total += 3.4 * scale if text else 0.0  # a space counts in text, not in math
            i += 1
            if not text:
                continue
        elif ch.isdigit():
            total += 5.0 * scale
            i += 1
        elif ch.isalpha():
            total += (5.6 if ch.islower() else 7.5) * scale
            i += 1
        else:
            total += _OPS.get(ch, 5.0) * scale
            i += 1
        if single:
            return total, i
    return total, i


LINE_POINTS = 250.0  # the widest line of a broken display equation, in points (an article's text is 345 pt)
LINE_WIDTH = LINE_POINTS


def latex_lines(expr: sympy.Expr, printer: LatexPrinter, width: float = LINE_WIDTH) -> tuple[str, ...]:
    """``expr`` in LaTeX, broken into lines of at most about ``width`` points for a display
    equation: a sum between its terms, a maximum or minimum one argument a line (as cases:
    ``\\max\\Bigl\\{A, B\\Bigr\\}``), a product with a long factor as the rest times that
    factor in ``\\Bigl(...\\Bigr)``. Each line after the first continues the one before it (the
    caller indents it); a part that cannot be broken (a power, a fraction of atoms) stays whole."""
    return tuple(_break(expr, printer, width))


def _break(expr: sympy.Expr, p: LatexPrinter, width: float) -> list[str]:
    whole = p.doprint(expr)
    if tex_width(whole) <= width:
        return [whole]
    if isinstance(expr, (sympy.Max, sympy.Min)):
        name = r"\max" if isinstance(expr, sympy.Max) else r"\min"
        head = name + r"\Bigl\{"
        inner = width - tex_width(head)
        args = sorted(expr.args, key=sympy.default_sort_key)
        lines: list[str] = []
        for i, a in enumerate(args):
            part = _break(a, p, inner)
            part[-1] += r"\Bigr\}" if i == len(args) - 1 else ","
            lines += part
        lines[0] = head + lines[0]
        return lines
    if isinstance(expr, sympy.Add):
        lines, current = [], ""
        for i, term in enumerate(p._as_ordered_terms(expr, order=None)):
            negative = term.could_extract_minus_sign()
            body = -term if negative else term
            sign = "- " if negative else ("+ " if i else "")
            text = p.doprint(body)  # the same text in plain mode, kept per part
            if isinstance(body, sympy.Add):
                text = rf"\left({text}\right)"
            if tex_width(sign + text) > width:
                if current:
                    lines.append(current)
                inner = _break(body, p, width - tex_width(sign + r"\Bigl(\Bigr)"))
                if isinstance(body, sympy.Add):
                    inner[0], inner[-1] = r"\Bigl(" + inner[0], inner[-1] + r"\Bigr)"
                inner[0] = sign + inner[0]
                lines += inner[:-1]
                current = inner[-1]
            elif current and tex_width(current + " " + sign + text) > width:
                lines.append(current)
                current = sign + text
            else:
                current = (current + " " + sign + text) if current else sign + text
        if current:
            lines.append(current)
        return lines
    if isinstance(expr, sympy.Mul):
        factors = list(expr.args)
        long = [f for f in factors if isinstance(f, (sympy.Add, sympy.Max, sympy.Min))]
        if long:
            big = max(long, key=lambda f: tex_width(p.doprint(f)))
            rest = expr / big
            prefix = "" if rest == 1 else p.doprint(rest) + r" \cdot "
            paren = r"\Bigl(\Bigr)" if isinstance(big, sympy.Add) else ""
            inner = _break(big, p, width - tex_width(prefix + paren))
            if paren:
                inner[0], inner[-1] = r"\Bigl(" + inner[0], inner[-1] + r"\Bigr)"
            inner[0] = prefix + inner[0]
            return inner
    return [whole]


def symbol_names(exprs: Iterable[sympy.Expr], axes: Iterable[str] = ()) -> dict[sympy.Symbol, str]:
    axes = tuple(axes)
    names: dict[sympy.Symbol, str] = {}
    for e in exprs:
        for s in getattr(e, "free_symbols", ()):
            names[s] = display_name(s.name, axes)
    return names


def latex(expr: sympy.Expr, axes: Iterable[str] = ()) -> str:
    return PlacementLatexPrinter(symbol_names([expr], axes)).doprint(expr)


def _expr(value) -> sympy.Expr:
    """An engine value as a sympy expression (numbers only are converted; never text)."""
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, Fraction):
        return sympy.Rational(value.numerator, value.denominator)
    raise TypeError(f"not an engine value: {value!r}")


def peak(*args: sympy.Expr) -> sympy.Expr:
    """The maximum over pipeline stages, built without sympy's search for an order between
    symbolic arguments (``Max._find_localzeros``, which tries to prove a >= b and dominated
    the derivation's time). Equal arguments collapse; numbers, and two arguments whose
    difference is a number, are decided at once; otherwise the maximum stays symbolic, with
    sympy's canonical argument order, and is evaluated once its symbols are bound."""
    uniq = list(dict.fromkeys(_expr(a) for a in args))
    if len(uniq) == 1:
        return uniq[0]
    if all(a.is_number for a in uniq):
        return sympy.Max(*uniq)
    if len(uniq) == 2:
        d = sympy.expand(uniq[0] - uniq[1])
        if d.is_number:
            return uniq[0] if d >= 0 else uniq[1]
    return sympy.Max(*uniq, evaluate=False)
