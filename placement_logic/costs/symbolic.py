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

import re
from fractions import Fraction
from typing import Callable, Iterable, Mapping

import sympy
from sympy.printing.latex import LatexPrinter

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError
from ..ir.walker import Target, evaluate

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


def _div(node: ir.Op, args: list[sympy.Expr]) -> sympy.Expr:
    if args[1] == 0:
        raise DiagnosticError([Diagnostic("PL204", "division by zero", node.span)])
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
    raise DiagnosticError([Diagnostic("PL400", f"unknown operator '{node.op}' in a value expression", node.span)])


def _not_a_value(node) -> sympy.Expr:
    raise DiagnosticError([Diagnostic("PL400", f"not a value expression: {type(node).__name__}")])


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


def tex_width(tex: str) -> int:
    """A conservative estimate of how many characters wide a LaTeX formula sets (a fraction
    counts its numerator and its denominator side by side; sub- and superscripts in full)."""
    s = re.sub(r"\\(left|right|[bB]igl|[bB]igr|mathrm|operatorname|frac)\b", "", tex)
    s = s.replace(r"\,", "")
    s = re.sub(r"\\[A-Za-z]+", "x", s)
    s = re.sub(r"[{}^_\s]", "", s)
    return len(s)


LINE_WIDTH = 48  # estimated characters of one line of a broken display equation


def latex_lines(expr: sympy.Expr, printer: LatexPrinter, width: int = LINE_WIDTH) -> tuple[str, ...]:
    """``expr`` in LaTeX, broken into lines of at most about ``width`` characters for a display
    equation: a sum between its terms, a maximum or minimum one argument a line (as cases:
    ``\\max\\Bigl\\{A, B\\Bigr\\}``), a product with a long factor as the rest times that
    factor in ``\\Bigl(...\\Bigr)``. Each line after the first continues the one before it (the
    caller indents it); a part that cannot be broken (a power, a fraction of atoms) stays whole."""
    return tuple(_break(expr, printer, width))


def _break(expr: sympy.Expr, p: LatexPrinter, width: int) -> list[str]:
    whole = p.doprint(expr)
    if tex_width(whole) <= width:
        return [whole]
    if isinstance(expr, (sympy.Max, sympy.Min)):
        name = r"\max" if isinstance(expr, sympy.Max) else r"\min"
        args = sorted(expr.args, key=sympy.default_sort_key)
        lines: list[str] = []
        for i, a in enumerate(args):
            part = _break(a, p, width)
            part[-1] += r"\Bigr\}" if i == len(args) - 1 else ","
            lines += part
        lines[0] = name + r"\Bigl\{" + lines[0]
        return lines
    if isinstance(expr, sympy.Add):
        lines, current = [], ""
        for i, term in enumerate(p._as_ordered_terms(expr, order=None)):
            negative = term.could_extract_minus_sign()
            body = -term if negative else term
            sign = "- " if negative else ("+ " if i else "")
            text = p._print(body)
            if isinstance(body, sympy.Add):
                text = rf"\left({text}\right)"
            if tex_width(text) > width:
                if current:
                    lines.append(current)
                inner = _break(body, p, width)
                if isinstance(body, sympy.Add):
                    inner[0], inner[-1] = r"\Bigl(" + inner[0], inner[-1] + r"\Bigr)"
                inner[0] = sign + inner[0]
                lines += inner[:-1]
                current = inner[-1]
            elif current and tex_width(current + text) + 2 > width:
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
            inner = _break(big, p, width)
            if isinstance(big, sympy.Add):
                inner[0], inner[-1] = r"\Bigl(" + inner[0], inner[-1] + r"\Bigr)"
            if rest != 1:
                inner[0] = p.doprint(rest) + r" \cdot " + inner[0]
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


SYMPY_BUDGET = 5.0  # seconds one simplification or solution of a user's expression may take


class OutOfTime(Exception):
    """A sympy call that ran past its budget (its result is then unknown, never assumed)."""


def bounded(fn: Callable[[], object], seconds: float = SYMPY_BUDGET):
    """``fn()``, or ``OutOfTime`` once ``seconds`` have passed. The limit is a SIGALRM timer, so
    it applies on the main thread of a Unix process (where the CLI runs); elsewhere ``fn`` runs
    unbounded. Every simplification of a user's expression goes through here."""
    import signal
    import threading

    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return fn()

    def expire(signum, frame):
        raise OutOfTime()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
