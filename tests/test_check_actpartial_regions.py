"""Operations on the embedding's masked lookup and the experts' partial output before their reduction, and
the linear scale that commutes with any partial sum (check.actpartial_regions): the checker against the
concrete simulator (tests/simulator_actpartial_regions.py) on hand cases, parallel folding and generated
plans, the replays against numbers derived by hand, the diagnostics, the unchanged costs and fmt."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
import simulator_actpartial
import simulator_actpartial_regions as sim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from test_check_actflow_etp import SPEC as ETP_SPEC
from tiers import examples

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A = "activations"
DP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
TWO_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S"), "tq": ("tensor", "S,S,S,S")}
REGIONS = ("attention", "mlp", "embedding", "experts")


def _with(axes, overrides=(), sp=False, experts=8):
    spec, p = plan("p", axes, sp=sp, overrides=tuple(overrides), experts=experts)
    return replace(spec, plans=(p,)), p


def verdicts(report) -> set:
    """The regions with a refuted operation; every other stated operation is proved (a scale always)."""
    out = set()
    for o in report.obligations:
        if not o.name.endswith("_before_reduce"):
            continue
        region = o.name.split("[")[1].split("]")[0]
        if o.verdict is Verdict.REFUTED:
            assert o.counterexample is not None and "scale" not in o.name
            out.add(("act", region))
        else:
            assert o.verdict is Verdict.PROVED, (o.name, o.verdict)
    return out


def simulated(p) -> set:
    found: set = set()
    for sizes in product((1, 2, 3), repeat=len(p.mesh.names)):
        s = dict(zip(p.mesh.names, sizes))
        found |= sim.violations(p, s) | simulator_actpartial.violations(p, s)
    return found


HAND = [
    ([ov(A, "positional_before_reduce", "embedding", ("tp",))], False, {("act", "embedding")}),
    ([ov(A, "positional_before_reduce", None, ("tp",))], True, {("act", "embedding")}),
    ([ov(A, "nonlinear_before_reduce", "embedding", ("tp",))], False, {("act", "embedding")}),
    ([ov(A, "scale_before_reduce", "embedding", ("tp",))], False, ()),  # sqrt(hidden): linear
    ([ov(A, "scale_before_reduce", None, ("tp",))], True, ()),
    ([ov(A, "bias_before_reduce", "experts", ("tp",))], False, {("act", "experts")}),
    ([ov(A, "shared_before_reduce", None, ("tp",))], True, {("act", "experts")}),
    ([ov(A, "residual_before_reduce", "experts", ("tp",))], False, {("act", "experts")}),
    ([ov(A, "nonlinear_before_reduce", "experts", ("tp",))], True, {("act", "experts")}),
    ([ov(A, "scale_before_reduce", "experts", ("tp",))], False, ()),  # the gate's weights: linear
    ([ov(A, "scale_before_reduce", "experts", ("tp",)), ov(A, "bias_before_reduce", "mlp", ("tp",))], False,
     {("act", "mlp")}),
]


@pytest.mark.parametrize("stated,sp,expected", HAND)
def test_hand_cases_checker_and_simulator(stated, sp, expected):
    spec, p = _with(DP_TP, stated, sp)
    assert simulated(p) == set(expected)
    assert verdicts(check_plan(SESSION, spec, p, {})) == set(expected)


VERBS = ("positional_before_reduce", "nonlinear_before_reduce", "scale_before_reduce", "bias_before_reduce",
         "residual_before_reduce", "shared_before_reduce")
OF = {"embedding": VERBS[:3], "experts": VERBS[1:], "mlp": ("bias_before_reduce", "scale_before_reduce")}


@hs.composite
def partial_plans(draw):
    axes = dict(TWO_TP) if draw(hs.booleans()) else dict(DP_TP)
    tensor = [a for a, (r, _) in axes.items() if r == "tensor"]
    named = hs.lists(hs.sampled_from(tensor), min_size=1, max_size=2, unique=True).map(tuple)
    cands = hs.sampled_from(sorted(OF)).flatmap(
        lambda r: hs.builds(lambda v, a: ov(A, v, r, a), hs.sampled_from(OF[r]), named))
    return _with(axes, draw(hs.lists(cands, max_size=3)), draw(hs.booleans()))


@settings(max_examples=examples(12), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(partial_plans())
def test_checker_agrees_with_the_simulator(generated):
    spec, p = generated
    assert verdicts(check_plan(SESSION, spec, p, {})) == simulated(p), p.overrides


# test_check_actflow_etp's spec with biases: dense: data d × e, tensor t (sequence parallel); experts: expert e,
# expert tensor d, expert data t
FOLD = ETP_SPEC.replace("\n                 bias = false", "")
assert FOLD != ETP_SPEC


def _fold(stmts):
    spec = load_string(FOLD.format(overrides="".join(f"  override {s}\n" for s in stmts)))
    return spec, spec.plan("p")


@pytest.mark.parametrize("stmt,expected", [
    ("activations[experts]: bias_before_reduce over (d)", {("act", "experts")}),
    ("activations[experts]: shared_before_reduce over (d)", {("act", "experts")}),
    ("activations[experts]: scale_before_reduce over (d)", set()),
    ("activations[embedding]: positional_before_reduce over (t)", {("act", "embedding")}),
])
def test_expert_tensor_group_of_its_own(stmt, expected):
    """Under parallel folding the experts' fc2 is partial over the expert tensor axis d, the embedding over t."""
    spec, p = _fold([stmt])
    assert simulated(p) == expected
    assert verdicts(check_plan(SESSION, spec, p, {})) == expected


