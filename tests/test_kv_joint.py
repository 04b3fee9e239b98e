"""K >= 2 kv heads copied over several tensor axes in copy groups that cross the axes' blocks
(check.kvjoint).

The tensor ranks that split the K/V projections are numbered by the joint index of their axes (the
first axis most significant); rank j holds head j // (n/K). Where the runs of n/K consecutive joint
indices are no product of parts of the axes (3 kv heads on tp = 2 x tq = 3: {(0,0),(0,1)},
{(0,2),(1,0)}, {(1,1),(1,2)}), the checker reads them at the declared sizes. Its verdicts on the kv
gradient and the grad norm are compared, on hand-written and generated plans, with the concrete
simulator (tests/simulator_kvproduct.py: the copy groups as sets of devices), at the declared sizes
and at every refutation's replayed counterexample."""

from __future__ import annotations

import random
from itertools import product

import kvkit
import pytest
import simulator
import simulator_kvproduct as kvp

from placement_logic.frontend.loader import load_string
from placement_logic.ir import heads
from placement_logic.outcome import Verdict

spec_text = kvkit.spec_text

# (tensor axes and sizes, K, query heads): copy groups crossing the axes' blocks
SHAPES = {
    "2x3_k3": ({"tp": 2, "tq": 3}, 3, 6),  # runs of 2 of 6 joint indices
    "3x2_k2": ({"tp": 3, "tq": 2}, 2, 6),  # runs of 3: {(0,0),(0,1),(1,0)}, {(1,1),(2,0),(2,1)}
    "3x4_k4": ({"tp": 3, "tq": 4}, 4, 12),  # runs of 3 of 12
}
# by hand: the copy groups of 2x3_k3 and 3x2_k2 as sets of (tp, tq) ranks
GROUPS = {
    "2x3_k3": [{(0, 0), (0, 1)}, {(0, 2), (1, 0)}, {(1, 1), (1, 2)}],
    "3x2_k2": [{(0, 0), (0, 1), (1, 0)}, {(1, 1), (2, 0), (2, 1)}],
}
GRADS = {  # name -> (statement, right by hand: only a sum over exactly each copy group is)
    "derived": ("", True),
    "dp_only": ("  override grads[kv]: reduce over (dp)\n", False),  # the copies never summed
    "whole_axes": ("  override grads[kv]: reduce over (dp, tp, tq)\n", False),  # different heads added
    "dp_tq": ("  override grads[kv]: reduce over (dp, tq)\n", False),  # a tq fibre holds two heads
    "dp_tp": ("  override grads[kv]: reduce over (dp, tp)\n", False),  # so does a tp fibre
}
NORMS = {  # name -> (statement, right by hand: each head's squared norm counted once)
    "derived": ("", True),
    "plain_sum": ("  override clip_norm: reduce over (dp, tp, tq)\n", False),  # every copy (and norms, biases)
    "dedupe": ("  override clip_norm: reduce over (dp, tp, tq)\n  override clip_norm: dedupe over (dp, tp, tq)\n", True),
    "count_copies": ("  override clip_norm[kv]: count_copies over (tp, tq)\n", False),  # each head n/K times
}


def _report(text: str, plan: str, **kw):
    return kvkit.report(text, plan, "kvjoint.place", **kw)


def _gi_broken(p, bindings: dict, sizes: dict[str, int]) -> bool:
    return kvkit.gi_broken(p, bindings, sizes, 7)


def _gi_agrees(text: str, names, tensor: dict[str, int], expected: dict[str, bool] | None = None) -> None:
    spec = load_string(text, "kvjoint.place")
    bindings = dict(spec.bindings)
    for name in names:
        ob = next(o for o in _report(text, name).obligations if o.name == "GI grads[kv]")
        p = spec.plan(name)
        declared = [{"dp": dp, **tensor, "microbatches": m} for dp, m in product((1, 2), (1, 2))]
        broken = any(_gi_broken(p, bindings, s) for s in declared)
        assert ob.verdict is (Verdict.REFUTED if broken else Verdict.PROVED), (name, ob.verdict, ob.reason)
        if expected is not None:
            assert broken is not expected[name], name
        if broken:  # the replayed counterexample: at the declared tensor sizes, and the simulator fails there
            sizes = dict(ob.counterexample.sizes)
            assert {a: sizes[a] for a in tensor} == tensor
            assert _gi_broken(p, bindings, sizes), (name, sizes)


@pytest.mark.parametrize("shape", list(GROUPS))
def test_the_copy_groups_by_hand(shape):
    tensor, k, n_heads = SHAPES[shape]
    p = load_string(spec_text(tensor, k, {"derived": ""}, n_heads), "kvjoint.place").plan("derived")
    assert heads.copy_layout(p) is None and heads.joint_layout(p) is not None
    sizes = {"dp": 1, **tensor}
    lay = kvp.layout(p, "kv", sizes)
    pos = {"dp": 0, "tp": 1, "tq": 2}
    found: dict[int, set] = {}
    for r, q in product(range(tensor["tp"]), range(tensor["tq"])):
        found.setdefault(kvp.head((0, r, q), pos, lay, sizes), set()).add((r, q))
    assert sorted(found.values(), key=min) == GROUPS[shape]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_kv_gradient_agrees_with_the_simulator(shape):
    tensor, k, n_heads = SHAPES[shape]
    text = spec_text(tensor, k, {name: body for name, (body, _) in GRADS.items()}, n_heads)
    _gi_agrees(text, GRADS, tensor, {name: ok for name, (_, ok) in GRADS.items()})


