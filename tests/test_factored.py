"""costreport.factored is sympy's ``factor_terms``, walked once per subformula: checked against
``sympy.factor_terms`` itself (the oracle) on the formulas a report factors (memory, traffic and
the step-time model with its maxima, minima and piecewise size classes), node for node."""

from __future__ import annotations

from pathlib import Path

import pytest
import sympy

from placement_logic import costs
from placement_logic.costreport.factored import factored
from placement_logic.costs import steptime
from placement_logic.costs.compiled import cost_exprs
from placement_logic.frontend.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # sympy's own factor_terms of the step-time model takes seconds; the quick tier has the cases below
def test_factored_is_factor_terms_on_report_formulas():
    spec = load_spec(str(ROOT / "examples/llama70b_3d.place"))
    plan = spec.plans[0]
    pc = costs.derive(plan)
    st = steptime.step_time(pc, steptime.catalogue_hardware(plan, "h100_sxm", plan.mesh.hardware))
    forms = [*cost_exprs(pc).values(), st.step, st.compute, st.exposed, st.mfu, st.tokens_per_second]
    assert any(f.has(sympy.Max) for f in forms) and any(f.has(sympy.Piecewise) for f in forms)
    points = [{x: v for x in set().union(*(f.free_symbols for f in forms))} for v in (1, 2, 3, 8)]
    for f in forms:
        if not f.has(sympy.Piecewise):
            assert sympy.srepr(factored(f)) == sympy.srepr(sympy.factor_terms(f)), f
            continue
        # a case analysis is rebuilt as written (evaluate=False: sympy's collapsing of many cases takes minutes), so
        # its form may differ from factor_terms' and its value may not: the two compared at numbers
        for pt in points:
            assert sympy.simplify(factored(f).subs(pt) - sympy.factor_terms(f).subs(pt)) == 0, (f, pt)


def test_shared_parts_and_signs():
    x, y = sympy.symbols("x y", positive=True)
    shared = 4 * x + 6 * x * y
    for f in (shared, -2 * x - 4 * y, shared / (x + 2 * y), sympy.Max(shared, 2 * y) + shared, sympy.exp(-(x + 2)) + 3):
        assert sympy.srepr(factored(f)) == sympy.srepr(sympy.factor_terms(f)), f
    assert factored(shared) == 2 * x * (2 + 3 * y)  # by hand
