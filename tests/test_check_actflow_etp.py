"""The expert tensor group's all-gather and reduce-scatter of the routed tokens (MoE parallel
folding, ir.actflow region ``expert_tensor``, stated as ``activations[experts]: gather | reduce``
and ``activation_grads[experts]: gather | reduce | no_reduce | reduce_copy``): the checker against
the concrete simulator (tests/simulator_etp.py) on hand-derived and generated plans, the replayed
counterexample, the diagnostics, the costs the overrides move (hand-derived counts) and the format
round trip."""

from __future__ import annotations

import pytest
import simulator_etp
from handcases import violations_at_every_size
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from tiers import examples

from placement_logic import costs
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A, G = "activations", "activation_grads"
KEYS = {f"GI {A}[experts] over (d)": ("act", "expert_tensor"), f"GI {G}[experts] over (d)": ("grad", "expert_tensor")}
ACT, GRAD = ("act", "expert_tensor"), ("grad", "expert_tensor")
# dense: data d × e, tensor t (sequence parallel); experts: expert e, expert tensor d, expert data t
SPEC = """from std.data import zero1
from std.tensor import megatron_sp
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 8  top_k = 2
                 bias = false }}
  seq = 16
  group experts {{ role = {{e: expert, d: tensor, t: data}} }}
}}
mesh {{ d = 2  e = 2  t = 2 }}
plan p {{
  d: zero1
  e: zero1
  t: megatron_sp
{overrides}}}
"""


def _spec(stmts=()):
    text = SPEC.format(overrides="".join(f"  override {s}\n" for s in stmts))
    spec = load_string(text)
    return spec, spec.plan("p"), text


def verdicts(report) -> dict[tuple, Verdict]:
    return {KEYS[o.name]: o.verdict for o in report.obligations if o.name in KEYS}


def simulated(p) -> set:
    return violations_at_every_size(simulator_etp.violations, p)


HAND = [
    ((), ()),
    ((f"{A}[experts]: gather over (d)", f"{A}[experts]: reduce over (d)", f"{G}[experts]: gather over (d)",
      f"{G}[experts]: reduce over (d)"), ()),
    # the backward of the all-gather left out (to_local / full_tensor without grad placements)
    ((f"{G}[experts]: no_reduce",), {GRAD}),
    ((f"{G}[experts]: reduce_copy",), {GRAD}),
    # the tokens not gathered: each rank's slice of the expert sees its own tokens only
    ((f"{A}[experts]: gather over ()",), {ACT}),
    # the partial outputs all-reduced and kept whole, never scattered back: the wrong rows
    ((f"{A}[experts]: reduce over (d, d)",), {ACT}),
    # the expert tensor collectives over the dense tensor group t instead of d
    ((f"{A}[experts]: gather over (t)", f"{A}[experts]: reduce over (t)"), {ACT}),
    ((f"{G}[experts]: gather over (t)", f"{G}[experts]: reduce over (t)"), {GRAD}),
    # the input gradient declared Replicate (full_tensor without grad placements): sliced, not summed
    ((f"{G}[experts]: assert_replicate over (d)",), {GRAD}),
    ((f"{G}[experts]: assert_partial over (d)",), ()),
    ((f"{A}[experts]: assert_shard over (d)",), {ACT}),
    # the output gradient declared: Shard is its gather; Replicate skips it, Partial sums different tokens
    ((f"{G}[experts]: assert_output_shard over (d)",), ()),
    ((f"{G}[experts]: assert_output_replicate over (d)",), {GRAD}),
    ((f"{G}[experts]: assert_output_partial over (d)",), {GRAD}),
]


@pytest.mark.parametrize("stated,expected", HAND)
def test_hand_cases_checker_and_simulator(stated, expected):
    spec, p, _ = _spec(stated)
    assert simulated(p) == set(expected)
    v = verdicts(check_plan(SESSION, spec, p, {}))
    assert set(v) == set(KEYS.values())
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == set(expected)


