"""The MoE token dispatch and combine all-to-alls (ir.actflow region ``experts``): the checker
against the concrete all-to-all simulator (tests/simulator_act.py, every device's blocks on the
whole mesh) on hand-derived and generated plans, the replayed counterexample, the diagnostics and
the all-to-alls the overrides move in the cost schedule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import simulator_act
from handcases import violations_at_every_size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A, G = "activations", "activation_grads"
KEYS = {f"GI {A}[experts]": ("act", "experts"), f"GI {G}[experts]": ("grad", "experts")}
DP_EP = {"dp": ("data", "R,R,R,R"), "ep": ("expert", "S,S,S,R")}
DP_EP_CP = {**DP_EP, "cp": ("context", "R,R,R,R")}
PP_EP = {"pp": ("pipeline", "S,S,S,S"), "ep": ("expert", "S,S,S,R")}


def _with(axes, overrides=()):
    spec, p = plan("p", axes, overrides=tuple(overrides), experts=4)
    return replace(spec, plans=(p,)), p


def verdicts(report) -> dict[tuple, Verdict]:
    return {KEYS[o.name]: o.verdict for o in report.obligations if o.name in KEYS}


def simulated(p: ir.Plan) -> set:
    return violations_at_every_size(simulator_act.experts_violations, p)


ACT, GRAD = ("act", "experts"), ("grad", "experts")
HAND = [
    ((), ()),
    # the derived all-to-alls stated as they are
    ((ov(A, "dispatch", "experts", ("ep",)), ov(G, "combine", None, ("ep",))), ()),
    # the expert group built over the data ranks: tokens reach a replica of their own rank's expert
    ((ov(A, "dispatch", "experts", ("dp",)), ov(A, "combine", "experts", ("dp",))), {ACT}),
    # no dispatch: every token meets its own rank's expert
    ((ov(A, "dispatch", "experts", ()),), {ACT}),
    # no combine in backward: the input gradients stay on the expert ranks
    ((ov(G, "dispatch", "experts", ()),), {GRAD}),
    # a larger group for both: a replica of the right expert and back (more bytes, the same values)
    ((ov(A, "dispatch", "experts", ("dp", "ep")), ov(A, "combine", "experts", ("dp", "ep"))), ()),
    # a larger group for the dispatch only: the outputs go back to the wrong data rank
    ((ov(A, "dispatch", "experts", ("dp", "ep")),), {ACT}),
    # two passes over ep: the tokens come back unprocessed by their expert
    ((ov(G, "combine", "experts", ("ep", "ep")),), {GRAD}),
]


PP_HAND = [
    ((), ()),
    # the all-to-alls over the whole world, pipeline stages included: a stage's tokens reach the
    # experts of another stage's layers, even when the combine brings them back
    ((ov(A, "dispatch", "experts", ("pp", "ep")), ov(A, "combine", "experts", ("pp", "ep"))), {ACT}),
    ((ov(G, "combine", "experts", ("pp", "ep")), ov(G, "dispatch", "experts", ("pp", "ep"))), {GRAD}),
]


@pytest.mark.parametrize("axes,stated,expected", [(DP_EP, s, e) for s, e in HAND] + [(PP_EP, s, e) for s, e in PP_HAND])
def test_hand_cases_checker_and_simulator(axes, stated, expected):
    spec, p = _with(axes, stated)
    assert simulated(p) == set(expected)
    v = verdicts(check_plan(SESSION, spec, p, {}))
    assert set(v) == set(KEYS.values())
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == set(expected)
    assert all(x is Verdict.PROVED for k, x in v.items() if k not in expected)


@hs.composite
def expert_plans(draw):
    axes = draw(hs.sampled_from((DP_EP_CP, DP_EP, PP_EP)))
    lists = hs.lists(hs.sampled_from(list(axes)), max_size=3).map(tuple)
    cands = hs.builds(lambda t, v, g, a: ov(t, v, g, a), hs.sampled_from((A, G)),
                      hs.sampled_from(("dispatch", "combine")), hs.sampled_from((None, "experts")), lists)
    return _with(axes, draw(hs.lists(cands, max_size=3)))


@settings(max_examples=examples(25), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(expert_plans())
def test_checker_agrees_with_the_all_to_all_simulator(generated):
    spec, p = generated
    v = verdicts(check_plan(SESSION, spec, p, {}))
    found = simulated(p)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, p.overrides)


def test_refutation_replays_the_token_at_the_wrong_expert():
    spec, p = _with(DP_EP, [ov(A, "dispatch", "experts", ("dp",)), ov(A, "combine", "experts", ("dp",))])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == f"GI {A}[experts]")
    cex = ob.counterexample
    # ep = 2, rank 0: block 1 holds the token 1000·1 + 1 bound for expert 1 (factor 3); without the
    # dispatch rank 0's expert 0 (factor 2) takes it: 2002, single-device 3003
    assert "on rank 0 of ep = [2, 2002], single-device = [2, 3003]" in cex.equation
    assert "dispatch all-to-all" in cex.diagnosis[0] and "over (dp)" in cex.diagnosis[0]


@pytest.mark.parametrize("o,words", [
    (ov(A, "gather", "experts", ("ep",)), "dispatch and combine"),
    (ov(A, "dispatch", "mlp", ("ep",)), "only the MoE layer"),
])
def test_statements_that_change_nothing(o, words):
    spec, p = _with(DP_EP, [o])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == Code.OVERRIDE_NO_EFFECT and words in e.value.diagnostics[0].message


def test_no_expert_axis_is_pl506():
    spec, p = plan("p", {"dp": DP_EP["dp"]}, overrides=(ov(A, "combine", "experts", ("dp",)),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, replace(spec, plans=(p,)), p, {})
    assert e.value.diagnostics[0].code == Code.OVERRIDE_NO_EFFECT and "no expert axis" in e.value.diagnostics[0].message


def _a2a(p: ir.Plan) -> dict:
    from test_check_actflow import _num

    out: dict = {}
    for c in collectives.derive(p):
        if c.kind.value == "all_to_all":
            key = (c.phase.value, c.axes)
            out[key] = out.get(key, 0) + _num(c.count)
    return out


def test_costs_follow_the_overrides():
    # one dispatch and one combine per layer (4) per microbatch (m = 3) in each phase
    _, base = _with(DP_EP)
    _, gone = _with(DP_EP, [ov(A, "dispatch", "experts", ())])
    _, moved = _with(DP_EP, [ov(G, "combine", "experts", ("dp",))])
    assert _a2a(base) == {("forward", ("ep",)): 24, ("backward", ("ep",)): 24}
    assert _a2a(gone) == {("forward", ("ep",)): 12, ("backward", ("ep",)): 24}  # the dispatch's bytes gone
    assert _a2a(moved) == {("forward", ("ep",)): 24, ("backward", ("ep",)): 12, ("backward", ("dp",)): 12}


@pytest.mark.parametrize("stmt", [
    "override activations[experts]: dispatch over (ep)", "override activations[experts]: combine over ()",
    "override activation_grads[experts]: combine over (dp, ep)", "override activation_grads[experts]: dispatch over (ep)",
])
def test_statements_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    src = (Path(__file__).parent.parent / "examples/safe/moe_all_to_all_group.place").read_text()
    body = [ln for ln in src.splitlines() if not ln.startswith("  override")]
    src = "\n".join(body[:-1] + [f"  {stmt}", "}"]) + "\n"
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :  ").replace("(ep)", "( ep )"))
    assert format_source(messy, "x.place") == src