@pytest.mark.parametrize("seed", range(3))
def test_generated_plans_agree_with_the_simulator(seed):
    """Random reductions of the kv gradient (whole axes, repeated, or the derived copy groups) and of
    the accumulation, on a random crossing shape: the checker's verdict is the simulator's."""
    rng = random.Random(seed)
    shape = rng.choice(list(SHAPES))
    tensor, k, n_heads = SHAPES[shape]
    plans = {}
    for i in range(4):
        axes = [a for a in ("dp", *tensor) if rng.random() < 0.6]
        axes += [a for a in axes if rng.random() < 0.2]  # an axis reduced twice
        extra = f"  override grads[kv]: reduce over ({', '.join(axes)})\n" if axes and rng.random() < 0.8 else ""
        if rng.random() < 0.25:
            extra += "  override grads: no_accumulation_buffer\n"
        plans[f"g{i}"] = extra
    _gi_agrees(spec_text(tensor, k, plans, n_heads), plans, tensor)


@pytest.mark.parametrize("shape", ["2x3_k3", "3x2_k2"])
def test_the_grad_norm_agrees_with_the_simulator(shape):
    tensor, k, n_heads = SHAPES[shape]
    text = spec_text(tensor, k, {name: body for name, (body, _) in NORMS.items()}, n_heads)
    spec = load_string(text, "kvjoint.place")
    bindings = dict(spec.bindings)
    for name, (_, ok) in NORMS.items():
        clip = next(o for o in _report(text, name).obligations if o.name == "SC clip_norm")
        assert clip.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (shape, name, clip.verdict, clip.reason)
        runs = [({"dp": dp, **tensor, "microbatches": 1}, seed) for dp, seed in product((1, 2), range(3))]
        if not ok:
            runs += [(dict(clip.counterexample.sizes), seed) for seed in range(3)]
        p = spec.plan(name)
        broken = any(("clip",) in simulator.norm_violations(p, s, random.Random(seed), bindings) for s, seed in runs)
        assert broken is not ok, (shape, name)


def test_the_diagnosis_names_the_copy_groups():
    tensor, k, n_heads = SHAPES["2x3_k3"]
    text = spec_text(tensor, k, {"dp_only": GRADS["dp_only"][0], "count_copies": NORMS["count_copies"][0]}, n_heads)
    gi = next(o for o in _report(text, "dp_only").obligations if o.name == "GI grads[kv]")
    assert any("missing all-reduce over each copy group of tp×tq (2 consecutive ranks" in d
               for d in gi.counterexample.diagnosis)
    by_hand = "; ".join(f"head {h}: " + " ".join(f"(tp={r}, tq={q})" for r, q in sorted(grp))
                        for h, grp in enumerate(GROUPS["2x3_k3"]))
    assert dict(gi.counterexample.values)["kv copy groups"] == by_hand
    clip = next(o for o in _report(text, "count_copies").obligations if o.name == "SC clip_norm")
    assert any("copied on 2 tp×tq ranks each" in d and "counted 2 times" in d for d in clip.counterexample.diagnosis)


def test_a_size_off_the_declared_layout_is_unknown_not_proved():
    """At --set tq=6 the runs of the joint index are other sets of ranks: unknown, never proved."""
    tensor, k, _ = SHAPES["2x3_k3"]
    report = _report(spec_text(tensor, k, {"derived": ""}, 12), "derived", pinned={"tq": 6})
    ob = next(o for o in report.obligations if o.name == "GI grads[kv]")
    assert ob.verdict is Verdict.UNKNOWN and "tq = 6, where the plan declares 3" in ob.reason


THREE = {"ta": 2, "tb": 3, "tc": 2}  # 3 kv heads on 12 ranks: runs of 4, j = 6·a + 2·b + c


def test_three_axes_crossing_agree_with_the_simulator():
    """Over three axes the copy groups {a=0, b<2}, {a=0, b=2} ∪ {a=1, b=0}, {a=1, b>0} cross ta and tb;
    tc's fibres lie inside them. The derived plan is proved, a reduction over (dp, ta, tb, tc) refuted."""
    plans = {"derived": "", "whole": "  override grads[kv]: reduce over (dp, ta, tb, tc)\n",
             "tb": "  override grads[kv]: reduce over (dp, tb)\n"}
    text = spec_text(THREE, 3, plans, 12)
    _gi_agrees(text, plans, THREE, {"derived": True, "whole": False, "tb": False})