# by hand at t = 2. The embedding: word 3 on rank 1, E[3] = 5, the other rank 0; the positional embedding 1:
# 5 + 1 + 0 + 1 = 7 against 6; f(v) = v² + 1: 26 + 1 = 27 against 26. The experts: the summands 3 and 18
# (x = 3, a = (2, 3), b = (1/2, 2)), the shared expert's output 2: 3 + 2 + 18 + 2 = 25 against 23.
@pytest.mark.parametrize("region,verb,got,want,words", [
    ("embedding", "positional_before_reduce", 7, 6, "2·pos instead of pos"),
    ("embedding", "nonlinear_before_reduce", 27, 26, "(2-1)·f(0)"),
    ("experts", "shared_before_reduce", 25, 23, "2·shared instead of shared"),
    ("experts", "bias_before_reduce", 23, 22, "2·b instead of b"),
])
def test_replay_by_hand(region, verb, got, want, words):
    spec, p = _with(DP_TP, [ov(A, verb, region, ("tp",))])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == f"GI activations[{region}]: {verb}")
    cex = ob.counterexample
    assert dict(cex.sizes)["tp"] == 2 and dict(cex.sizes)["dp"] == 1
    assert cex.equation.endswith(f"= {got}, single-device = {want}")
    assert words in cex.diagnosis[0] and verb in cex.diagnosis[0]


@pytest.mark.parametrize("o,experts,code,words", [
    (ov(A, "bias_before_reduce", "embedding", ("tp",)), 8, "PL279", "not an operation on the embedding"),
    (ov(A, "residual_before_reduce", "embedding", ("tp",)), 8, "PL279", "not an operation on the embedding"),
    (ov(A, "positional_before_reduce", "mlp", ("tp",)), 8, "PL279", "not an operation on the mlp"),
    (ov(A, "shared_before_reduce", "attention", ("tp",)), 8, "PL279", "not an operation on the attention"),
    (ov("activation_grads", "residual_before_reduce", "experts", ("tp",)), 8, "PL279", "input gradient"),
    (ov(A, "shared_before_reduce", None, ("tp",)), 1, "PL506", "no experts"),
    (ov(A, "bias_before_reduce", "experts", ("tp",)), 1, "PL506", "no experts"),
    (ov(A, "positional_before_reduce", "embedding", ()), 8, "PL506", "names no axis"),
    (ov(A, "scale_before_reduce", "embedding", ("dp",)), 8, "PL506", "dp is not a tensor axis"),
    (ov(A, "scale_before_reduce", "head", ("tp",)), 8, "PL278", "no row-parallel linear"),
])
def test_diagnostics(o, experts, code, words):
    spec, p = _with(DP_TP, [o], experts=experts)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == code and words in d.message, d.message


