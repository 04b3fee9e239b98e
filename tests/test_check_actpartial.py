"""Operations on a partial activation (check.actpartial): a bias, a residual or a nonlinearity applied
to the row-parallel output before its reduction. The checker against the concrete simulator
(tests/simulator_actpartial.py) on hand cases and generated plans, the replayed counterexamples
against numbers derived by hand, the diagnostics, the unchanged cost schedule and fmt."""

from __future__ import annotations

from dataclasses import replace

import pytest
import simulator_actpartial
from handcases import violations_at_every_size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A, G = "activations", "activation_grads"
VERBS = ("bias_before_reduce", "residual_before_reduce", "nonlinear_before_reduce")
DP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
TWO_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S"), "tq": ("tensor", "S,S,S,S")}


def _with(axes, overrides=(), sp=False):
    spec, p = plan("p", axes, sp=sp, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


def refuted(spec, p) -> set:
    """The regions with a refuted operation on their partial output (the other obligations of a region
    stay proved: its collectives are as derived)."""
    report = check_plan(SESSION, spec, p, {})
    out = set()
    for o in report.obligations:
        for r in ("attention", "mlp"):
            tag = next((t for t, k in (("act", A), ("grad", G)) if o.name.startswith(f"GI {k}[{r}]: ")), None)
            if tag and o.name.endswith("_before_reduce"):
                if o.verdict is Verdict.REFUTED:
                    assert o.counterexample is not None  # replayed
                    out.add((tag, r))
                else:
                    assert o.verdict is Verdict.PROVED, (o.name, o.verdict)
            elif o.name in (f"GI activations[{r}]", f"GI activation_grads[{r}]"):
                assert o.verdict is Verdict.PROVED, o.name
    return out


def simulated(p) -> set:
    return violations_at_every_size(simulator_actpartial.violations, p)


HAND = [
    ([], False, ()),
    ([ov(A, "bias_before_reduce", "mlp", ("tp",))], False, {("act", "mlp")}),
    ([ov(A, "bias_before_reduce", "mlp", ("tp",))], True, {("act", "mlp")}),  # before the reduce-scatter
    ([ov(A, "residual_before_reduce", "attention", ("tp",))], False, {("act", "attention")}),
    ([ov(A, "nonlinear_before_reduce", None, ("tp",))], False, {("act", "attention"), ("act", "mlp")}),
    ([ov(A, "nonlinear_before_reduce", "mlp", ("tp",)), ov(A, "bias_before_reduce", "attention", ("tp",))], True,
     {("act", "attention"), ("act", "mlp")}),
    # in backward: the residual's gradient added to the column-parallel linear's partial input gradient
    ([ov(G, "residual_before_reduce", "mlp", ("tp",))], False, {("grad", "mlp")}),
    ([ov(G, "residual_before_reduce", None, ("tp",))], True, {("grad", "attention"), ("grad", "mlp")}),
]


@pytest.mark.parametrize("stated,sp,expected", HAND)
def test_hand_cases_checker_and_simulator(stated, sp, expected):
    spec, p = _with(DP_TP, stated, sp)
    assert simulated(p) == set(expected)
    assert refuted(spec, p) == set(expected)


TWO = [
    # two tensor axes: the value is whole over the one not named when the bias is added, partial over tq
    ([ov(A, "bias_before_reduce", "mlp", ("tq",))], {("act", "mlp")}),
    ([ov(A, "nonlinear_before_reduce", "attention", ("tp", "tq"))], {("act", "attention")}),
]


@pytest.mark.parametrize("stated,expected", TWO)
def test_two_tensor_axes(stated, expected):
    spec, p = _with(TWO_TP, stated)
    assert simulated(p) == set(expected)
    assert refuted(spec, p) == set(expected)


@hs.composite
def partial_plans(draw):
    axes = dict(TWO_TP) if draw(hs.booleans()) else dict(DP_TP)
    tensor = [a for a, (r, _) in axes.items() if r == "tensor"]
    named = hs.lists(hs.sampled_from(tensor), min_size=1, max_size=2, unique=True).map(tuple)
    region = hs.sampled_from([None, "attention", "mlp"])
    cands = hs.one_of(hs.builds(lambda v, g, a: ov(A, v, g, a), hs.sampled_from(VERBS), region, named),
                      hs.builds(lambda g, a: ov(G, "residual_before_reduce", g, a), region, named))
    return _with(axes, draw(hs.lists(cands, max_size=3)), draw(hs.booleans()))


@settings(max_examples=examples(15), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(partial_plans())
def test_checker_agrees_with_the_simulator(generated):
    spec, p = generated
    assert refuted(spec, p) == simulated(p), p.overrides


# by hand at t = 2: x = 3, a = (2, 3), b = (1/2, 2): the summands 3·2·1/2 = 3 and 3·3·2 = 18, y = 21
@pytest.mark.parametrize("verb,got,want,words", [
    ("bias_before_reduce", 23, 22, "2·b instead of b"),  # 3 + 1 + 18 + 1 against 21 + 1
    ("residual_before_reduce", 27, 24, "2·residual"),  # 3 + 3 + 18 + 3 against 21 + 3
    ("nonlinear_before_reduce", 333, 441, "f(p_1) + ... + f(p_t)"),  # 3² + 18² against 21²
])
def test_replay_by_hand(verb, got, want, words):
    """Forward; and the residual's gradient in backward: dy = 3 in place of x, the same numbers."""
    spec, p = _with(DP_TP, [ov(A, verb, "mlp", ("tp",))])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations
              if o.name == f"GI activations[mlp]: {verb}")
    cex = ob.counterexample
    assert dict(cex.sizes)["tp"] == 2 and dict(cex.sizes)["dp"] == 1
    assert cex.equation.endswith(f"= {got}, single-device = {want}")
    assert words in cex.diagnosis[0] and verb in cex.diagnosis[0]


@pytest.mark.parametrize("o,axes,code,words", [
    (ov(A, "bias_before_reduce", "mlp", ()), DP_TP, "PL506", "names no axis"),
    (ov(A, "bias_before_reduce", "mlp", ("dp",)), DP_TP, "PL506", "dp is not a tensor axis"),
    (ov(A, "nonlinear_before_reduce", None, ("tp", "dp")), DP_TP, "PL506", "dp is not a tensor axis"),
    (ov(A, "residual_before_reduce", "mlp", ("dp",)), {"dp": DP_TP["dp"]}, "PL506", "no tensor-parallel axis"),
    (ov(A, "nonlinear_before_reduce", "head", ("tp",)), DP_TP, "PL278", "no row-parallel linear"),
    (ov(A, "bias_before_reduce", "embedding", ("tp",)), DP_TP, "PL279", "not an operation on the embedding"),
    (ov(A, "bias_before_reduce", "loss", ("tp",)), DP_TP, "PL278", "no row-parallel linear"),
    (ov(G, "residual_before_reduce", "mlp", ("dp",)), DP_TP, "PL506", "dp is not a tensor axis"),
])
def test_diagnostics(o, axes, code, words):
    spec, p = _with(axes, [o])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == code and words in d.message


SRC = """from std.data import ddp
from std.tensor import megatron_tp
model {
  transformer {
    hidden = 1024
    layers = 4
    heads = 8
    ffn = 4096
    vocab = 32000
    bias = false
  }
  seq = 1024
  microbatch = 1
}
mesh { dp = 2  tp = 2 }
plan p {
  dp: ddp
  tp: megatron_tp
  override activations[mlp]:bias_before_reduce over(tp)
}
"""


def test_no_bias_is_pl506_located(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text(SRC)
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:19:3: error:" in err and "[PL506]" in err and "no bias" in err


def test_fmt_round_trips_the_verbs():
    src = SRC.replace("    bias = false\n", "") + "plan q {\n  dp: ddp\n  tp: megatron_tp\n" \
        "  override activations :  nonlinear_before_reduce over ( tp )\n" \
        "  override activations[attention]: residual_before_reduce over (tp)\n}\n"
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.axes) for q in a.plans for o in q.overrides]
    assert key == [(o.target, o.group, o.verb, o.axes) for q in b.plans for o in q.overrides] == [
        (A, "mlp", "bias_before_reduce", ("tp",)), (A, None, "nonlinear_before_reduce", ("tp",)),
        (A, "attention", "residual_before_reduce", ("tp",))]