def test_a_sum_inside_the_copy_groups_is_unknown_naming_it():
    """A reduction over tc alone sums a block of each copy group (tc's fibres lie inside them): not in the
    step model, so unknown with the missing fact; the simulator finds it wrong (the rest never summed)."""
    text = spec_text(THREE, 3, {"tc": "  override grads[kv]: reduce over (dp, tc)\n"}, 12)
    ob = next(o for o in _report(text, "tc").obligations if o.name == "GI grads[kv]")
    assert ob.verdict is Verdict.UNKNOWN and "inside the kv heads' copy groups" in ob.reason
    spec = load_string(text, "kvjoint.place")
    assert _gi_broken(spec.plan("tc"), dict(spec.bindings), {"dp": 2, **THREE, "microbatches": 2})


def _norm_plan(rng: random.Random, tensor: dict[str, int]) -> str:
    """A random statement of the grad norm over crossing copy groups: the derived one, or a stated sum over
    (dp and) every tensor axis, with or without a duplicate filter over some axes and `count_copies` over some."""
    axes = list(tensor)
    lines = ""
    if rng.random() < 0.7:
        lines += f"  override clip_norm: reduce over ({', '.join((['dp'] if rng.random() < 0.5 else []) + axes)})\n"
        if rng.random() < 0.6:
            named = [a for a in axes if rng.random() < 0.6] or axes[-1:]
            lines += f"  override clip_norm: dedupe over ({', '.join(named)})\n"
    if rng.random() < 0.4:
        named = [a for a in axes if rng.random() < 0.6] or axes[:1]
        lines += f"  override clip_norm[kv]: count_copies over ({', '.join(named)})\n"
    return lines


@pytest.mark.parametrize("seed", range(3))
def test_generated_norms_agree_with_the_simulator(seed):
    """Random statements of the norm's reduction, filter and copy count over crossing copy groups: the
    checker's SC clip_norm is the simulator's (a statement that changes nothing is PL506, skipped)."""
    from placement_logic.diagnostics import DiagnosticError

    rng = random.Random(100 + seed)
    shape = rng.choice(["2x3_k3", "3x2_k2"])
    tensor, k, n_heads = SHAPES[shape]
    plans = {f"n{i}": _norm_plan(rng, tensor) for i in range(4)}
    text = spec_text(tensor, k, plans, n_heads)
    spec = load_string(text, "kvjoint.place")
    bindings = dict(spec.bindings)
    decided = 0
    for name in plans:
        try:
            clip = next(o for o in _report(text, name).obligations if o.name == "SC clip_norm")
        except DiagnosticError as e:
            assert all(d.span.line for d in e.diagnostics), name  # a located error, never a traceback
            continue
        runs = [({"dp": dp, **tensor, "microbatches": 1}, s) for dp, s in product((1, 2), range(3))]
        if clip.verdict is Verdict.REFUTED:
            runs += [(dict(clip.counterexample.sizes), s) for s in range(3)]
        p = spec.plan(name)
        broken = any(("clip",) in simulator.norm_violations(p, s, random.Random(x), bindings) for s, x in runs)
        assert clip.verdict is (Verdict.REFUTED if broken else Verdict.PROVED), (shape, plans[name], clip.reason)
        decided += 1
    assert decided >= 1


def test_a_checkpoint_over_a_folded_axis_stays_unknown():
    """A checkpoint writer statement over tq, an axis the crossing copy groups span (folded into tp's parts in
    the step model): which rank writes which copy is not modelled, so the checkpoint obligations are unknown,
    never proved on the folded axis's size 1."""
    tensor, k, n_heads = SHAPES["2x3_k3"]
    text = spec_text(tensor, k, {"p": "  override checkpoint: save_rank0 over (tq)\n"}, n_heads)
    save = next(o for o in _report(text, "p").obligations if o.name == "SC checkpoint save")
    assert save.verdict is Verdict.UNKNOWN and "runs of the joint index of tp×tq" in save.reason


def test_the_crossing_copy_group_all_reduce_is_priced_over_its_six_ranks():
    """K = 2 on tp = 3 x tl = 4: one all-reduce of the kv gradient over each copy group of 12/2 = 6 ranks (by
    hand), spanning both axes; a ring over 6 ranks sends 2·(6−1)/6 of the buffer."""
    import sympy

    from placement_logic import costs
    from placement_logic.costs.symbolic import symbol
    from placement_logic.ir import collectives

    tensor = {"tp": 3, "tl": 4}
    p = load_string(spec_text(tensor, 2, {"derived": ""}, 12), "kvjoint.place").plan("derived")
    (c,) = [c for c in collectives.derive(p) if c.payload.tensor == "grads:kv"]
    assert c.axes == ("tp", "tl")
    (s,) = [x for x in costs.derive(p).communication.collectives if x.collective.payload.tensor == "grads:kv"]
    tp, tl = symbol("tp"), symbol("tl")
    assert sympy.simplify(s.group - tp * tl / 2) == 0
    at = {tp: 3, tl: 4}
    assert sympy.simplify(s.bytes_per_device.subs(at) - s.buffer.subs(at) * sympy.Rational(5, 3)) == 0
