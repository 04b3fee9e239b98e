"""The grad norm reduced within the process groups of rank sets over several axes (``override clip_norm:
reduce_sets over (A, B) ranks ([..], ..)``): each rank's squared norm summed over the devices of its set of the
flattened ranks (row-major, as torch's DeviceMesh flattens), the clip coefficient read from that partial norm.
The checker's verdict on ``SC clip_norm`` against a by-hand oracle on the HSDP mesh (a set is right iff it holds
each shard's piece once: replicas hold the same squared norms) and against the independent simulator
(tests/simulator_normsets.py: devices enumerated, the sets applied to the values simulator_norm draws); the
replayed counterexample; located errors (PL269, PL506, NORM_BLOCKS_AXIS); fmt."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import product

import pytest
import simulator
import subgroupkit as kit
from irkit import ov
from subgroupkit import SESSION, obligation, spec_text

from placement_logic.check.run import check_plan
from placement_logic.outcome import Verdict

HSDP = {"a": ("data", "R,R,R,R"), "t": ("data", "S,S,S,R")}  # a: replicate, t: shard (norm summed over t only)
ZERO_BOTH = {"a": ("data", "R,S,S,R"), "t": ("data", "R,S,S,R")}  # the norm summed over both
DP_TP = {"a": ("data", "R,R,R,R"), "t": ("tensor", "S,S,S,R")}  # megatron-like: t sharded, a replicated


def _plan(axes: dict, ns: tuple[int, int], sets):
    return kit.sets_plan(axes, {"a": ns[0], "t": ns[1]}, "clip_norm", sets)


def _hsdp_by_hand(sets, ns: tuple[int, int]) -> bool:
    """On the HSDP mesh every rank's norm is the global one iff each set holds exactly one device of each shard
    (walked with itertools.product: the replicas of a shard hold the same squared norm)."""
    walk = list(product(range(ns[0]), range(ns[1])))
    return all(sorted(walk[r][1] for r in s) == list(range(ns[1])) for s in sets)


_partitions = kit.partitions


def _sim(p, sizes) -> bool:
    return any(("clip",) in simulator.norm_violations(p, sizes, random.Random(s)) for s in range(8))


HSDP_CASES = [((2, 2), ((0, 1), (2, 3))), ((2, 2), ((0, 2), (1, 3))), ((2, 2), ((0, 3), (1, 2))),
              ((2, 2), ((0, 1, 2, 3),)), ((2, 3), ((0, 1, 2), (3, 4, 5))), ((2, 3), ((0, 4, 2), (3, 1, 5))),
              ((3, 2), ((0, 1), (2, 3), (4, 5))), ((3, 2), ((0, 2), (1, 3), (4, 5)))]
HSDP_CASES += [(ns, _partitions(ns[0] * ns[1], random.Random(seed)))
               for seed, ns in enumerate([(2, 2), (2, 3), (3, 2), (2, 2)] * 2)]


@pytest.mark.parametrize("ns,sets", HSDP_CASES)
def test_hsdp_verdict_agrees_with_the_simulator_and_by_hand(ns, sets):
    spec, p = _plan(HSDP, ns, sets)
    sizes = {"a": ns[0], "t": ns[1], "microbatches": 1}
    good = _hsdp_by_hand(sets, ns)
    ob = obligation(check_plan(SESSION, spec, p, sizes), "SC clip_norm")
    assert ob.verdict is (Verdict.PROVED if good else Verdict.REFUTED), (sets, ob.verdict, ob.reason)
    assert _sim(p, sizes) is not good
    if not good:
        cex = ob.counterexample
        assert "grad-norm² on" in cex.equation and "rank sets over" not in cex.equation, cex.equation
        assert "flattened row-major" in cex.diagnosis[0] and "counts the piece" in cex.diagnosis[0], cex.diagnosis


OTHER_CASES = [(axes, ns, _partitions(ns[0] * ns[1], random.Random(100 + seed)))
               for seed, (axes, ns) in enumerate([(ZERO_BOTH, (2, 2)), (DP_TP, (2, 2)), (ZERO_BOTH, (2, 3)),
                                                  (DP_TP, (3, 2)), (DP_TP, (2, 2)), (ZERO_BOTH, (3, 2))] * 2)]
OTHER_CASES += [(DP_TP, (2, 2), ((0, 1), (2, 3))), (DP_TP, (2, 2), ((0, 3), (1, 2))),
                (DP_TP, (2, 2), ((0, 2), (1, 3))), (ZERO_BOTH, (2, 2), ((0, 3), (1, 2)))]


@pytest.mark.parametrize("axes,ns,sets", OTHER_CASES)
def test_verdict_agrees_with_the_simulator(axes, ns, sets):
    if len(sets) == 1 and axes is ZERO_BOTH:
        pytest.skip("one set holding every rank of reduced axes changes nothing: PL506, tested below")
    spec, p = _plan(axes, ns, sets)
    sizes = {"a": ns[0], "t": ns[1], "microbatches": 1}
    ob = obligation(check_plan(SESSION, spec, p, sizes), "SC clip_norm")
    assert ob.verdict in (Verdict.PROVED, Verdict.REFUTED), ob.reason
    assert (ob.verdict is Verdict.REFUTED) is _sim(p, sizes), (sets, ob.verdict)


def test_zero_over_both_axes_refutes_every_cut():
    """The norm summed over both axes, every group sharded over both: a set of the flattened ranks holds a
    piece once only if it holds every rank, so any cut into two sets or more is wrong."""
    for sets in (((0, 1), (2, 3)), ((0, 3), (1, 2)), ((0,), (1, 2, 3))):
        spec, p = _plan(ZERO_BOTH, (2, 2), sets)
        ob = obligation(check_plan(SESSION, spec, p, {"a": 2, "t": 2, "microbatches": 1}), "SC clip_norm")
        assert ob.verdict is Verdict.REFUTED, sets


BASE = ("from std.data import hybrid_shard\nmodel {\n  params = 1e9\n}\nmesh {\n  replicate = 2\n  shard = 2\n}\n"
        "plan p {\n  [replicate, shard]: hybrid_shard\n  override clip_norm: reduce_sets over (replicate, shard) "
        "ranks (SETS)\n}\n")


def test_checked_from_the_file(tmp_path):
    good, bad = tmp_path / "good.place", tmp_path / "bad.place"
    good.write_text(BASE.replace("SETS", "[0, 1], [2, 3]"))
    bad.write_text(BASE.replace("SETS", "[0, 2], [1, 3]"))
    assert kit.run(["check", str(good)])[0] == 0
    rc, out, _ = kit.run(["check", str(bad)])
    assert rc == 1 and "refuted SC clip_norm" in out and "sizes: replicate=2, shard=2" in out, out
    assert "grad-norm² on" in out and "is 2" in out and "gives 1" in out, out


@pytest.mark.parametrize("mesh,override,code,phrase", [
    ("  dp = 2\n  tp = 2", "override clip_norm: reduce_sets over (dp, tp) ranks ([0, 1, 2, 3])", "PL506",
     "one set holds every rank"),
    ("  dp = 2\n  tp = 2", "override clip_norm: reduce_sets over (dp, tp) ranks ([0, 2], [1, 3, 1])", "PL267",
     "twice"),
    ("  dp = 2\n  tp = 2", "override clip_norm[dense]: reduce_sets over (dp, tp) ranks ([0, 2], [1, 3])", "PL182",
     "state its groups without a group"),
])
def test_located_errors(tmp_path, mesh, override, code, phrase):
    kit.check_located_error_in(tmp_path, spec_text(mesh, override, "dp: zero3\n  tp: zero3"), override, code, phrase)


def test_an_average_is_pl269(tmp_path):
    text = spec_text("  dp = 2\n  tp = 2", "override clip_norm: average over (dp, tp)\n  override clip_norm: "
                     "reduce_sets over (dp, tp) ranks ([0, 2], [1, 3])", "dp: zero3\n  tp: zero3")
    f = tmp_path / "e.place"
    f.write_text(text)
    rc, _, err = kit.run(["check", str(f)])
    assert rc == 2 and "[PL269]" in err and "averaged or maxed" in err, err


def test_fmt_round_trips(tmp_path):
    kit.check_fmt_round_trip(tmp_path, "override clip_norm:  reduce_sets over (dp,tp) ranks ([0,1],[2 ,3])",
                             "override clip_norm: reduce_sets over (dp, tp) ranks ([0, 1], [2, 3])", "  dp = 2\n  tp = 2")


def test_restated_over_the_same_axes_the_later_statement_holds():
    """Two statements over (a, t): the later replaces the earlier in the checker and in the simulator alike."""
    spec, p = _plan(HSDP, (2, 2), ((0, 2), (1, 3)))
    later = ov("clip_norm", "reduce_sets", None, ("a", "t"), sets=((0, 1), (2, 3)))
    p = replace(p, overrides=p.overrides + (later,))
    spec = replace(spec, plans=(p,))
    sizes = {"a": 2, "t": 2, "microbatches": 1}
    assert obligation(check_plan(SESSION, spec, p, sizes), "SC clip_norm").verdict is Verdict.PROVED
    assert not _sim(p, sizes)
