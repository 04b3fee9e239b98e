"""Consecutive groups of unequal sizes (``override grads / clip_norm: reduce_groups over (AXIS) by (S1, ...)``):
parsed and formatted, refused where the sizes cannot cut the axis (PL250, PL251, PL506), refuted with a
replayed counterexample, and priced per group. Expected figures are ring formulas written out here for
the largest group, not read back from the engine; the group of a rank is computed here by hand."""

from __future__ import annotations

import io
import json
import random
from fractions import Fraction

import pytest
import simulator
from irkit import ov, plan

from placement_logic.check.run import check_plan, check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

PSI = 10**9


def spec(mesh: str = "  dp = 5", override: str = "override grads: reduce_groups over (dp) by (3, 2)",
         plan: str = "dp: ddp") -> str:
    return (f"from std.data import ddp, zero3\nmodel {{\n  params = {PSI}\n}}\nmesh {{\n{mesh}\n}}\n"
            f"plan p {{\n  {plan}\n  {override}\n}}\n")


def run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def test_fmt_round_trips_the_list_of_sizes(tmp_path):
    f = tmp_path / "g.place"
    f.write_text(spec(override="override grads:   reduce_groups   over (dp) by (3,2)"))
    rc, out, _ = run(["fmt", str(f)])
    assert rc == 0 and "override grads: reduce_groups over (dp) by (3, 2)\n" in out
    f.write_text(out)
    assert run(["fmt", str(f)])[1] == out


