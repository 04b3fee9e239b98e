"""K >= 2 kv heads copied over a product of tensor axes (check.kvproduct).

Two tensor axes tp and tq split the K/V projections of K kv heads on tp·tq > K ranks: numbered by
the joint index j = r_tp·tq + r_tq, rank j holds head j // (tp·tq/K). The checker reads each copy
group as a product of parts of the axes (a head part and a copy part per axis, an axis of whole
heads pinned at its declared size); its verdicts on the kv gradient and the grad norm are compared
with the concrete simulator (tests/simulator_kvproduct.py: the joint index and the copy groups as
sets of devices, no per-axis parts), at the declared sizes and at every refutation's counterexample
sizes, and with the answers derived by hand for each layout. Copy groups that cross the axes' blocks:
tests/test_kv_joint.py."""

from __future__ import annotations

import random
from itertools import product

import kvkit
import pytest
import simulator

from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_string
from placement_logic.ir import heads
from placement_logic.outcome import Verdict


def spec_text(tp: int, tq: int, kv: int, plans: dict[str, str], n_heads: int = 8) -> str:
    return kvkit.spec_text({"tp": tp, "tq": tq}, kv, plans, n_heads)


GRADS = {
    "derived": "",
    "dp_only": "  override grads[kv]: reduce over (dp)\n",  # the copies never summed
    "whole_axes": "  override grads[kv]: reduce over (dp, tp, tq)\n",  # different heads added
    "dp_tq": "  override grads[kv]: reduce over (dp, tq)\n",  # right where each copy group is the whole tq
    "dp_tp": "  override grads[kv]: reduce over (dp, tp)\n",  # never a copy group: tq holds copies or heads
}
NORMS = {
    "derived": "",
    "count_copies": "  override clip_norm[kv]: count_copies over ({copied})\n",  # each head tp·tq/K times
    "plain_sum": "  override clip_norm: reduce over (dp, tp, tq)\n",  # every copy counted (and the norms)
    "dedupe": "  override clip_norm: reduce over (dp, tp, tq)\n  override clip_norm: dedupe over (dp, tp, tq)\n",
}
# (tp, tq, K) -> the layout by hand: copy groups of tp·tq/K consecutive joint indices
LAYOUTS = {
    (2, 2, 2): {"tp": (2, 2), "tq": (1, 0)},  # groups {tq = 0, 1}: tq wholly copies, tp whole heads
    (2, 4, 4): {"tp": (2, 2), "tq": (2, 0)},  # groups of 2 of tq's 4 ranks
    (4, 2, 2): {"tp": (2, 0), "tq": (1, 0)},  # groups of 4: tq wholly and 2 of tp's ranks
    (4, 2, 4): {"tp": (4, 4), "tq": (1, 0)},
}
# by hand: dp_tq is right exactly where the copy group is all of tq (tq wholly copies, tp whole heads)
GRADS_OK = {shape: {"derived", "dp_tq"} if lay["tp"][1] and lay["tq"] == (1, 0) else {"derived"}
            for shape, lay in LAYOUTS.items()}


def _report(text: str, plan: str):
    return kvkit.report(text, plan, "kvproduct.place")


def _gi_broken(p, bindings: dict, sizes: dict[str, int]) -> bool:
    return kvkit.gi_broken(p, bindings, sizes, 5)


@pytest.mark.parametrize("shape", list(LAYOUTS))
def test_the_layout_by_hand(shape):
    tp, tq, k = shape
    spec = load_string(spec_text(tp, tq, k, {"derived": ""}), "kvproduct.place")
    assert heads.copy_layout(spec.plan("derived")) == LAYOUTS[shape]


@pytest.mark.parametrize("shape", list(LAYOUTS))
def test_the_kv_gradient_agrees_with_the_simulator(shape):
    tp, tq, k = shape
    text = spec_text(tp, tq, k, GRADS)
    spec = load_string(text, "kvproduct.place")
    bindings = dict(spec.bindings)
    for name in GRADS:
        report = _report(text, name)
        ob = next(o for o in report.obligations if o.name == "GI grads[kv]")
        ok = name in GRADS_OK[shape]
        assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (shape, name, ob.verdict, ob.reason)
        p = spec.plan(name)
        declared = [{"dp": dp, "tp": tp, "tq": tq, "microbatches": m} for dp, m in product((1, 2), (1, 2))]
        assert any(_gi_broken(p, bindings, s) for s in declared) is not ok, (shape, name)
        if not ok:  # the replayed counterexample's sizes: the simulator fails there too, on the model's layout
            sizes = dict(ob.counterexample.sizes)
            assert sizes["tp"] == tp or not LAYOUTS[shape]["tp"][1]  # an axis of whole heads keeps its size
            assert sizes["tq"] % LAYOUTS[shape]["tq"][0] == 0 and sizes["tp"] % LAYOUTS[shape]["tp"][0] == 0
            assert _gi_broken(p, bindings, sizes), (shape, name, sizes)