def test_experts_whole_under_folding_without_an_expert_tensor_axis():
    """The experts' own group has no tensor axis: their fc2 output is whole, nothing to operate on."""
    text = FOLD.replace("d: tensor, t: data", "d: data, t: data").format(
        overrides="  override activations[experts]: shared_before_reduce over (d)\n")
    spec = load_string(text)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, spec.plan("p"), {})
    assert e.value.diagnostics[0].code == "PL506" and "splits the experts" in e.value.diagnostics[0].message


def test_fmt_round_trips_the_verbs():
    src = FOLD.format(overrides="  override activations [ embedding ] :  scale_before_reduce over ( t )\n"
                                "  override activations[experts]: shared_before_reduce over (d)\n"
                                "  override activations:positional_before_reduce over(t)\n")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.axes) for q in a.plans for o in q.overrides]
    assert key == [(o.target, o.group, o.verb, o.axes) for q in b.plans for o in q.overrides] == [
        (A, "embedding", "scale_before_reduce", ("t",)), (A, "experts", "shared_before_reduce", ("d",)),
        (A, None, "positional_before_reduce", ("t",))]


def _acts(p):
    return sorted((c.kind.value, c.phase.value, c.axes, str(c.count)) for c in collectives.derive(p))


def test_costs_unchanged():
    """None of the operations moves a byte: the collective schedule is the derived one."""
    _, base = _with(DP_TP)
    _, stated = _with(DP_TP, [ov(A, v, r, ("tp",)) for r in OF for v in OF[r]])
    assert _acts(stated) == _acts(base)


def _norm(spec, p, norm: str):
    """The plan with the model's norm kind set (irkit's models are LayerNorm ones)."""
    model = replace(p.model, transformer=replace(p.model.transformer, norm=norm))
    p = replace(p, model=model)
    return replace(spec, model=model, plans=(p,)), p


# The model's RMSNorm (f(0) = 0) on the embedding's masked lookup: every rank but the token's owner holds a zero
# row and normalises it to zero, so the sum is the owner's f(e): exact (the simulator divides each row by its
# Σ x² + 1 and finds every device's output equal to the single device's). LayerNorm's shift, and any norm on a
# dense partial (the experts, mlp: every summand nonzero), stays wrong.
@pytest.mark.parametrize("axes,stated,norm,expected", [
    (DP_TP, [ov(A, "nonlinear_before_reduce", "embedding", ("tp",))], "rmsnorm", set()),
    (DP_TP, [ov(A, "nonlinear_before_reduce", "embedding", ("tp",))], "layernorm", {("act", "embedding")}),
    (TWO_TP, [ov(A, "nonlinear_before_reduce", "embedding", ("tp",))], "rmsnorm", set()),
    (TWO_TP, [ov(A, "nonlinear_before_reduce", "embedding", ("tp", "tq"))], "rmsnorm", set()),
    (DP_TP, [ov(A, "nonlinear_before_reduce", "experts", ("tp",))], "rmsnorm", {("act", "experts")}),
    (DP_TP, [ov(A, "nonlinear_before_reduce", "mlp", ("tp",))], "rmsnorm", {("act", "mlp")}),
    (DP_TP, [ov(A, "nonlinear_before_reduce", "embedding", ("tp",)),
             ov(A, "positional_before_reduce", "embedding", ("tp",))], "rmsnorm", {("act", "embedding")}),
])
def test_rmsnorm_on_the_masked_lookup_is_exact(axes, stated, norm, expected):
    spec, p = _norm(*_with(axes, stated), norm)
    assert simulated(p) == expected
    report = check_plan(SESSION, spec, p, {})
    assert verdicts(report) == expected  # every operation not refuted is proved
    ob = next(o for o in report.obligations if o.name == f"GI activations[{stated[0].group}]: nonlinear_before_reduce")
    assert (ob.verdict is Verdict.PROVED) == (norm == "rmsnorm" and stated[0].group == "embedding")
