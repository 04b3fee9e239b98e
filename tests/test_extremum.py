"""``costs.extrema.extremum``: the same maximum or minimum as sympy's, with or without its
search for an order; ``exact_at``: the value ``xreplace`` gives, in ``Fraction``."""

import itertools
from fractions import Fraction

import pytest
import sympy

from placement_logic.costs.extrema import _PROBES, _exact_fn, _NotExact, exact_at, extremum, unordered
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


# the probe's trees: negative coefficients and powers, nested maxima and minima, a sum whose
# terms have different denominators
PROBED = [args[0] for _, args in CASES if not isinstance(args[0], (sympy.Max, sympy.Min))] + [
    a for _, args in CASES for a in args] + [
    (3 * pp - 7 * tp) / (2 * dp) - sympy.Rational(5, 3) / (pp * tp) ** 2,
    sympy.Max(pp / 3, tp - dp, evaluate=False) * sympy.Min(-pp, dp / 7, evaluate=False) ** 3,
    1 / (tp - 2 * pp) - 1 / (sympy.Rational(-1, 3) * dp),
]


@pytest.mark.parametrize("expr", PROBED)
def test_probe_values_are_sympys(expr):
    """``unordered``'s integer-pair evaluation gives, at every probe point, the number sympy's
    substitution gives (and no value where that is zoo)."""
    symbols = sorted(expr.free_symbols, key=lambda s: s.name)
    fn = _exact_fn(expr, symbols)
    for point in itertools.product(_PROBES, repeat=len(symbols)):
        want = expr.xreplace({s: sympy.Rational(v.numerator, v.denominator) for s, v in zip(symbols, point)})
        try:
            n, d = fn(tuple((v.numerator, v.denominator) for v in point))
        except _NotExact:
            assert not want.is_Rational  # zoo: 1/0
            continue
        assert d > 0 and Fraction(n, d) == Fraction(int(want.p), int(want.q))


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


# piecewise forms as the kernel model writes them (the first row whose bound is reached), with
# conjunctions, disjunctions and negations, floors and ceilings
PIECEWISE = [
    sympy.Piecewise((sympy.Rational(9, 10), pp * tp >= 64), (sympy.Rational(1, 2), pp * tp >= 8), (sympy.Rational(1, 5), True)),
    sympy.Piecewise((pp / tp, sympy.And(pp > 2, tp < 8)), (tp - pp, sympy.Or(sympy.Eq(pp, 4), tp <= 2)), (dp, True)),
    sympy.Piecewise((1 / (tp - 8), sympy.Ne(tp, 8)), (pp, True)),  # the skipped branch divides by zero at tp = 8
    sympy.Piecewise((pp, sympy.Not(tp > pp)), (2 * tp, True)),
    sympy.ceiling(pp * dp / 3) + sympy.floor(tp / pp - dp),
    sympy.Max(0, sympy.ceiling((pp - 3) / dp)) * sympy.Min(tp, 3 * pp - 1),
]


@pytest.mark.parametrize("expr", PIECEWISE)
def test_exact_at_of_piecewise_floor_and_ceiling_matches_xreplace(expr):
    """At every point of a small grid, the value sympy's substitution evaluates to."""
    seen = 0
    for p, t, d in itertools.product((1, 2, 3, 4, 8), (1, 2, 4, 8, 16), (Fraction(1, 2), 1, 3)):
        subs = {pp: sympy.Integer(p), tp: sympy.Integer(t), dp: sympy.Rational(d.numerator, d.denominator)}
        want = expr.xreplace(subs)
        got = exact_at(expr, {s: Fraction(int(v.p), int(v.q)) for s, v in subs.items()})
        assert want.is_Rational and got == Fraction(int(want.p), int(want.q)), (expr, subs, got, want)
        seen += 1
    assert seen == 75


def test_exact_at_without_an_applying_branch_or_a_bound_condition():
    values = {pp: Fraction(4), tp: Fraction(8)}
    assert exact_at(sympy.Piecewise((pp, tp > 8), (tp, pp > 4)), values) is None  # no branch holds
    assert exact_at(sympy.Piecewise((pp, dp > 1), (tp, True)), values) is None  # dp unbound
    assert exact_at(sympy.Piecewise((pp, tp > 4), (dp, True)), values) == 4  # the branch taken is bound