@pytest.mark.parametrize("shape", [(2, 2, 2), (2, 4, 4), (4, 2, 2)])
def test_the_grad_norm_agrees_with_the_simulator(shape):
    tp, tq, k = shape
    copied = ", ".join(a for a, (_, pin) in LAYOUTS[shape].items() if not pin)  # the axes holding copies
    text = spec_text(tp, tq, k, {name: body.format(copied=copied) for name, body in NORMS.items()})
    spec = load_string(text, "kvproduct.place")
    bindings = dict(spec.bindings)
    for name in NORMS:
        clip = next(o for o in _report(text, name).obligations if o.name == "SC clip_norm")
        ok = name in ("derived", "dedupe")  # by hand: each head once, the norms' copies filtered
        assert clip.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (shape, name, clip.verdict, clip.reason)
        p = spec.plan(name)
        runs = [({"dp": dp, "tp": tp, "tq": tq, "microbatches": 1}, seed) for dp, seed in product((1, 2), range(3))]
        if not ok:
            runs += [(dict(clip.counterexample.sizes), seed) for seed in range(3)]
        broken = any(("clip",) in simulator.norm_violations(p, s, random.Random(seed), bindings) for s, seed in runs)
        assert broken is not ok, (shape, name)


def test_copy_groups_that_cross_the_axes_are_decided():
    """2 x 3 tensor ranks over 3 kv heads (6 query heads): copy groups of 2 consecutive joint indices,
    {(0,0),(0,1)}, {(0,2),(1,0)}, {(1,1),(1,2)}: no product of parts of tp and tq, read on the joint index
    (check.kvjoint; tests/test_kv_joint.py compares it with the simulator): the derived plan is proved."""
    text = spec_text(2, 3, 3, {"derived": ""}, n_heads=6)
    spec = load_string(text, "kvproduct.place")
    assert heads.copy_layout(spec.plan("derived")) is None
    ob = next(o for o in _report(text, "derived").obligations if o.name == "GI grads[kv]")
    assert ob.verdict is Verdict.PROVED, ob.reason
    assert not _gi_broken(spec.plan("derived"), dict(spec.bindings), {"dp": 2, "tp": 2, "tq": 3, "microbatches": 2})


def test_a_counterexample_keeps_the_pinned_axis():
    """tp holds whole heads (2 x 2 ranks, 2 kv heads): the witness's tp stays at 2, where the copy
    groups are tq's ranks (at tp = 1 there would be no copies on tq at all)."""
    report = _report(spec_text(2, 2, 2, GRADS), "dp_only")
    ob = next(o for o in report.obligations if o.name == "GI grads[kv] over tq copy groups")
    assert ob.verdict is Verdict.REFUTED and dict(ob.counterexample.sizes)["tp"] == 2
    assert any("tp = 2" in n for n in ob.notes)


def test_a_pinned_size_off_the_layout_is_unknown_not_proved():
    """tp holds whole heads at its declared 2; at --set tp=4 the copy groups are laid out otherwise (2 kv
    heads on 8 ranks: runs of 4, over tq and half of tp), which the declared layout does not say: the kv
    obligations are unknown there, never proved on a layout the sizes contradict."""
    spec = load_string(spec_text(2, 2, 2, {"derived": ""}), "kvproduct.place")
    report = check_spec(spec, ["derived"], pinned={"tp": 4}, timeout=20).plans[0]
    ob = next(o for o in report.obligations if o.name == "GI grads[kv]")
    assert ob.verdict is Verdict.UNKNOWN and "tp = 4, where the plan declares 2" in ob.reason


def test_the_copy_group_all_reduce_is_priced_over_both_axes():
    """K = 2 on tp = 4 x tq = 2: one all-reduce of the kv gradient over each copy group of tp·tq/2 = 4
    ranks (by hand), spanning both axes; a ring over 4 ranks sends 2·(4−1)/4 of the buffer."""
    import sympy

    from placement_logic import costs
    from placement_logic.costs.symbolic import symbol
    from placement_logic.ir import collectives

    p = load_string(spec_text(4, 2, 2, {"derived": ""}), "kvproduct.place").plan("derived")
    (c,) = [c for c in collectives.derive(p) if c.payload.tensor == "grads:kv"]
    assert c.axes == ("tp", "tq")
    cost = costs.derive(p)
    (s,) = [x for x in cost.communication.collectives if x.collective.payload.tensor == "grads:kv"]
    tp, tq = symbol("tp"), symbol("tq")
    assert sympy.simplify(s.group - tp * tq / 2) == 0
    assert sympy.simplify(s.bytes_per_device.subs({tp: 4, tq: 2}) - s.buffer.subs({tp: 4, tq: 2}) * sympy.Rational(3, 2)) == 0