@hs.composite
def etp_plans(draw):
    lists = hs.lists(hs.sampled_from(("d", "e", "t")), max_size=3).map(lambda xs: ", ".join(xs))
    cands = hs.one_of(
        hs.builds(lambda t, v, a: f"{t}[experts]: {v} over ({a})", hs.sampled_from((A, G)),
                  hs.sampled_from(("gather", "reduce")), lists),
        hs.sampled_from((f"{G}[experts]: no_reduce", f"{G}[experts]: reduce_copy")),
        hs.builds(lambda t, v: f"{t}[experts]: {v} over (d)", hs.sampled_from((A, G)),
                  hs.sampled_from(("assert_replicate", "assert_partial", "assert_shard"))),
        hs.builds(lambda v: f"{G}[experts]: {v} over (d)",
                  hs.sampled_from(("assert_output_replicate", "assert_output_partial", "assert_output_shard"))))
    try:
        return _spec(draw(hs.lists(cands, max_size=3)))
    except DiagnosticError as e:  # a slot stated twice (PL291): a located input error, not a plan to compare
        assume(e.diagnostics[0].code != Code.OVERRIDE_RESTATED)
        raise


@settings(max_examples=examples(20), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(etp_plans())
def test_checker_agrees_with_the_expert_tensor_simulator(generated):
    spec, p, _ = generated
    v = verdicts(check_plan(SESSION, spec, p, {}))
    found = simulated(p)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, p.overrides)


def test_refutation_replays_the_missing_reduce_scatter():
    spec, p, _ = _spec([f"{G}[experts]: no_reduce"])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == f"GI {G}[experts] over (d)")
    # d = 2: dy = [3, 5] gathered; rank 0 holds a_0 = 2, b_0 = 1/2, so its summand is dy · 1 = [3, 5];
    # single-device: dy_0 · (a_0 b_0 + a_1 b_1) = 3 · (1 + 3·2) = 21
    assert "on rank 0 of d = [3, 5], single-device = [21]" in ob.counterexample.equation
    assert "no_reduce" in ob.counterexample.diagnosis[0] and "expert tensor" in ob.counterexample.diagnosis[0]


def test_gather_without_an_expert_tensor_axis_is_pl506():
    text = SPEC.replace("d: tensor, ", "").format(overrides=f"  override {A}[experts]: gather over (d)\n")
    spec = load_string(text)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, spec.plan("p"), {})
    d = e.value.diagnostics[0]
    assert d.code == Code.OVERRIDE_NO_EFFECT and "no axis is tensor for the experts only" in d.message


def test_an_assert_off_the_expert_tensor_axes_is_refused():
    spec, p, _ = _spec([f"{G}[experts]: assert_replicate over (t)"])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == Code.ACTIVATION_ASSERT_OFF_TENSOR and "expert tensor axes only (d)" in d.message


def _counts(text: str) -> dict:
    pc = costs.derive(load_string(text).plan("p"), sized=True)
    subs = {costs.symbol(a): 2 for a in "det"}
    got: dict = {}
    for x in pc.communication.collectives:
        c = x.collective
        if c.payload.tensor == "expert_tokens":
            key = (c.kind.value, c.axes, c.phase.value)
            got[key] = got.get(key, 0) + x.count.subs(subs)
    return {k: v for k, v in got.items() if v}


def test_costs_follow_the_overrides():
    # L = 2 MoE layers, one microbatch: one all-gather and one reduce-scatter over d per layer and phase
    base = {("all_gather", ("d",), "forward"): 2, ("reduce_scatter", ("d",), "forward"): 2,
            ("all_gather", ("d",), "backward"): 2, ("reduce_scatter", ("d",), "backward"): 2}
    assert _counts(_spec()[2]) == base
    gone = dict(base)
    del gone[("reduce_scatter", ("d",), "backward")]
    assert _counts(_spec([f"{G}[experts]: no_reduce"])[2]) == gone
    moved = {k: v for k, v in base.items() if k != ("all_gather", ("d",), "forward")}
    moved[("all_gather", ("t",), "forward")] = 2
    assert _counts(_spec([f"{A}[experts]: gather over (t)"])[2]) == moved


@pytest.mark.parametrize("stmt", [f"{A}[experts]: gather over (d)", f"{G}[experts]: reduce over (d, t)",
                                  f"{G}[experts]: no_reduce"])
def test_statements_format_round_trip(stmt):
    src = format_source(_spec([stmt])[2], "x.place")
    assert f"  override {stmt}\n" in src
    messy = src.replace(f"  override {stmt}", "  override " + stmt.replace(": ", " :  ").replace("(d", "( d"))
    assert format_source(messy, "x.place") == src
