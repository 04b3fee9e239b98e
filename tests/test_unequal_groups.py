"""Consecutive groups of unequal sizes (``override grads / clip_norm: reduce_groups over (AXIS) by (S1, ...)``):
parsed and formatted, refused where the sizes cannot cut the axis (PL250, PL251, PL506), refuted with a
replayed counterexample, and priced per group. Expected figures are ring formulas written out here for
the largest group, not read back from the engine; the group of a rank is computed here by hand."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import subgroupkit as kit
from irkit import ov, plan
from subgroupkit import DDP_TP, DP, PSI, SESSION, ZERO2, rank_of, run, spec_text

from placement_logic.check.run import check_plan, check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict


def spec(mesh: str = "  dp = 5", override: str = "override grads: reduce_groups over (dp) by (3, 2)",
         plan: str = "dp: ddp") -> str:
    return spec_text(mesh, override, plan)


def test_fmt_round_trips_the_list_of_sizes(tmp_path):
    kit.check_fmt_round_trip(tmp_path, "override grads:   reduce_groups   over (dp) by (3,2)",
                             "override grads: reduce_groups over (dp) by (3, 2)")


@pytest.mark.parametrize("mesh,override,code,phrase", [
    ("  dp = 8", "override grads: reduce_groups over (dp) by (3, 2)", "PL250", "hold 5 ranks (3 + 2), but dp has 8"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by (5, 0)", "PL250", "not 0"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by (7/2, 3/2)", "PL250", "= 7/2"),
    ("  dp = 4\n  tp = 2", "override grads: reduce_groups over (dp, tp) by (3, 1)", "PL251", "cuts one axis"),
    ("  dp = 5", "override grads: reduce_blocks over (dp) by (3, 2)", "PL251", "takes no list of sizes"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by 3", "PL122", "needs 'by (S1, S2, ...)'"),
])
def test_sizes_that_cannot_cut_the_axis_are_located_errors(tmp_path, mesh, override, code, phrase):
    kit.check_located_error(tmp_path, mesh, override, code, phrase)


def group_of(sizes, i):
    """The group of rank i, by hand: walk the runs."""
    j = 0
    while i >= sizes[j]:
        i -= sizes[j]
        j += 1
    return j


@pytest.mark.parametrize("sizes", [(3, 2), (1, 4), (2, 2, 1), (4, 4)])
def test_a_partition_into_two_groups_or_more_is_refuted_at_its_sum(sizes):
    n = sum(sizes)
    text = spec(f"  dp = {n}", f"override grads: reduce_groups over (dp) by ({', '.join(map(str, sizes))})")
    res = check_spec(load_string(text), timeout=20).plans[0]
    r = next(o for o in res.obligations if o.name == "GI grads[dense] blocks")
    assert r.verdict is Verdict.REFUTED, r
    cex = r.counterexample
    assert dict(cex.sizes)["dp"] == n
    a, b = rank_of(cex, "rank A"), rank_of(cex, "rank B")
    assert group_of(sizes, a) != group_of(sizes, b)  # the two replayed ranks are in different groups
    assert "consecutive groups" in cex.diagnosis[0]


def test_pinned_at_another_size_than_the_sum_is_a_located_error(tmp_path):
    kit.check_pinned_elsewhere(tmp_path, spec("  dp = 5"), "PL250")


def test_the_norm_reduced_in_unequal_groups_is_refuted():
    text = spec("  dp = 5", "override clip_norm: reduce_groups over (dp) by (3, 2)", "dp: zero3")
    res = check_spec(load_string(text), timeout=20).plans[0]
    r = next(o for o in res.obligations if o.name == "SC clip_norm")
    assert r.verdict is Verdict.REFUTED and "consecutive groups of 3, 2 ranks" in r.counterexample.diagnosis[0]


def test_priced_on_the_largest_group_inside_a_node(tmp_path):
    """dp = 12 on 8-GPU H100 nodes cut (8, 4): bf16 gradients (2Ψ bytes) all-reduced on the group of 8,
    2·7/8·2Ψ per device, each group inside one node (ranks 0..7, 8..11)."""
    coll = kit.grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_groups over (dp) by (8, 4)"))
    assert len(coll) == 1 and coll[0]["link"] == "intra_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI


def test_a_group_across_a_node_boundary_stays_on_the_network(tmp_path):
    """(4, 8) on 8-GPU nodes: the group of ranks 4..11 spans two nodes."""
    coll = kit.grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_groups over (dp) by (4, 8)"))
    assert coll[0]["link"] == "inter_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI


# ---------------------------------------------------------------------------------------------------
# the checker at pinned sizes against the independent simulator (tests/simulator_subgroups.py) and the
# hand-derived answer: a list of two sizes or more cuts the axis, so every gradient reduced over it in
# those groups holds partial sums (refuted), and so does the grad norm summed over its shards

PARTITIONS = [(1, 1), (2, 1), (1, 2), (3, 1), (1, 3), (2, 2), (2, 1, 1), (1, 2, 1), (1, 1, 1)]


@pytest.mark.parametrize("parts", PARTITIONS)
def test_grad_groups_agree_with_the_simulator_and_by_hand(parts):
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_groups", None, ("dp",), sizes=parts),))
    cex, a, b = kit.check_grads_refuted_at(spec_, p, {"dp": sum(parts), "microbatches": 1})
    assert group_of(parts, a) != group_of(parts, b)  # the solver's two ranks, in different groups by hand
    j = group_of(parts, b)
    first = sum(parts[:j])
    assert f"the sum over ranks {first}..{first + parts[j] - 1} of dp" in cex.equation, cex.equation


def test_grad_groups_of_one_group_leave_the_others_alone():
    kit.check_one_group_leaves_the_others_alone(*plan("p", DDP_TP, overrides=(
        ov("grads", "reduce_groups", "norms", ("dp",), sizes=(2, 1)),)))


def test_a_list_of_one_size_changes_nothing():
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_groups", None, ("dp",), sizes=(3,)),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec_, p, {"dp": 3, "microbatches": 1})
    assert e.value.diagnostics[0].code == "PL506"


@pytest.mark.parametrize("parts", [(1, 1), (2, 1), (1, 2)])
def test_norm_groups_agree_with_the_simulator(parts):
    spec_, p = plan("p", ZERO2, overrides=(ov("clip_norm", "reduce_groups", None, ("dp",), sizes=parts),))
    kit.check_norm_against_the_simulator(spec_, p, {"dp": sum(parts), "microbatches": 1})


def test_unpinned_the_witness_is_the_sum_and_replays_in_the_simulator():
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_groups", None, ("dp",), sizes=(2, 3)),))
    kit.check_unpinned_witness(spec_, p, 5)


@pytest.mark.parametrize("seed", range(12))
def test_random_plans_with_unequal_groups_agree_with_the_simulator(seed):
    rng = random.Random(seed)
    axes = kit.random_axes(rng)
    parts = tuple(rng.randint(1, 2) for _ in range(rng.randint(2, 3)))
    target, group = kit.random_target(rng)
    spec_, p = plan("p", axes, overrides=(ov(target, "reduce_groups", group, ("a",), sizes=parts),))
    sizes = {"a": sum(parts), "microbatches": 1} | ({"b": rng.randint(1, 2)} if "b" in axes else {})
    kit.check_against_the_simulator(spec_, p, sizes, target, (axes, parts, target, group))


def test_sizes_written_with_lets_and_the_axis_are_folded_to_numbers(tmp_path):
    """`by (k, dp - k)` with k = 3 and dp = 5: the groups of 3 and 2, priced on the group of 3, 2·2/3·2Ψ per device;
    `inspect` shows the numbers."""
    text = spec("  dp = 5", "override grads: reduce_groups over (dp) by (k, dp - k)").replace("model {", "let k = 3\nmodel {")
    coll = kit.grad_sync(tmp_path, text)
    assert abs(Fraction(coll[0]["bytes_per_device"]) - Fraction(2 * 2, 3) * 2 * PSI) < 1  # JSON rounds 8/3·10⁹
    f = tmp_path / "s.place"
    f.write_text(text)
    rc, out, _ = run(["inspect", str(f)])
    assert rc == 0 and "reduce_groups over (dp) by (3, 2)" in out
