"""Rank sets over several axes (``override grads: reduce_sets over (A, B) ranks ([..], ..)``): the sets list
group ranks of the product of the axes flattened row-major (the first axis most significant, as torch's
DeviceMesh flattens). The checker's verdict on ``GI grads[g] blocks`` against a by-hand oracle (each set is
exactly a group of devices that agree on every named axis the gradient is not reduced over, and hold all of
them) and against the independent simulator (tests/simulator_subgroups.py ``sets_over_axes``: devices
enumerated, the sets applied); the replayed counterexample naming a wrong set; located errors (PL267, PL268,
PL269, PL506); fmt; costs priced on the largest set and the link of the axes it spans."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction
from itertools import product

import pytest
import simulator
import subgroupkit as kit
from irkit import const, ov, plan
from subgroupkit import PSI, SESSION, obligation, sim, spec_text

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.ir import ranksets
from placement_logic.outcome import Verdict

DP_TP = {"a": ("data", "R,R,R,R"), "t": ("tensor", "S,S,S,R")}  # dense reduced over a only
DP_DP = {"a": ("data", "R,R,R,R"), "t": ("data", "R,R,R,R")}  # dense reduced over both


def _plan(axes: dict, sizes: dict, sets, names=("a", "t")):
    return kit.sets_plan(axes, sizes, "grads", sets, names)


def _by_hand(sets, ns: tuple[int, int], reduced: tuple[bool, bool]) -> bool:
    """Whether every set is exactly the devices agreeing on the unreduced axes (walked by itertools.product)."""
    walk = list(product(range(ns[0]), range(ns[1])))
    want = {}
    for r, c in enumerate(walk):
        want.setdefault(tuple(x for x, red in zip(c, reduced) if not red), set()).add(r)
    return all(set(s) in list(want.values()) for s in sets)


_partitions = kit.partitions


def test_coords_are_row_major_as_itertools_walks_them():
    for ns in ((2, 3), (3, 2), (2, 2, 2)):
        assert [ranksets.coords(r, ns) for r in range(ranksets.prod(ns))] == list(product(*map(range, ns)))


CASES = [(DP_TP, (2, 2), ((0, 2), (1, 3))), (DP_TP, (2, 2), ((0, 1), (2, 3))), (DP_TP, (2, 3), ((0, 3), (1, 4), (2, 5))),
         (DP_TP, (2, 3), ((0, 1, 2), (3, 4, 5))), (DP_DP, (2, 2), ((0, 2), (1, 3))), (DP_TP, (3, 2), ((0, 2, 4), (1, 3, 5)))]
CASES += [(axes, ns, _partitions(ns[0] * ns[1], random.Random(seed)))
          for seed, (axes, ns) in enumerate([(DP_TP, (2, 2)), (DP_TP, (2, 3)), (DP_DP, (2, 2)), (DP_TP, (3, 2))] * 2)]


@pytest.mark.parametrize("axes,ns,sets", CASES)
def test_verdict_agrees_with_the_simulator_and_by_hand(axes, ns, sets):
    if len(sets) == 1 and axes is DP_DP:
        pytest.skip("one set holding every rank of reduced axes changes nothing: PL506, tested below")
    spec, p = _plan(axes, {"a": ns[0], "t": ns[1]}, sets)
    sizes = {"a": ns[0], "t": ns[1], "microbatches": 1}
    good = _by_hand(sets, ns, (True, axes is DP_DP))
    ob = obligation(check_plan(SESSION, spec, p, sizes), "GI grads[dense] blocks")
    assert ob.verdict is (Verdict.PROVED if good else Verdict.REFUTED), (sets, ob.verdict, ob.reason)
    assert sim(p, sizes, ("blocks", "dense")) is not good
    if not good:  # the replay names a set that is not a reduction group, and the two ranks' story holds
        cex = ob.counterexample
        assert "is not one of its reduction groups" in cex.diagnosis[0], cex.diagnosis
        named = cex.diagnosis[0].split("the set [")[1].split("]")[0]
        assert not _by_hand((tuple(int(x) for x in named.split(", ")),), ns, (True, axes is DP_DP))


def test_checked_from_the_file_at_free_sizes_holds_the_mesh_sizes(tmp_path):
    """dp = 2, tp = 2 with Megatron TP: dense gradients reduce over dp only, so [0, 2], [1, 3] (the dp groups of
    DeviceMesh) prove and [0, 1], [2, 3] (the tp groups reused) are refuted with the set named."""
    base = ("from std.data import ddp\nfrom std.tensor import megatron_tp\nmodel { params = 1e9 }\n"
            "mesh {\n  dp = 2\n  tp = 2\n}\nplan p {\n  dp: ddp\n  tp: megatron_tp\n  override grads[dense]: "
            "reduce_sets over (dp, tp) ranks (SETS)\n}\n")
    good, bad = tmp_path / "good.place", tmp_path / "bad.place"
    good.write_text(base.replace("SETS", "[0, 2], [1, 3]"))
    bad.write_text(base.replace("SETS", "[0, 1], [2, 3]"))
    assert kit.run(["check", str(good)])[0] == 0
    rc, out, _ = kit.run(["check", str(bad)])
    assert rc == 1 and "refuted GI grads[dense] blocks" in out and "sizes: dp=2, tp=2" in out, out
    assert "the set [0, 1] is not one of its reduction groups ([0, 2]; [1, 3])" in out, out


@pytest.mark.parametrize("mesh,override,code,phrase", [
    ("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, tp) ranks ([0, 1, 2, 3])", "PL506",
     "one set holds every rank"),
    ("  dp = 2\n  tp = 2", "override clip_norm: reduce_sets over (dp, tp) ranks ([0, 2], [1, 3])", "PL182",
     "the grad norm is not reduced over any of (dp, tp)"),
    ("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, tp) ranks ([0, 2], [1, 3, 1])", "PL267",
     "rank 1 of (dp, tp) flattened is twice in set 2"),
])
def test_located_errors(tmp_path, mesh, override, code, phrase):
    kit.check_located_error_in(tmp_path, spec_text(mesh, override, "dp: ddp\n  tp: ddp"), override, code, phrase)


def test_sizes_left_free_are_pl269():
    """A plan whose mesh sizes are symbols (built in memory): the flattened ranks depend on the sizes."""
    spec, p = plan("p", DP_TP, overrides=(ov("grads", "reduce_sets", None, ("a", "t"), sets=((0, 2), (1, 3))),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {"a": 2, "t": 2, "microbatches": 1})
    assert e.value.diagnostics[0].code == "PL269" and "each axis's size is a number" in e.value.diagnostics[0].message


def test_pinned_at_another_size_is_pl268(tmp_path):
    f = tmp_path / "p.place"
    f.write_text(spec_text("  dp = 2\n  tp = 2", "override grads: reduce_sets over (dp, tp) ranks ([0, 2], [1, 3])",
                           "dp: ddp\n  tp: ddp"))
    rc, _, err = kit.run(["check", str(f), "--set", "tp=4"])
    assert rc == 2 and "[PL268]" in err and "tp is pinned at 4" in err, err


def test_fmt_round_trips_sets_over_two_axes(tmp_path):
    kit.check_fmt_round_trip(tmp_path, "override grads:  reduce_sets over (dp,tp) ranks ([0,2],[1 ,3])",
                             "override grads: reduce_sets over (dp, tp) ranks ([0, 2], [1, 3])", "  dp = 2\n  tp = 2")


def test_priced_on_the_largest_set_and_the_link_it_spans(tmp_path):
    """nodes = 2 (inter-node) × gpus = 8 on 8-GPU H100 nodes, ddp over both: the sets [0, 8], [1, 9], ... each
    cross the two nodes (flat rank n·8 + g), 2 devices: 2·1/2·2Ψ per device on the network; the sets of one
    node's 8 GPUs ([0..7], [8..15]) lie inside a node: 2·7/8·2Ψ on NVLink."""
    mesh = "  device = h100_sxm\n  nodes = 2 @ inter_node\n  gpus = 8 @ intra_node"
    across = ", ".join(f"[{g}, {g + 8}]" for g in range(8))
    coll = kit.grad_sync(tmp_path, spec_text(mesh, f"override grads: reduce_sets over (nodes, gpus) ranks ({across})",
                                             "nodes: ddp\n  gpus: ddp"))
    assert len(coll) == 1 and coll[0]["link"] == "inter_node", coll
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 1, 2) * 2 * PSI
    inside = "[" + ", ".join(map(str, range(8))) + "], [" + ", ".join(map(str, range(8, 16))) + "]"
    coll = kit.grad_sync(tmp_path, spec_text(mesh, f"override grads: reduce_sets over (nodes, gpus) ranks ({inside})",
                                             "nodes: ddp\n  gpus: ddp"))
    assert coll[0]["link"] == "intra_node", coll
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI


