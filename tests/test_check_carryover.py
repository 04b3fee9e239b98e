"""The gradient buffer carried over between optimizer steps (``grads: no_zero_grad``): the checker
against the concrete simulator (tests/simulator_state.py, ``stale_buffer_violations``, which runs
three optimizer steps on every device with and without clearing the buffers) on generated plans,
hand-derived cases, and the statement that changes nothing (PL506)."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import product

import pytest
import simulator_state
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
ROLES = ("data", "tensor", "context", "pipeline", "expert")


def gi_verdicts(report) -> dict[tuple, Verdict]:
    """Whole-plan gradient integrity and replica consistency per group."""
    out = {}
    for o in report.obligations:
        if o.name.startswith("GI grads[") and "] " not in o.name:
            out[("gi", o.name[9:-1])] = o.verdict
        elif o.name.startswith("SC grads["):
            out[("replica", o.name[9:-1])] = o.verdict
    return out


def _with(axes, overrides=(), experts=1):
    spec, p = plan("p", axes, overrides=tuple(overrides), experts=experts)
    return replace(spec, plans=(p,)), p


def simulated(p, seed: int) -> set:
    rng = random.Random(seed)
    found: set = set()
    for sizes in product((1, 2), repeat=len(p.mesh.names)):
        for m in (1, 2):
            found |= simulator_state.stale_buffer_violations(p, {**dict(zip(p.mesh.names, sizes)), "microbatches": m},
                                                             rng)
    return found


@hs.composite
def carry_plans(draw):
    axes = {}
    for n in ["a", "b"][:draw(hs.integers(1, 2))]:
        params = draw(hs.sampled_from(("R", "S*")))
        axes[n] = (draw(hs.sampled_from(ROLES)), f"{params},{draw(hs.sampled_from(('R', 'S')))},"
                                                  f"{draw(hs.sampled_from(('R', 'S')))},R")
    experts = 4 if any(r == "expert" for r, _ in axes.values()) else 1
    return axes, experts, draw(hs.sampled_from([None, "all", "dense", "norms"]))


@pytest.mark.slow
@settings(max_examples=examples(40), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(carry_plans(), hs.integers(0, 10**6))
def test_carried_buffer_agrees_with_the_state_simulator(generated, seed):
    """On plans whose gradient and replica obligations are proved, a buffer left uncleared refutes
    exactly the groups whose updates the simulator shows reading an earlier step's gradient, and
    no replica obligation (every rank carries the same reduced gradient)."""
    axes, experts, group = generated
    spec, p = _with(axes, experts=experts)
    try:
        assume(all(v is Verdict.PROVED for v in gi_verdicts(check_plan(SESSION, spec, p, {})).values()))
    except DiagnosticError:
        assume(False)  # a placement the step refuses (params R on a pipeline axis, ...)
    spec, p = _with(axes, (ov("grads", "no_zero_grad", group),), experts=experts)
    v = gi_verdicts(check_plan(SESSION, spec, p, {}))
    found = simulated(p, seed)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, axes, group)


@pytest.mark.parametrize("group,expected", [
    (None, {"dense", "norms", "biases", "embedding"}),
    ("all", {"dense", "norms", "biases", "embedding"}),
    ("norms", {"norms"}),
])
def test_carried_buffer_refutes_the_groups_it_names(group, expected):
    spec, p = _with({"dp": ("data", "R,S,R,R")}, (ov("grads", "no_zero_grad", group),))  # ZeRO-1
    report = check_plan(SESSION, spec, p, {})
    v = gi_verdicts(report)
    assert {k[1] for k, x in v.items() if k[0] == "gi" and x is Verdict.REFUTED} == expected
    assert all(x is Verdict.PROVED for k, x in v.items() if k[0] == "replica")
    # the aspect naming the defect is stated for the named groups only and refuted; the aspects of the
    # step itself (its reductions, accumulation, divisor) stay proved
    across = {o.name[9:-len("] across steps")]: o.verdict for o in report.obligations if o.name.endswith("across steps")}
    assert across == {g: Verdict.REFUTED for g in expected}
    assert all(o.verdict is Verdict.PROVED for o in report.obligations
               if "] " in o.name and not o.name.endswith("across steps"))
    g = sorted(expected)[0]
    cex = next(o for o in report.obligations if o.name == f"GI grads[{g}]").counterexample
    # step 1's gradient 1, step 2's 0: the uncleared buffer holds 1 + 0 = 1 where step 2's gradient is 0
    assert "= 1 + 0 = 1" in cex.equation and "step 2's global-batch gradient is 0" in cex.equation
    assert "zero_grad skipped" in cex.diagnosis[0]
    assert simulator_state.stale_buffer_violations(p, {"dp": 1, "microbatches": 1}, random.Random(1)) >= {
        ("gi", x) for x in expected}


def test_refuted_at_a_single_device():
    """No axis needs two ranks: one device's second step already reads the first step's gradient."""
    spec, p = _with({"dp": ("data", "R,R,R,R")}, (ov("grads", "no_zero_grad"),))
    report = check_plan(SESSION, spec, p, {"dp": 1, "m": 1})
    ob = next(o for o in report.obligations if o.name == "GI grads[dense]")
    assert ob.verdict is Verdict.REFUTED and dict(ob.counterexample.sizes)["dp"] == 1


def test_without_an_accumulation_buffer_it_changes_nothing():
    spec, p = _with({"dp": ("data", "R,S,S,R")}, (ov("grads", "no_accumulation_buffer"), ov("grads", "no_zero_grad")))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL506" and "overwrites the buffer" in d.message
