"""``costs.extrema.dominant`` and the report's maxima: an argument shown larger everywhere is
larger (oracle: exact values at sample points), and the report's factoring, which takes it
without sympy's proof, builds the maximum or minimum sympy's own evaluation builds (oracle:
``sympy.Max``/``sympy.Min`` themselves) on the hand cases and, in the slow tier, on every
maximum and minimum of every example's cost report."""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic.costreport import factored as factored_mod
from placement_logic.costs.extrema import dominant, exact_at
from placement_logic.costs.symbolic import symbol

ROOT = Path(__file__).resolve().parent.parent
pp, tp, dp, m = (symbol(n) for n in ("pp", "tp", "dp", "m"))

ORDERED = [  # (smaller, larger) everywhere on positive values
    (15728640 * (200 / tp + 1 / pp + 52224 / (pp * tp)) / dp, 98304 * (1 + 32000 / tp + 160 / pp + 8355840 / (pp * tp)) / dp),
    (5242880 * (200 / tp + 1 / pp + 52224 / (pp * tp) + 600 / (dp * tp) + 3 / (dp * pp) + 156672 / (dp * pp * tp)),
     32768 * (1 + 32000 / tp + 160 / pp + 8355840 / (pp * tp) + 3 / dp + 96000 / (dp * tp) + 480 / (dp * pp)
              + 25067520 / (dp * pp * tp))),
    (pp, pp + 1),
    (m / pp, m / pp + m / (pp * tp)),
]
NOT_SHOWN = [  # no claim: equal, unordered, a negative term, a number, a maximum, another symbol
    (pp, pp), (pp, tp), (pp, 2 * pp - 1), (sympy.Integer(64), pp), (pp + 1, sympy.Max(pp, tp, evaluate=False)),
    (sympy.Symbol("x") + 1, sympy.Symbol("x")), (pp, pp + sympy.sqrt(tp)), (pp, tp, dp),
    ((pp - tp) ** 2 + pp, pp),  # larger, but not a sum of positive terms once expanded
]
POINTS = [Fraction(1), Fraction(1, 3), Fraction(7), Fraction(4096), Fraction(5, 2)]


@pytest.mark.parametrize("small,large", ORDERED)
def test_dominant_is_larger_and_sympy_agrees(small, large):
    assert dominant([small, large]) == 1 and dominant([large, small]) == 0
    symbols = sorted(small.free_symbols | large.free_symbols, key=lambda s: s.name)
    for point in itertools.product(POINTS, repeat=len(symbols)):
        values = dict(zip(symbols, point))
        assert exact_at(large, values) > exact_at(small, values)
    for kind, want in ((sympy.Max, large), (sympy.Min, small)):
        ours = factored_mod._extremum(kind, [small, large])
        assert ours == kind(small, large) == want and sympy.srepr(ours) == sympy.srepr(kind(small, large))


def test_an_order_sympy_does_not_prove():
    """sympy's evaluation keeps ``Max(pp**2 + 1, (pp + 1)**2)`` (it does not expand the
    difference); the report's factoring takes the larger argument, the same value at every
    point. No example's report has such a maximum (the slow test below)."""
    small, large = pp ** 2 + 1, (pp + 1) ** 2
    assert dominant([small, large]) == 1
    assert sympy.Max(small, large).func is sympy.Max
    assert factored_mod._extremum(sympy.Max, [small, large]) == large
    assert factored_mod._extremum(sympy.Min, [small, large]) == small
    for v in POINTS:
        assert exact_at(sympy.Max(small, large), {pp: v}) == exact_at(large, {pp: v})


@pytest.mark.parametrize("args", NOT_SHOWN)
def test_no_claim(args):
    assert dominant(list(args)) is None


@pytest.mark.slow  # every example's cost report, with sympy's own evaluation of each maximum beside
def test_report_extrema_are_sympys_on_every_example(monkeypatch):
    from placement_logic.costreport import build
    from placement_logic.diagnostics import DiagnosticError
    from placement_logic.frontend.loader import load_spec

    seen: list = []
    original = factored_mod._extremum

    def spy(kind, args):
        out = original(kind, args)
        seen.append((kind, tuple(args), out))
        return out

    monkeypatch.setattr(factored_mod, "_extremum", spy)
    # the factored forms are memoised per sub-formula in the process: earlier tests' reports would hide
    # every extremum from the spy
    monkeypatch.setattr(factored_mod, "_DONE", {})
    shown = 0
    for path in sorted((ROOT / "examples").rglob("*.place")):
        try:
            build(load_spec(str(path)), latex=False)
        except DiagnosticError:
            continue  # a spec whose report is an input error has no formulas
        for kind, args, out in seen:
            if dominant(list(args)) is not None:
                shown += 1
                want = kind(*args)
                assert out == want and sympy.srepr(out) == sympy.srepr(want), (path, kind, args)
        seen.clear()
    assert shown >= 2  # the llama70b report's two maxima at least