def test_one_statement_for_every_group_is_checked_against_each_groups_reduction():
    """Sequence parallelism: the norms' gradient is reduced over a and t, the dense one over a only; the dp groups
    [0, 2], [1, 3] are the dense gradient's reduction groups but cut the norms' (one group of all four ranks)."""
    spec, p = plan("p", DP_TP, sp=True,
                   overrides=(ov("grads", "reduce_sets", None, ("a", "t"), sets=((0, 2), (1, 3))),))
    mesh = ir.Mesh(tuple(ir.Axis(x.name, const(2)) for x in p.mesh.axes))
    p = replace(p, mesh=mesh)
    spec = replace(spec, mesh=mesh, plans=(p,))
    sizes = {"a": 2, "t": 2, "microbatches": 1}
    report = check_plan(SESSION, spec, p, sizes)
    reduced = {g: {a for a, k in simulator.reductions(p, g).items() if k >= 1} for g in ("dense", "norms")}
    assert reduced == {"dense": {"a"}, "norms": {"a", "t"}}, reduced
    for g in ("dense", "norms"):
        good = _by_hand(((0, 2), (1, 3)), (2, 2), (True, "t" in reduced[g]))
        assert obligation(report, f"GI grads[{g}] blocks").verdict is (Verdict.PROVED if good else Verdict.REFUTED)
        assert sim(p, sizes, ("blocks", g)) is not good
        assert good is (g == "dense")
