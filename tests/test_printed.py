"""costreport.printed.Printed is sympy's ``str`` (the oracle), its shared subformulas printed
once: compared with ``str`` on hand cases (floats at the top and inside, where sympy prints
them differently), on one example's report formulas, and in the slow tier on every formula of
every example's cost report."""

from __future__ import annotations

import importlib
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic.costreport.printed import Printed
from placement_logic.costs.symbolic import symbol

build_mod = importlib.import_module("placement_logic.costreport.build")  # the module (the package exports its build)

ROOT = Path(__file__).resolve().parent.parent
pp, tp, dp = (symbol(n) for n in ("pp", "tp", "dp"))

HAND = [
    sympy.Float("2.50000"), sympy.Float("2.5") * pp, pp / 3 + sympy.Float("0.1250") * tp,
    sympy.Max(pp, tp + 1, evaluate=False) * 2 / dp, sympy.Min(64, pp, evaluate=False),
    sympy.Piecewise((pp, pp > 4), (tp, True)), sympy.Rational(-3, 7) * pp ** -2 + sympy.floor(tp / 2),
    -pp - tp, sympy.Integer(0), sympy.Symbol("x"), Fraction(3, 4), 12,
]


def test_hand_cases_print_as_str():
    text = Printed()
    for expr in HAND + HAND:  # twice: the second time from the store
        assert text(expr) == str(expr), expr
    shared = sympy.Float("1.50") * pp
    assert text(shared) == str(shared) and text(shared + tp) == str(shared + tp)  # the float below the top


def _report_formulas(path: Path, monkeypatch) -> list:
    from placement_logic.frontend.loader import load_spec

    seen: list = []
    original = build_mod.factored

    def spy(expr):
        out = original(expr)
        seen.append(out)
        return out

    monkeypatch.setattr(build_mod, "factored", spy)
    build_mod.build(load_spec(str(path)), latex=False)
    return seen


def test_one_report_prints_as_str(monkeypatch):
    formulas = _report_formulas(ROOT / "examples/llama70b_3d.place", monkeypatch)
    assert len(formulas) > 50 and any(f.has(sympy.Max) for f in formulas)
    text = Printed()
    assert [text(f) for f in formulas] == [str(f) for f in formulas]


@pytest.mark.slow  # every example's cost report
def test_every_report_prints_as_str(monkeypatch):
    from placement_logic.diagnostics import DiagnosticError

    n = 0
    for path in sorted((ROOT / "examples").rglob("*.place")):
        try:
            formulas = _report_formulas(path, monkeypatch)
        except DiagnosticError:
            continue
        text = Printed()
        for f in formulas:
            assert text(f) == str(f), (path, f)
            assert text(f.xreplace({pp: 4})) == str(f.xreplace({pp: 4})), (path, f)
        n += len(formulas)
    assert n > 1000
