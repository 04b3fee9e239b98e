"""Process groups given by a list of rank sets (``override grads / clip_norm: reduce_sets over (AXIS) ranks
([0, 2, 3], [1, 4])``, one ``new_group`` per set): parsed and formatted, refused where the sets do not partition
the axis's ranks (PL267, PL268, PL269, PL506), refuted with a replayed counterexample, agreeing with the
independent simulator, and priced on the largest set. The group of a rank is looked up here by hand; expected
prices are ring formulas written out here."""

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


def spec(mesh: str = "  dp = 5", override: str = "override grads: reduce_sets over (dp) ranks ([0, 2, 3], [1, 4])",
         plan: str = "dp: ddp") -> str:
    return spec_text(mesh, override, plan)


def set_of(sets, i):
    """The set holding rank i, by hand."""
    for j, s in enumerate(sets):
        if i in s:
            return j
    raise AssertionError(f"rank {i} in no set")


def test_fmt_round_trips_the_rank_sets(tmp_path):
    kit.check_fmt_round_trip(tmp_path, "override grads:  reduce_sets over (dp)  ranks ( [0,2, 3],[1 ,4] )",
                             "override grads: reduce_sets over (dp) ranks ([0, 2, 3], [1, 4])")


@pytest.mark.parametrize("mesh,override,code,phrase", [
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks ([0, 2, 3], [3, 1, 4])", "PL267",
     "rank 3 of dp is in sets 1 and 2"),
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks ([0, 2, 2], [1, 3, 4])", "PL267", "twice in set 1"),
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks ([0, 2], [1, 4])", "PL268", "rank 3 of dp (5 ranks) is in no set"),
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks ([0, 2, 3], [1, 5])", "PL268",
     "rank 5 is not a rank of dp, whose ranks are 0 .. 4"),
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks ([0, 2, 3], [1, 7/2])", "PL268", "7/2 is not a rank"),
    ("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, dp) ranks ([0, 2], [1, 3])", "PL269",
     "each named once"),
    ("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, tp) ranks ([0, 2], [1, 2, 3])", "PL267",
     "rank 2 of (dp, tp) flattened is in sets 1 and 2"),
    ("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, tp) ranks ([0, 2], [1, 4])", "PL268",
     "rank 4 is not a rank of (dp, tp) flattened, whose ranks are 0 .. 3"),
    ("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, tp) ranks ([0, 2], [1])", "PL268",
     "rank 3 of (dp, tp) flattened (4 ranks) is in no set"),
    ("  dp = 5", "override grads: reduce_groups over (dp) ranks ([0, 2, 3], [1, 4])", "PL269", "takes no rank sets"),
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks (0, 2)", "PL122", "needs 'ranks ([R, ...], [R, ...])'"),
    ("  dp = 5", "override grads: reduce_sets over (dp) ranks ([4, 0, 2, 3, 1])", "PL506", "one set holds every rank"),
])
def test_sets_that_do_not_partition_the_axis_are_located_errors(tmp_path, mesh, override, code, phrase):
    kit.check_located_error(tmp_path, mesh, override, code, phrase)


@pytest.mark.parametrize("sets", [((0, 2, 3), (1, 4)), ((1,), (0, 2)), ((3, 0), (2, 1)), ((0,), (1,), (2,))])
def test_a_partition_into_two_sets_or_more_is_refuted_at_its_size(sets):
    n = sum(map(len, sets))
    shown = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sets)
    text = spec(f"  dp = {n}", f"override grads: reduce_sets over (dp) ranks ({shown})")
    r = next(o for o in check_spec(load_string(text), timeout=20).plans[0].obligations
             if o.name == "GI grads[dense] blocks")
    assert r.verdict is Verdict.REFUTED, r
    cex = r.counterexample
    assert dict(cex.sizes)["dp"] == n
    a, b = rank_of(cex, "rank A"), rank_of(cex, "rank B")
    assert set_of(sets, a) != set_of(sets, b)  # the two replayed ranks are in different sets
    members = ", ".join(map(str, sorted(sets[set_of(sets, b)])))
    assert f"the sum over ranks {members} of dp" in cex.equation and "rank sets" in cex.diagnosis[0]


def test_pinned_at_another_size_than_the_sets_hold_is_a_located_error(tmp_path):
    kit.check_pinned_elsewhere(tmp_path, spec("  dp = 5"), "PL268")


def test_the_norm_reduced_in_rank_sets_is_refuted():
    text = spec("  dp = 5", "override clip_norm: reduce_sets over (dp) ranks ([0, 2, 3], [1, 4])", "dp: zero3")
    r = next(o for o in check_spec(load_string(text), timeout=20).plans[0].obligations if o.name == "SC clip_norm")
    assert r.verdict is Verdict.REFUTED and "rank sets [0, 2, 3], [1, 4]" in r.counterexample.diagnosis[0]
    a, b = rank_of(r.counterexample, "rank A"), rank_of(r.counterexample, "rank B")
    assert set_of(((0, 2, 3), (1, 4)), a) != set_of(((0, 2, 3), (1, 4)), b)


