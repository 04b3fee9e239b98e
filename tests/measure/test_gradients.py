"""The first step's gradients compared with one process's.

Adam's update is unchanged, up to its epsilon, when a parameter tensor's whole gradient is
multiplied by a constant: ``m / sqrt(v)`` cancels the factor. A gradient summed twice over an
axis where it was already whole, or a clip coefficient computed from a wrong norm, therefore
leaves the parameters within round-off of one process while the gradient is off by a factor.
The measurement compares the whole reduced (and clipped) gradient of the first step as well;
these tests pin that comparison with hand-made tensors and with real runs of two such bugs.
"""

from __future__ import annotations

import pytest

from placement_logic.measure.report import GRAD_TOLERANCES, TOLERANCE, Equivalence

torch = pytest.importorskip("torch")
# every test here needs torch (the quick tier then leaves the module unimported: tests/conftest.py)
pytestmark = pytest.mark.torch

from placement_logic.measure.ranks.training import gradient_difference  # noqa: E402


def _eq(**kw) -> Equivalence:
    base = dict(steps=3, param_abs=0.0, param_rel=0.0, param_worst="w", loss_abs=0.0, loss_rel=0.0,
                replicas_agree=True)
    return Equivalence(**(base | kw))


def test_difference_is_relative_to_the_largest_reference_gradient():
    ref = {"a": torch.tensor([4.0, -2.0]), "b": torch.tensor([0.5])}
    got = {"a": torch.tensor([4.0, -2.0]), "b": torch.tensor([1.0])}  # b's gradient doubled
    d = gradient_difference(got, ref, "")
    assert d == {"grad_abs_diff": 0.5, "grad_rel_diff": 0.5 / 4.0, "grad_worst": "b"}


def test_equal_gradients_differ_by_nothing():
    ref = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[3.0]])}
    d = gradient_difference({k: v.clone() for k, v in ref.items()}, ref, "")
    assert d["grad_abs_diff"] == 0.0 and d["grad_rel_diff"] == 0.0


def test_a_missing_or_extra_gradient_is_not_compared():
    ref = {"a": torch.tensor([1.0]), "b": torch.tensor([1.0])}
    d = gradient_difference({"a": torch.tensor([1.0])}, ref, "")
    assert set(d) == {"grad_unavailable"} and "b" in d["grad_unavailable"]
    # a pipeline stage holds some of the parameters: a subset is compared, a stranger is not
    assert gradient_difference({"a": torch.tensor([3.0])}, ref, "", partial=True)["grad_rel_diff"] == 2.0
    assert "grad_unavailable" in gradient_difference({"z": torch.tensor([1.0])}, ref, "", partial=True)


def test_not_held_whole_says_why():
    assert gradient_difference(None, {}, "held as flat shards") == {"grad_unavailable": "held as flat shards"}


def test_within_requires_the_gradients_when_compared():
    assert _eq().within  # not compared: the parameters and the loss decide
    assert _eq(grad_rel=TOLERANCE / 2, grad_abs=1e-9, grad_worst="w").within
    off = _eq(grad_rel=0.5, grad_abs=0.5, grad_worst="norm.weight")
    assert not off.within and "0.5 relative (norm.weight)" in off.gradient_text()
    bf16 = _eq(tolerance=2.0 ** -8, grad_tolerance=GRAD_TOLERANCES[2], grad_rel=2.0 ** -7, grad_abs=0.1, grad_worst="w")
    assert bf16.within and "within 0.015625" in bf16.gradient_text()
    assert "not compared (held as flat shards)" in _eq(grad_unavailable="held as flat shards").gradient_text()


# ---- real runs: bugs that Adam hides in the parameters ----

HIDDEN = [("examples/bugs/norms_reduced_over_tp.place", "tp_norms_reduced_twice"),
          ("examples/bugs/tied_embedding_norm_twice.place", "tied_counted_twice")]
SAFE = [("examples/library/zero1.place", "zero1"), ("examples/library/gpipe.place", "gpipe"),
        ("examples/safe/pipeline_parallel.place", "zero2_pipeline"), ("examples/library/zeropp_zero1.place", "zeropp_zero1"),
        ("examples/models/qwen15_moe_a27b.place", "moe")]


@pytest.fixture(scope="module")
def reports():
    from placement_logic.frontend.loader import load_spec
    from placement_logic.measure.session import measure_many

    items = [(load_spec(f), p) for f, p in HIDDEN + SAFE]
    return {rep.plan: rep for rep in measure_many(items, steps=3, with_checker=True)}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("plan", [p for _, p in HIDDEN])
def test_bugs_adam_hides_in_the_parameters_diverge_in_the_gradients(reports, plan):
    rep = reports[plan]
    eq = rep.equivalence
    # the parameters and the loss stay within fp32 round-off of one process ...
    assert eq.param_rel <= eq.tolerance and eq.loss_rel <= eq.tolerance and eq.replicas_agree
    # ... the first step's gradient does not, and the checker refutes the plan
    assert eq.grad_rel > 100 * eq.grad_tolerance
    assert rep.outcome == "diverged" and rep.checker.verdict == "refuted"


@pytest.mark.torch
@pytest.mark.slow
def test_the_doubled_gradient_is_a_norms_gradient(reports):
    # the extra all-reduce over tp (size 2) doubles exactly the norms' gradients
    assert "norm" in reports["tp_norms_reduced_twice"].equivalence.grad_worst


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("plan", [p for _, p in SAFE])
def test_safe_plans_compare_their_whole_gradients(reports, plan):
    # ZeRO-1's flat shard gathered back into tensors, a pipeline stage's own layers, ZeRO-2's
    # flat shards under a pipeline (a tied embedding's part of its own), ZeRO++'s ZeRO-1 over FSDP
    # shards, ZeRO-1 with expert parallelism (two shards: the other parameters' and the experts')
    eq = reports[plan].equivalence
    assert eq.grad_rel is not None and eq.grad_rel <= eq.grad_tolerance
    assert reports[plan].outcome == "matched"
