"""``costs.extrema.extremum``: the same maximum or minimum as sympy's, with or without its
search for an order; ``exact_at``: the value ``xreplace`` gives, in ``Fraction``."""

from fractions import Fraction

import pytest
import sympy

from placement_logic.costs.extrema import exact_at, extremum, unordered
from placement_logic.costs.symbolic import symbol

pp, tp, dp, m = (symbol(n) for n in ("pp", "tp", "dp", "m"))

CASES = [
    (sympy.Min, (sympy.Integer(64), pp)),
    (sympy.Min, (sympy.Integer(128), 3 * pp - 1)),
    (sympy.Min, (m * 2, 3 * pp - 1)),
    (sympy.Max, (4194304 * (157 + 11360 * (pp + 1) / pp) / tp,
                 33554432 * (sympy.Min(64, 2 * pp) + 1420 * sympy.Min(128, 3 * pp - 1) / pp) / tp)),
    (sympy.Max, (15728640 * (200 / tp + 1 / pp + 52224 / (pp * tp)) / dp,
                 98304 * (1 + 32000 / tp + 160 / pp + 8355840 / (pp * tp)) / dp)),  # sympy orders these
    (sympy.Max, (pp + 1, pp)),  # one is always larger
    (sympy.Max, (pp, pp)),
    (sympy.Max, (sympy.Integer(3), sympy.Integer(5))),
    (sympy.Max, (pp, sympy.Max(tp, dp, evaluate=False))),  # nested: left to sympy
    (sympy.Min, (pp, tp, dp)),
]


@pytest.mark.parametrize("kind,args", CASES)
def test_extremum_is_sympys(kind, args):
    ours, theirs = extremum(kind, *args), kind(*args)
    assert ours == theirs
    assert str(ours) == str(theirs) and ours.args == theirs.args


def test_unordered_needs_both_orders():
    assert unordered((sympy.Integer(64), pp))
    assert unordered((pp, tp, dp))
    assert not unordered((pp + 1, pp))
    assert not unordered((pp, pp))
    assert not unordered((sympy.Integer(3), sympy.Integer(5)))  # numbers: sympy compares them
    assert not unordered((sympy.Symbol("x"), sympy.Integer(2)))  # not a spec symbol: no claim


def test_exact_at_matches_xreplace():
    subs = {pp: sympy.Integer(4), tp: sympy.Integer(8), dp: sympy.Rational(3, 2)}
    values = {s: Fraction(int(v.p), int(v.q)) for s, v in subs.items()}
    for expr in (args[0] for _, args in CASES):
        got, want = exact_at(expr, values), expr.xreplace(subs)
        if want.free_symbols:
            assert got is None
        else:
            assert got == Fraction(int(want.p), int(want.q)) and str(got) == str(want)
    assert exact_at(1 / (pp - 4), values) is None  # sympy's zoo
    assert exact_at(sympy.sqrt(pp), values) is None
    assert exact_at(sympy.Float(1.5) * pp, values) is None