# ---------------------------------------------------------------------------------------------------
# the checker at pinned sizes against the independent simulator (tests/simulator_subgroups.py)

SETS = [((0,), (1,)), ((1,), (0,)), ((0, 2), (1,)), ((2,), (0, 1)), ((0, 3), (1, 2)), ((1, 3), (0,), (2,)),
        ((3, 1, 0), (2,))]


@pytest.mark.parametrize("sets", SETS)
def test_grad_sets_agree_with_the_simulator_and_by_hand(sets):
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_sets", None, ("dp",), sets=sets),))
    _, a, b = kit.check_grads_refuted_at(spec_, p, {"dp": sum(map(len, sets)), "microbatches": 1})
    assert set_of(sets, a) != set_of(sets, b)


def test_grad_sets_of_one_group_leave_the_others_alone():
    kit.check_one_group_leaves_the_others_alone(*plan("p", DDP_TP, overrides=(
        ov("grads", "reduce_sets", "norms", ("dp",), sets=((0, 2), (1,))),)))


@pytest.mark.parametrize("sets,code", [(((2, 0, 1),), "PL506"), (((0, 1), (1, 2)), "PL267"), (((0,), (2,)), "PL268")])
def test_ir_sets_that_do_not_partition_are_refused_at_check(sets, code):
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_sets", None, ("dp",), sets=sets),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec_, p, {"dp": 3, "microbatches": 1})
    assert e.value.diagnostics[0].code == code


@pytest.mark.parametrize("sets", [((0,), (1,)), ((0, 2), (1,)), ((1, 2), (0,))])
def test_norm_sets_agree_with_the_simulator(sets):
    spec_, p = plan("p", ZERO2, overrides=(ov("clip_norm", "reduce_sets", None, ("dp",), sets=sets),))
    kit.check_norm_against_the_simulator(spec_, p, {"dp": sum(map(len, sets)), "microbatches": 1})


def test_unpinned_the_witness_is_the_number_of_ranks_held_and_replays_in_the_simulator():
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_sets", None, ("dp",), sets=((4, 1), (0, 2, 3))),))
    kit.check_unpinned_witness(spec_, p, 5)


def _random_sets(rng, n):
    ranks = list(range(n))
    rng.shuffle(ranks)
    cuts = sorted(rng.sample(range(1, n), rng.randint(1, n - 1)))
    return tuple(tuple(ranks[a:b]) for a, b in zip([0] + cuts, cuts + [n]))


@pytest.mark.parametrize("seed", range(10))
def test_random_plans_with_rank_sets_agree_with_the_simulator(seed):
    rng = random.Random(seed)
    axes = kit.random_axes(rng)
    sets = _random_sets(rng, rng.randint(2, 4))
    target, group = kit.random_target(rng)
    spec_, p = plan("p", axes, overrides=(ov(target, "reduce_sets", group, ("a",), sets=sets),))
    sizes = {"a": sum(map(len, sets)), "microbatches": 1} | ({"b": rng.randint(1, 2)} if "b" in axes else {})
    kit.check_against_the_simulator(spec_, p, sizes, target, (axes, sets, target, group))


# ---------------------------------------------------------------------------------------------------
# prices: each set runs its own ring, the step waits for the largest

def test_priced_on_the_largest_set_inside_a_node(tmp_path):
    """dp = 12 on 8-GPU H100 nodes: [0, 2, 4, 6] and [1, 3, 5, 7] inside node 0, [8, 9, 10, 11] inside node 1;
    the largest set holds 4, bf16 gradients (2Ψ bytes) all-reduced 2·3/4·2Ψ per device on NVLink."""
    coll = kit.grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_sets over (dp) ranks ([0, 2, 4, 6], [1, 3, 5, 7], "
                                     "[8, 9, 10, 11])"))
    assert len(coll) == 1 and coll[0]["link"] == "intra_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 3, 4) * 2 * PSI


def test_a_set_across_a_node_boundary_stays_on_the_network(tmp_path):
    """[0, 8] spans nodes 0 and 1 (8-GPU nodes); the largest set, [1, 2, 3, 4, 5, 6], holds 6: 2·5/6·2Ψ per
    device, on the network."""
    coll = kit.grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_sets over (dp) ranks ([0, 8], [1, 2, 3, 4, 5, 6], "
                                     "[7, 9, 10, 11])"))
    assert coll[0]["link"] == "inter_node"
    assert abs(Fraction(coll[0]["bytes_per_device"]) - Fraction(2 * 5, 6) * 2 * PSI) < 1  # JSON rounds 10/3·10⁹


def test_ranks_written_with_lets_are_folded_to_numbers(tmp_path):
    text = spec("  dp = 5", "override grads: reduce_sets over (dp) ranks ([k, dp - 1], [0, 1, k - 1])")
    text = text.replace("model {", "let k = 3\nmodel {")
    f = tmp_path / "s.place"
    f.write_text(text)
    rc, out, _ = run(["inspect", str(f)])
    assert rc == 0 and "reduce_sets over (dp) ranks ([3, 4], [0, 1, 2])" in out
