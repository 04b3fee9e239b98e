"""``costs.symbolic.at_least``: a size against a tabulated bound, as sympy's ``x >= bound`` gives
it (the oracle), for the sizes built without sympy's query (a positive constant times powers of
spec symbols) and for every other kind: sums, minima, numbers, symbols with other assumptions."""

from __future__ import annotations

import itertools
import random

import sympy

from placement_logic.costs.symbolic import _fills_the_positives, at_least, symbol

MB, TP, CP, PP = (symbol(n) for n in ("mb", "tp", "cp", "pp"))
N = sympy.Symbol("n", positive=True, integer=True)  # an integer: n >= 1 decides small bounds
R = sympy.Symbol("r", real=True)  # not known to be positive


def _sizes():
    rng = random.Random(3)
    out = [MB, 3 * MB * TP ** 2, sympy.sqrt(MB) * 5, MB / (CP * TP), 7696581394432 * MB / TP]
    for _ in range(20):
        c = sympy.Rational(rng.randint(1, 10 ** 9), rng.randint(1, 50))
        powers = [s ** rng.choice((-2, -1, 1, 2, sympy.Rational(1, 2))) for s in rng.sample((MB, TP, CP, PP), 2)]
        out.append(c * sympy.Mul(*powers))
    out += [2637824 / PP + 2684354560 / (PP * sympy.Min(8, TP)) + 138420420608 / (PP * TP),
            MB / TP + 3 * MB / CP + MB * sympy.Max(2, CP) ** 2, 1 / PP + 5 / (PP * TP) ** 2]  # every value > 0
    out += [PP + 1 / PP, MB / TP + TP, 2 * MB + sympy.Rational(1, 2), MB * sympy.Min(8, MB), sympy.Min(8, TP) / PP + TP,
            MB + N, MB / TP + R ** 2]  # bounded below, or not only spec symbols
    out += [MB + 1, 2637824 / PP + 2684354560 / (PP * sympy.Min(8, TP)), sympy.Min(8, TP), 3 * N, N / TP, R,
            2 * R * MB, MB - TP, sympy.Integer(5), sympy.Rational(1, 3), sympy.Max(MB, 64), 8192, 0]
    return out


def test_every_size_against_every_bound_is_sympys_relation():
    bounds = [sympy.Rational(b) for b in (-4, 0, sympy.Rational(1, 2), 1, 2, 3, 64, 4096, 64 * 2 ** 23)]
    built = 0
    for x, b in itertools.product(_sizes(), bounds):
        assert at_least(x, b) == (x >= b), (x, b)
        built += b.is_positive and _fills_the_positives(x)
    assert built > 100  # the path without the query was taken


def test_which_sizes_fill_the_positives():
    assert all(_fills_the_positives(x) for x in (MB, MB / TP, 5 * sympy.sqrt(MB) * CP ** -2, MB / TP + 3 * MB / CP,
                                                  2637824 / PP + 2684354560 / (PP * sympy.Min(8, TP))))
    assert not any(_fills_the_positives(x) for x in (MB + 1, 3 * N, R * MB, sympy.Min(8, TP), sympy.Integer(4),
                                                      -MB, sympy.Max(MB, 64), 8192, PP + 1 / PP,
                                                      MB * sympy.Min(8, MB), 2 * MB + 1, MB / TP + TP))
