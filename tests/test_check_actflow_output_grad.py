"""The output gradient's declared type (``activation_grads[r]: assert_output_replicate |
assert_output_partial | assert_output_shard over (AXES)``, DTensor's ``to_local(grad_placements=...)``
on a region's partial output): the checker against the matrix simulator (tests/simulator_act.py) at
mesh sizes 1..3, the replayed counterexample checked by hand, the diagnostics and the collective a
declared Partial adds to the schedule."""

from __future__ import annotations

import pytest
from irkit import ov
from test_check_actflow import DP_TP, KEYS, SESSION, _acts, _with, simulated, verdicts

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict

G = "activation_grads"
ROWS = ("attention", "mlp", "embedding")  # the regions whose output gradient is read whole (bwd_exit)

# (verb, region, sequence parallel, the regions whose input gradient (the embedding: weight gradient) is wrong)
CASES = [
    # tensor parallelism: the output gradient arrives whole (Replicate)
    ("assert_output_replicate", "attention", False, ()),
    ("assert_output_partial", "attention", False, {"attention"}),  # all-reduced again: n times (#172932)
    ("assert_output_partial", None, False, set(ROWS)),
    ("assert_output_shard", "mlp", False, {"mlp"}),  # all-gathered: n copies stacked, the shapes do not fit
    ("assert_output_partial", "embedding", False, {"embedding"}),
    # sequence parallelism: it arrives as the rank's sequence slice (Shard)
    ("assert_output_shard", None, True, ()),  # all-gathered: Megatron-LM's conjugate of the reduce-scatter
    ("assert_output_replicate", "mlp", True, {"mlp"}),  # no all-gather: a slice read as the whole
    ("assert_output_replicate", "embedding", True, {"embedding"}),
    ("assert_output_partial", "attention", True, {"attention"}),  # slices of different positions summed
]


@pytest.mark.parametrize("verb,region,sp,wrong", CASES)
def test_checker_and_simulator_agree(verb, region, sp, wrong):
    spec, p = _with(DP_TP, [ov(G, verb, region, ("tp",))], sp)
    expected = {("grad", r) for r in wrong}
    assert simulated(p) == expected  # the simulator at dp, tp in 1..3
    v = verdicts(check_plan(SESSION, spec, p, {}))
    assert set(v) == set(KEYS.values())
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == expected
    assert all(x is Verdict.PROVED for k, x in v.items() if k not in expected)


def test_declared_partial_replays_the_gradient_summed_n_times():
    spec, p = _with(DP_TP, [ov(G, "assert_output_partial", "attention", ("tp",))])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "GI activation_grads[attention]")
    assert ob.verdict is Verdict.REFUTED
    cex = ob.counterexample
    n = dict(cex.sizes)["tp"]
    assert n >= 2 and dict(cex.sizes)["dp"] == 1
    # by hand: dy = [3, 5, ...], a_j = j + 2, b_j = (3j + 1)/2; the single device's dx = dy·Σ_j a_j b_j; the
    # output gradient all-reduced once more holds n·dy on every rank, so every rank's dx is n times that
    w = sum((j + 2) * (3 * j + 1) / 2 for j in range(n))
    assert f"single-device = [{w * 3:g}, {w * 5:g}" in cex.equation
    assert f"on rank 0 of tp = [{n * w * 3:g}, {n * w * 5:g}" in cex.equation
    assert "declared Partial" in cex.diagnosis[0] and "arrives replicated" in cex.diagnosis[0]
    assert "assert_output_partial over (tp)" in cex.diagnosis[0]


def test_declared_partial_adds_an_all_reduce_in_backward():
    # megatron_tp at L = 10 layers and m = 3 microbatches: 2·L·m = 60 backward all-reduces (every region's input
    # gradient); the attention's output gradient declared Partial adds one per layer and microbatch (L·m = 30)
    _, base = _with(DP_TP)
    _, declared = _with(DP_TP, [ov(G, "assert_output_partial", "attention", ("tp",))])
    _, same = _with(DP_TP, [ov(G, "assert_output_replicate", "attention", ("tp",))])
    assert _acts(base)[("all_reduce", "backward", ("tp",))] == 60
    assert _acts(declared)[("all_reduce", "backward", ("tp",))] == 90
    assert _acts(same) == _acts(base)  # Replicate to Replicate: nothing moves


@pytest.mark.parametrize("o,code,words", [
    (ov(G, "assert_output_partial", "mlp", ("dp",)), "PL190", "tensor axes only"),
    (ov(G, "assert_output_replicate", None, ()), "PL190", "no axis"),
    (ov(G, "assert_output_partial", "head", ("tp",)), "PL506", "no row-parallel linear"),
    (ov(G, "assert_output_partial", "loss", ("tp",)), "PL506", "backward needs none"),
])
def test_diagnostics(o, code, words):
    spec, p = _with(DP_TP, [o])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == code and words in d.message