@pytest.mark.parametrize("mesh,override,code,phrase", [
    ("  dp = 8", "override grads: reduce_groups over (dp) by (3, 2)", "PL250", "hold 5 ranks (3 + 2), but dp has 8"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by (5, 0)", "PL250", "not 0"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by (7/2, 3/2)", "PL250", "= 7/2"),
    ("  dp = 4\n  tp = 2", "override grads: reduce_groups over (dp, tp) by (3, 1)", "PL251", "cuts one axis"),
    ("  dp = 5", "override grads: reduce_blocks over (dp) by (3, 2)", "PL251", "takes no list of sizes"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by 3", "PL122", "needs 'by (S1, S2, ...)'"),
])
def test_sizes_that_cannot_cut_the_axis_are_located_errors(tmp_path, mesh, override, code, phrase):
    f = tmp_path / "bad.place"
    f.write_text(spec(mesh, override))
    rc, _, err = run(["check", str(f)])
    line = 9 + mesh.count("\n") + 1
    assert rc == 2 and f"{f}:{line}:3: error:" in err and f"[{code}]" in err and phrase in err, err


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
    ranks = dict(cex.devices)
    a, b = (int(ranks[k].split("=")[1].rstrip(")")) for k in ("rank A", "rank B"))
    assert group_of(sizes, a) != group_of(sizes, b)  # the two replayed ranks are in different groups
    assert "consecutive groups" in cex.diagnosis[0]


def test_pinned_at_another_size_than_the_sum_is_a_located_error(tmp_path):
    f = tmp_path / "p.place"
    f.write_text(spec("  dp = 5"))
    rc, _, err = run(["check", str(f), "--set", "dp=4"])
    assert rc == 2 and f"{f}:10:3: error:" in err and "[PL250]" in err and "pinned at 4" in err, err
    rc, out, err = run(["check", str(f), "--set", "dp=5"])
    assert rc == 1 and "refuted GI grads[dense] blocks" in out, out + err


def test_the_norm_reduced_in_unequal_groups_is_refuted():
    text = spec("  dp = 5", "override clip_norm: reduce_groups over (dp) by (3, 2)", "dp: zero3")
    res = check_spec(load_string(text), timeout=20).plans[0]
    r = next(o for o in res.obligations if o.name == "SC clip_norm")
    assert r.verdict is Verdict.REFUTED and "consecutive groups of 3, 2 ranks" in r.counterexample.diagnosis[0]


def _grad_sync(tmp_path, text):
    f = tmp_path / "c.place"
    f.write_text(text)
    rc, out, err = run(["cost", str(f), "--format", "json"])
    assert rc == 0, err
    comm = json.loads(out)["plans"][0]["communication"]
    return [c for c in comm["collectives"] if c["phase"] == "grad_sync"]


def test_priced_on_the_largest_group_inside_a_node(tmp_path):
    """dp = 12 on 8-GPU H100 nodes cut (8, 4): bf16 gradients (2Ψ bytes) all-reduced on the group of 8,
    2·7/8·2Ψ per device, each group inside one node (ranks 0..7, 8..11)."""
    coll = _grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_groups over (dp) by (8, 4)"))
    assert len(coll) == 1 and coll[0]["link"] == "intra_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI


def test_a_group_across_a_node_boundary_stays_on_the_network(tmp_path):
    """(4, 8) on 8-GPU nodes: the group of ranks 4..11 spans two nodes."""
    coll = _grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_groups over (dp) by (4, 8)"))
    assert coll[0]["link"] == "inter_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI


# ---------------------------------------------------------------------------------------------------
# the checker at pinned sizes against the independent simulator (tests/simulator_subgroups.py) and the
# hand-derived answer: a list of two sizes or more cuts the axis, so every gradient reduced over it in
# those groups holds partial sums (refuted), and so does the grad norm summed over its shards

SESSION = Session(timeout=20)
DP = {"dp": ("data", "R,R,R,R")}
ZERO2 = {"dp": ("data", "R,S,S,R")}
DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
PARTITIONS = [(1, 1), (2, 1), (1, 2), (3, 1), (1, 3), (2, 2), (2, 1, 1), (1, 2, 1), (1, 1, 1)]


def _ob(report, name):
    return next(o for o in report.obligations if o.name == name)


def _sim(p, sizes, key, seeds=4) -> bool:
    return any(key in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(seeds))


@pytest.mark.parametrize("parts", PARTITIONS)
def test_grad_groups_agree_with_the_simulator_and_by_hand(parts):
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_groups", None, ("dp",), sizes=parts),))
    sizes = {"dp": sum(parts), "microbatches": 1}
    report = check_plan(SESSION, spec_, p, sizes)
    for g in ("dense", "norms"):
        assert _ob(report, f"GI grads[{g}] blocks").verdict is Verdict.REFUTED
        assert _ob(report, f"GI grads[{g}]").verdict is Verdict.REFUTED
        assert _sim(p, sizes, ("blocks", g)) and _sim(p, sizes, ("gi", g))
    cex = _ob(report, "GI grads[dense] blocks").counterexample
    a, b = (int(dict(cex.devices)[k].split("=")[1].rstrip(")")) for k in ("rank A", "rank B"))
    assert group_of(parts, a) != group_of(parts, b)  # the solver's two ranks, in different groups by hand
    j = group_of(parts, b)
    first = sum(parts[:j])
    assert f"the sum over ranks {first}..{first + parts[j] - 1} of dp" in cex.equation, cex.equation
    assert f"1 on (dp={a})" in dict(cex.values)["per-rank contribution"]


def test_grad_groups_of_one_group_leave_the_others_alone():
    spec_, p = plan("p", DDP_TP, overrides=(ov("grads", "reduce_groups", "norms", ("dp",), sizes=(2, 1)),))
    sizes = {"dp": 3, "tp": 2, "microbatches": 1}
    report = check_plan(SESSION, spec_, p, sizes)
    assert _ob(report, "GI grads[norms] blocks").verdict is Verdict.REFUTED
    assert _ob(report, "GI grads[dense]").verdict is Verdict.PROVED
    assert not any(o.name == "GI grads[dense] blocks" for o in report.obligations)
    assert _sim(p, sizes, ("blocks", "norms")) and not _sim(p, sizes, ("gi", "dense"))


def test_a_list_of_one_size_changes_nothing():
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_groups", None, ("dp",), sizes=(3,)),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec_, p, {"dp": 3, "microbatches": 1})
    assert e.value.diagnostics[0].code == "PL506"


@pytest.mark.parametrize("parts", [(1, 1), (2, 1), (1, 2)])
def test_norm_groups_agree_with_the_simulator(parts):
    spec_, p = plan("p", ZERO2, overrides=(ov("clip_norm", "reduce_groups", None, ("dp",), sizes=parts),))
    sizes = {"dp": sum(parts), "microbatches": 1}
    clip = _ob(check_plan(SESSION, spec_, p, sizes), "SC clip_norm")
    assert clip.verdict is Verdict.REFUTED
    assert any(("clip",) in simulator.norm_violations(p, sizes, random.Random(s)) for s in range(6))
    assert "grad-norm² on" in clip.counterexample.equation and "= 0" in clip.counterexample.equation


def test_unpinned_the_witness_is_the_sum_and_replays_in_the_simulator():
    spec_, p = plan("p", DP, overrides=(ov("grads", "reduce_groups", None, ("dp",), sizes=(2, 3)),))
    ob = _ob(check_plan(SESSION, spec_, p, {}), "GI grads[dense] blocks")
    assert ob.verdict is Verdict.REFUTED and dict(ob.counterexample.sizes)["dp"] == 5
    assert _sim(p, {"dp": 5, "microbatches": 1}, ("blocks", "dense"))


@pytest.mark.parametrize("seed", range(12))
def test_random_plans_with_unequal_groups_agree_with_the_simulator(seed):
    rng = random.Random(seed)
    axes = {"a": rng.choice([("data", "R,R,R,R"), ("data", "R,S,S,R"), ("tensor", "S,S,S,S")])}
    if rng.random() < 0.5:
        axes["b"] = rng.choice([("data", "R,R,R,R"), ("tensor", "S,S,S,S")])
    parts = tuple(rng.randint(1, 2) for _ in range(rng.randint(2, 3)))
    target = rng.choice(["grads", "clip_norm"])
    group = rng.choice([None, "dense", "norms"]) if target == "grads" else None
    spec_, p = plan("p", axes, overrides=(ov(target, "reduce_groups", group, ("a",), sizes=parts),))
    sizes = {"a": sum(parts), "microbatches": 1} | ({"b": rng.randint(1, 2)} if "b" in axes else {})
    try:
        report = check_plan(SESSION, spec_, p, sizes)
    except DiagnosticError:
        pytest.skip("a statement the step cannot read (a located error, tested above)")
    found: set = set()
    for s in range(4):
        found |= simulator.violations(p, sizes, random.Random(s), trials=2)
    keys = {}
    for o in report.obligations:
        if o.name.startswith("GI grads[") and o.name.endswith("] blocks"):
            keys[("blocks", o.name[len("GI grads["):-len("] blocks")])] = o.verdict
        elif o.name == "SC clip_norm" and target == "clip_norm":
            keys[("clip",)] = o.verdict
    assert keys and Verdict.UNKNOWN not in keys.values(), keys
    wrong = [(k, v.word) for k, v in keys.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not wrong, (wrong, axes, parts, target, group)


def test_sizes_written_with_lets_and_the_axis_are_folded_to_numbers(tmp_path):
    """`by (k, dp - k)` with k = 3 and dp = 5: the groups of 3 and 2, priced on the group of 3, 2·2/3·2Ψ per device;
    `inspect` shows the numbers."""
    text = spec("  dp = 5", "override grads: reduce_groups over (dp) by (k, dp - k)").replace("model {", "let k = 3\nmodel {")
    coll = _grad_sync(tmp_path, text)
    assert abs(Fraction(coll[0]["bytes_per_device"]) - Fraction(2 * 2, 3) * 2 * PSI) < 1  # JSON rounds 8/3·10⁹
    f = tmp_path / "s.place"
    f.write_text(text)
    rc, out, _ = run(["inspect", str(f)])
    assert rc == 0 and "reduce_groups over (dp) by (3, 2)" in out
