"""Long case analyses in the reports (costreport.pieces): any ``Piecewise`` printed longer than
``LONG_TEXT`` characters, whatever its cases, is named in the displayed formula, defined once with
every case, and valued at the bindings as the whole formula is; a short one stays inline."""

from fractions import Fraction

import pytest
import sympy

from placement_logic.costreport.build import _Q
from placement_logic.costreport.pieces import LONG_TEXT, latex_items, text_lines
from placement_logic.costs.symbolic import LINE_POINTS, symbol, tex_width

X, Y = symbol("x"), symbol("y")


def _cases(n: int) -> sympy.Piecewise:
    """x's value v gives 1000·v + 7 for v = 1..n, otherwise x + y."""
    return sympy.Piecewise(*[(1000 * v + 7, sympy.Eq(X, v)) for v in range(1, n + 1)], (X + Y, True), evaluate=False)


def _by_hand(n: int, x: int, y: int) -> int:
    return 1000 * x + 7 if 1 <= x <= n else x + y


@pytest.mark.parametrize("n", [6, 20, 60])
@pytest.mark.parametrize("x", [1, 5, 61])
def test_long_case_analysis_named_and_valued(n, x):
    q = _Q({X: sympy.Integer(x), Y: sympy.Integer(3)}, ("x", "y"))
    made = q(12345678 * _cases(n) * (Y - 1) + 99 * X)
    assert "Piecewise" in made.formula and "Piecewise" not in made.shown and "P1" in made.shown
    assert all(tex_width(line) <= LINE_POINTS for line in made.latex_lines)
    assert r"\mathcal{P}_{1}" in made.latex_lines[0] and r"\begin{cases}" in made.latex  # the whole LaTeX kept
    (piece,) = made.pieces
    assert len(piece.cases) == n and piece.exact == _by_hand(n, x, 3)
    assert made.exact == Fraction(12345678 * _by_hand(n, x, 3) * 2 + 99 * x)
    item = latex_items([piece], str)[0]
    assert item.count(" where $") == n and f"= {_by_hand(n, x, 3)}$" in item
    assert text_lines([piece])[0].startswith(f"P1: {n + 1} cases") and f"P1 = {_by_hand(n, x, 3)}" in text_lines([piece])[0]


def test_short_case_analysis_stays_inline_and_one_name_per_expression():
    short = sympy.Piecewise((1, sympy.Eq(X, 2)), (X, True))
    assert len(str(short)) <= LONG_TEXT
    q = _Q({X: sympy.Integer(2), Y: sympy.Integer(1)}, ("x", "y"))
    assert q(7 * short + Y).pieces == () and q(7 * short + Y).shown == ""
    a, b = q(3 * _cases(8) + X), q(5 * _cases(8) * Y)
    assert a.pieces == b.pieces and a.pieces[0].name == "P1"
    assert q(_cases(9)).pieces[0].name == "P2"
    unbound = _Q({}, ("x", "y"))(2 * _cases(8))
    assert unbound.pieces[0].exact is None and unbound.exact is None
