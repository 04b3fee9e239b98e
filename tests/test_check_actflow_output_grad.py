"""The output gradient's declared type (``activation_grads[r]: assert_output_replicate |
assert_output_partial | assert_output_shard over (AXES)``, DTensor's ``to_local(grad_placements=...)``
on a region's partial output): the checker against the matrix simulator (tests/simulator_act.py) at
mesh sizes 1..3, the replayed counterexample checked by hand, the diagnostics and the collective a
declared Partial adds to the schedule."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from irkit import ov
from test_check_actflow import DP_TP, KEYS, SESSION, _acts, _with, simulated, verdicts

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

A, G = "activations", "activation_grads"
ROOT = Path(__file__).resolve().parent.parent
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


QUICK = {0, 1, 5, 6}  # the derived declarations and the two reports' mechanisms; the others in the slow tier


@pytest.mark.parametrize("verb,region,sp,wrong", [
    c if i in QUICK else pytest.param(*c, marks=pytest.mark.slow) for i, c in enumerate(CASES)])
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


@pytest.mark.parametrize("axes,o,words", [
    ({"cp": ("context", "R,R,R,R"), **DP_TP}, ov(G, "assert_output_partial", "context", ("cp",)), "key/value"),
    (DP_TP, ov(G, "assert_output_shard", "experts", ("tp",)), "expert tensor group of its own"),
])
def test_regions_without_the_slot_are_pl506(axes, o, words):
    spec, p = _with(axes, [o])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL506" and words in d.message


# --------------------------------------------------------------------------- a sweep over generated plans

TENSOR_MODES = ("S,S,S,S",)
OTHER = {"data": ("R,R,R,R", "R,S,S,R", "S*,S,S,R"), "pipeline": ("S,S,S,S",)}
DECLARED = ("assert_output_replicate", "assert_output_partial", "assert_output_shard")


def _draw(seed: int):
    """tp (tensor) and up to one data or pipeline axis; one to three statements of the typed slots, at least one
    declaring an output gradient, on a random region (none: every region with the slot)."""
    rng = random.Random(seed)
    axes = {"tp": ("tensor", TENSOR_MODES[0])}
    if rng.random() < 0.6:
        role = rng.choice(tuple(OTHER))
        axes["b"] = (role, rng.choice(OTHER[role]))
    region = lambda: rng.choice((None, "attention", "mlp", "embedding"))  # noqa: E731
    stated = [ov(G, rng.choice(DECLARED), region(), ("tp",))]
    for _ in range(rng.randint(0, 2)):
        kind = rng.choice(("declared", "gather", "assert", "reduce"))
        if kind == "declared":
            stated.append(ov(G, rng.choice(DECLARED), region(), ("tp",)))
        elif kind == "gather":
            stated.append(ov(G, "gather", rng.choice((None, "attention", "mlp")), rng.choice(((), ("tp",)))))
        elif kind == "assert":
            stated.append(ov(rng.choice((A, G)), rng.choice(("assert_replicate", "assert_partial", "assert_shard")),
                             rng.choice(("attention", "mlp")), ("tp",)))
        else:
            stated.append(ov(A, "reduce", rng.choice(("attention", "mlp")), rng.choice(((), ("tp",), ("tp", "tp")))))
    rng.shuffle(stated)
    return _with(axes, stated, rng.random() < 0.5)


def _disagreement(seed: int):
    spec, p = _draw(seed)
    try:
        v = verdicts(check_plan(SESSION, spec, p, {}))
    except DiagnosticError:  # a slot the region does not have (PL506): an answer, not a proof
        return None
    found = simulated(p)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    unknown = [k for k, x in v.items() if x is Verdict.UNKNOWN]
    return (bad, unknown, p.overrides, p.sequence_parallel) if bad or unknown else None


@pytest.mark.parametrize("seed", range(2))
def test_sweep_sample(seed):
    assert _disagreement(seed) is None


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 60))
def test_sweep(seed):
    assert _disagreement(seed) is None



def test_format_round_trip():
    src = (ROOT / "examples" / "bugs" / "tp_to_local_partial_output_grad.place").read_text()
    messy = src.replace("override activation_grads[attention]: assert_output_partial over (tp)",
                        "override   activation_grads[ attention ] :assert_output_partial   over(tp)")
    assert messy != src
    assert format_source(messy, "<messy>") == src
    p = load_string(src).plan("to_local_partial_grad")
    assert [(o.target, o.group, o.verb, o.axes) for o in p.overrides] == [
        ("activation_grads", "attention", "assert_output_partial", ("tp",))]