def _acts(p):
    return sorted((c.kind.value, c.phase.value, c.axes, str(c.count)) for c in collectives.derive(p))


@pytest.mark.parametrize("sp", [False, True])
def test_costs_unchanged(sp):
    """None of the operations moves a byte: the collective schedule is the derived one."""
    _, base = _with(DP_TP, sp=sp)
    _, stated = _with(DP_TP, [ov(A, v, None, ("tp",)) for v in VERBS], sp)
    assert _acts(stated) == _acts(base)


def test_backward_replay_by_hand():
    # dy = 3: the summands 3·(1/2)·2 = 3 and 3·2·3 = 18, the residual's gradient 3 added on both ranks
    spec, p = _with(DP_TP, [ov(G, "residual_before_reduce", "attention", ("tp",))])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations
              if o.name == "GI activation_grads[attention]: residual_before_reduce")
    cex = ob.counterexample
    assert dict(cex.sizes)["tp"] == 2
    assert cex.equation.startswith("input gradient") and cex.equation.endswith("= 27, single-device = 24")
    assert "2·dy instead of dy" in cex.diagnosis[0]


def test_backward_operations_other_than_the_residual_are_not_in_the_vocabulary(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text(SRC.replace("    bias = false\n", "").replace(
        "activations[mlp]:bias_before_reduce", "activation_grads[mlp]: nonlinear_before_reduce"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:18:3: error:" in err and "'activation_grads' has no override" in err
