"""Long case analyses named, not printed inline: a ``Piecewise`` whose plain text is longer than
``LONG_TEXT`` characters (such as the Ulysses head share's exceptional sizes, costs.ulysses_share)
is shown in the reports' formulas as a symbol of its own (𝒫₁, ``P1`` in text), defined once per
report with its cases and its value at the report's bindings.

Input: a formula and the report's registry. Output: the formula with each long case analysis
replaced by its symbol, and the ``Piece`` records that define them. The JSON report keeps the
full formula (docs/json.md); the LaTeX "where" list (``latex_items``) and the Markdown and text
reports (``text_lines``) give each piece's cases, its remaining case and its value. The rule is
the same for every case analysis, whatever made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import sympy

LONG_TEXT = 100  # a case analysis printed longer than this (sympy's plain text) is named


@dataclass(frozen=True)
class Piece:
    """One named case analysis: its symbol, its cases (value, condition), its remaining value and
    its value at the report's bindings (None while a symbol it depends on is unbound)."""

    name: str  # plain, as the Markdown and text reports print it (P1)
    tex: str  # as the LaTeX report prints it (\mathcal{P}_{1})
    formula: str  # the whole case analysis in sympy's plain form (the JSON report's)
    cases: tuple[tuple[str, str], ...]  # (value, condition) in LaTeX, in order; the first that holds applies
    otherwise: str  # the value where no case holds, in LaTeX ("" when the last case's condition is not True)
    text_cases: tuple[tuple[str, str], ...]  # the same in plain text
    text_otherwise: str
    exact: Fraction | None


class Pieces:
    """The report's named case analyses, each named once (by its expression) in order of first use."""

    def __init__(self, text: Callable[[sympy.Basic], str], taken: set[str]):
        self.text = text  # the report's plain printer
        self.taken = taken  # names the spec already uses
        self.named: dict[sympy.Basic, tuple[sympy.Symbol, Piece | None]] = {}

    def _long(self, e: sympy.Basic) -> bool:
        return isinstance(e, sympy.Piecewise) and len(self.text(e)) > LONG_TEXT

    def _outermost(self, e: sympy.Basic, out: dict) -> None:
        if self._long(e):
            out[e] = None
        else:
            for a in e.args:
                self._outermost(a, out)

    def _symbol(self, pw: sympy.Basic) -> sympy.Symbol:
        if pw not in self.named:
            n = len(self.named) + 1
            while f"P{n}" in self.taken:
                n += 1
            self.taken.add(f"P{n}")
            self.named[pw] = (sympy.Symbol(f"P{n}"), None)
        return self.named[pw][0]

    def name(self, expr: sympy.Expr) -> tuple[sympy.Expr, dict[sympy.Basic, sympy.Symbol]]:
        """``expr`` with each outermost long case analysis replaced by its symbol, and those replaced."""
        found: dict = {}
        self._outermost(expr, found)
        if not found:
            return expr, {}
        repl = {pw: self._symbol(pw) for pw in found}
        return expr.xreplace(repl), repl

    def piece(self, pw: sympy.Piecewise, printer, exact: Fraction | None) -> Piece:
        """The record of a named case analysis (made once; ``printer`` prints LaTeX, or None for text only)."""
        sym, made = self.named[pw]
        if made is not None:
            return made
        tex = (lambda e: printer.doprint(e)) if printer is not None else (lambda e: "")
        cases = [(e, c) for e, c in pw.args if c is not sympy.true]
        rest = [e for e, c in pw.args if c is sympy.true]
        n = sym.name[1:]
        made = Piece(name=sym.name, tex=rf"\mathcal{{P}}_{{{n}}}", formula=self.text(pw),
                     cases=tuple((tex(e), tex(c)) for e, c in cases), otherwise=tex(rest[0]) if rest else "",
                     text_cases=tuple((self.text(e), self.text(c)) for e, c in cases),
                     text_otherwise=self.text(rest[0]) if rest else "", exact=exact)
        self.named[pw] = (sym, made)
        return made


def latex_items(pieces: list[Piece], number: Callable[[Fraction], str]) -> list[str]:
    """The "where" list's items of the named case analyses: the cases in order (TeX breaks the
    paragraph between them), the remaining value, and the value at the bindings (``number``: math mode)."""
    out = []
    for p in pieces:
        text = rf"  \item[${p.tex}$] a case analysis of {len(p.cases) + bool(p.otherwise)} cases, the first that holds: "
        text += "; ".join(rf"${v}$ where ${c}$" for v, c in p.cases)
        if p.otherwise:
            text += rf"; otherwise ${p.otherwise}$"
        if p.exact is not None:
            text += rf"; at the bindings above, ${p.tex} = {number(p.exact)}$"
        out.append(text)
    return out


def text_lines(pieces: list[Piece]) -> list[str]:
    """The Markdown and text reports' definitions of the named case analyses, one line each."""
    out = []
    for p in pieces:
        cases = "; ".join(f"{v} where {c}" for v, c in p.text_cases)
        rest = f"; otherwise {p.text_otherwise}" if p.text_otherwise else ""
        value = f"; here {p.name} = {p.exact}" if p.exact is not None else ""
        out.append(f"{p.name}: {len(p.text_cases) + bool(p.text_otherwise)} cases, the first that holds: "
                   f"{cases}{rest}{value}")
    return out


def of_report(quantities) -> list[Piece]:
    """The pieces the quantities use, each once, in order."""
    seen: dict[str, Piece] = {}
    for q in quantities:
        if q is not None:
            for p in q.pieces:
                seen.setdefault(p.name, p)
    return sorted(seen.values(), key=lambda p: int(p.name[1:]))


def _quantities(obj, out: list) -> None:
    from dataclasses import fields, is_dataclass

    if hasattr(obj, "pieces") and hasattr(obj, "formula"):
        out.append(obj)
    elif is_dataclass(obj):
        for f in fields(obj):
            _quantities(getattr(obj, f.name), out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _quantities(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _quantities(v, out)


def of_plan(plan) -> list[Piece]:
    """The pieces the quantities of a plan's memory and communication use (the step time's rows print their whole
    formula, or none)."""
    from dataclasses import replace

    found: list = []
    _quantities(replace(plan, time=None), found)
    return of_report(found)
