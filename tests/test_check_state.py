"""Initial state, optimizer identity and RNG state: the checker against the concrete simulator
(tests/simulator_state.py, which enumerates devices and draws real masks) on generated plans, and
hand-derived cases, including the overrides that change nothing (PL506)."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
import simulator_state
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
KEYS = {"SC params initial": ("init",), "SC optimizer holds the params": ("stale",),
        "SC rng split regions": ("rng_split",), "SC rng replicated region": ("rng_replicated",),
        "SC rng recompute": ("rng_recompute",)}
ROLES = ("data", "tensor", "context", "pipeline", "expert")


def verdicts(report) -> dict[tuple, Verdict]:
    return {KEYS[o.name]: o.verdict for o in report.obligations if o.name in KEYS}


def simulated(p: ir.Plan) -> set:
    found: set = set()
    for sizes in product((1, 2, 3), repeat=len(p.mesh.names)):
        found |= simulator_state.state_violations(p, dict(zip(p.mesh.names, sizes)))
    return found


def _with(axes, overrides=(), sp=False, recompute=ir.Recompute.NONE, experts=1):
    spec, p = plan("p", axes, sp=sp, overrides=tuple(overrides), experts=experts)
    p = replace(p, recompute=recompute)
    return replace(spec, plans=(p,)), p


@hs.composite
def state_plans(draw):
    k = draw(hs.integers(1, 2))
    names = ["a", "b"][:k]
    axes = {}
    for n in names:
        role = draw(hs.sampled_from(ROLES))
        params = draw(hs.sampled_from(("R", "S", "S*")))
        axes[n] = (role, f"{params},{params},{draw(hs.sampled_from(('R', 'S')))},R")
    sp = any(r == "tensor" for r, _ in axes.values()) and draw(hs.booleans())
    recompute = draw(hs.sampled_from(list(ir.Recompute)))
    axis_lists = hs.lists(hs.sampled_from(names), min_size=1, max_size=2).map(tuple)
    group = hs.sampled_from([None, "dense", "norms", "all"])
    candidates = hs.one_of(
        hs.builds(lambda g, a: ov("params", "no_init_broadcast", g, a), group, axis_lists),
        hs.builds(lambda g: ov("optimizer", "stale_params", g), group),
        hs.builds(lambda v, a: ov("rng", v, None, a), hs.sampled_from(("same", "advance", "restored_from_one")),
                  axis_lists),
        hs.just(ov("rng", "not_preserved")),
    )
    overrides = draw(hs.lists(candidates, max_size=2))
    experts = 4 if any(r == "expert" for r, _ in axes.values()) else 1
    return _with(axes, overrides, sp, recompute, experts)


@pytest.mark.slow
@settings(max_examples=examples(120), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(state_plans())
def test_checker_agrees_with_the_state_simulator(generated):
    spec, p = generated
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError:
        assume(False)  # an override that changes nothing (PL506)
    v = verdicts(report)
    assert set(v) == set(KEYS.values())
    found = simulated(p)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, p.placements, p.overrides, p.sequence_parallel, p.recompute)


DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
HSDP = {"rep": ("data", "R,R,R,R"), "shard": ("data", "S*,S,S,R")}
EP = {"dp": ("data", "R,R,R,R"), "ep": ("expert", "S,S,S,R")}
FULL = ir.Recompute.FULL

# (axes, overrides, sp, recompute, the conditions violated, derived by hand)
HAND = [
    (DDP_TP, (), False, ir.Recompute.NONE, set()),
    (DDP_TP, (ov("params", "no_init_broadcast", None, ("dp",)),), False, ir.Recompute.NONE, {("init",)}),
    # dense and embedding are split over tp, but the norms and biases are copies there
    (DDP_TP, (ov("params", "no_init_broadcast", None, ("tp",)),), False, ir.Recompute.NONE, {("init",)}),
    (HSDP, (ov("params", "no_init_broadcast", None, ("rep", "shard")),), False, ir.Recompute.NONE, {("init",)}),
    (DDP_TP, (ov("optimizer", "stale_params"),), False, ir.Recompute.NONE, {("stale",)}),
    (DDP_TP, (ov("rng", "same", None, ("tp",)),), False, ir.Recompute.NONE, {("rng_split",)}),
    (DDP_TP, (ov("rng", "same", None, ("dp",)),), False, ir.Recompute.NONE, set()),  # dp ranks may share masks
    (DDP_TP, (ov("rng", "advance", None, ("tp",)),), False, ir.Recompute.NONE, {("rng_replicated",)}),
    (DDP_TP, (ov("rng", "advance", None, ("tp",)),), True, ir.Recompute.NONE, set()),  # SP: nothing replicated
    (DDP_TP, (ov("rng", "advance", None, ("dp",)),), False, ir.Recompute.NONE, set()),
    (DDP_TP, (ov("rng", "restored_from_one", None, ("tp",)),), True, ir.Recompute.NONE, {("rng_split",)}),
    (DDP_TP, (ov("rng", "restored_from_one", None, ("dp",)),), False, ir.Recompute.NONE, set()),
    (EP, (ov("rng", "restored_from_one", None, ("ep",)),), False, ir.Recompute.NONE, {("rng_split",)}),
    (DDP_TP, (ov("rng", "not_preserved"),), False, FULL, {("rng_recompute",)}),
    (DDP_TP, (), False, FULL, set()),
]


@pytest.mark.parametrize("axes,overrides,sp,recompute,expected", HAND)
def test_hand_cases_checker_and_simulator(axes, overrides, sp, recompute, expected):
    spec, p = _with(axes, overrides, sp, recompute, experts=4 if "ep" in axes else 1)
    assert simulated(p) == expected
    v = verdicts(check_plan(SESSION, spec, p, {}))
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == expected
    assert all(x is Verdict.PROVED for k, x in v.items() if k not in expected)


@pytest.mark.parametrize("axes,o,recompute,words", [
    (HSDP, ov("params", "no_init_broadcast", None, ("shard",)), ir.Recompute.NONE, "split or sharded there"),
    (DDP_TP, ov("params", "no_init_broadcast", "dense", ("tp",)), ir.Recompute.NONE, "split or sharded there"),
    (DDP_TP, ov("rng", "not_preserved"), ir.Recompute.NONE, "recomputes no activations"),
    (DDP_TP, ov("rng", "same", None, ()), ir.Recompute.NONE, "names no axis"),
    (DDP_TP, ov("rng", "advance", "dense", ("tp",)), ir.Recompute.NONE, "not a parameter group's"),
])
def test_overrides_that_change_nothing_are_pl506(axes, o, recompute, words):
    spec, p = _with(axes, (o,), recompute=recompute)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL506" and words in d.message


def test_refutations_replay_with_two_ranks_and_a_cause():
    spec, p = _with(DDP_TP, (ov("params", "no_init_broadcast", None, ("dp",)), ov("rng", "advance", None, ("tp",))))
    report = check_plan(SESSION, spec, p, {})
    by = {o.name: o for o in report.obligations}
    init = by["SC params initial"].counterexample
    assert dict(init.sizes)["dp"] >= 2 and "no broadcast" in init.diagnosis[0]
    a, b = dict(init.values)["initial value A"], dict(init.values)["initial value B"]
    assert a != b
    rep = by["SC rng replicated region"].counterexample
    assert dict(rep.sizes)["tp"] >= 2 and "offset" in rep.diagnosis[0]
    assert dict(rep.values)["default state A"] != dict(rep.values)["default state B"]


# --------------------------------------------------------------------------- the micro-step of the sync

EARLY = ov("grads", "sync_before_last")
SYNC_KEYS = ("GI grads[", "SC grads[", "SC clip_norm", "SC overflow")


def sync_verdicts(report) -> dict[tuple, Verdict]:
    out = {}
    for o in report.obligations:
        if o.name.startswith("GI grads[") and "] " not in o.name:
            out[("gi", o.name[9:-1])] = o.verdict
        elif o.name.startswith("SC grads["):
            out[("replica", o.name[9:-1])] = o.verdict
        elif o.name in ("SC clip_norm", "SC overflow"):
            out[(o.name[3:].replace("clip_norm", "clip"),)] = o.verdict
    return out


def early_simulated(p: ir.Plan, seed: int) -> set:
    import random

    rng = random.Random(seed)
    found: set = set()
    for sizes in product((1, 2, 3), repeat=len(p.mesh.names)):
        for m in (1, 2, 3):
            found |= simulator_state.early_sync_violations(p, {**dict(zip(p.mesh.names, sizes)), "microbatches": m},
                                                           rng)
    return found


@hs.composite
def sync_plans(draw):
    k = draw(hs.integers(1, 2))
    axes = {}
    for n in ["a", "b"][:k]:
        params = draw(hs.sampled_from(("R", "S*")))
        axes[n] = (draw(hs.sampled_from(ROLES)), f"{params},{draw(hs.sampled_from(('R', 'S')))},"
                                                  f"{draw(hs.sampled_from(('R', 'S')))},R")
    experts = 4 if any(r == "expert" for r, _ in axes.values()) else 1
    return axes, experts


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(sync_plans(), hs.integers(0, 10**6))
def test_early_sync_agrees_with_the_state_simulator(generated, seed):
    """On plans whose gradient, replica, norm and overflow obligations are proved, the early sync
    refutes exactly what the simulator's accumulation shows broken."""
    axes, experts = generated
    spec, p = _with(axes, experts=experts)
    try:
        base = sync_verdicts(check_plan(SESSION, spec, p, {}))
        assume(all(v is Verdict.PROVED for v in base.values()))
        spec, p = _with(axes, (EARLY,), experts=experts)
        v = sync_verdicts(check_plan(SESSION, spec, p, {}))
    except DiagnosticError:
        assume(False)  # PL506: nothing is all-reduced once per step
    found = early_simulated(p, seed)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, axes)


@pytest.mark.parametrize("axes,expected", [
    ({"dp": ("data", "R,R,R,R")}, {"dense", "norms", "biases", "embedding"}),
    (DDP_TP, {"dense", "norms", "biases", "embedding"}),
    ({"dp": ("data", "R,S,R,R")}, {"dense", "norms", "biases", "embedding"}),  # ZeRO-1: grads all-reduced
])
def test_early_sync_refutes_every_synced_group(axes, expected):
    spec, p = _with(axes, (EARLY,))
    report = check_plan(SESSION, spec, p, {})
    v = sync_verdicts(report)
    assert {k[1] for k, x in v.items() if k[0] == "gi" and x is Verdict.REFUTED} == expected
    assert v[("clip",)] is Verdict.REFUTED and v[("overflow",)] is Verdict.REFUTED
    ob = next(o for o in report.obligations if o.name == "GI grads[dense] over microbatches")
    cex = ob.counterexample
    assert cex is not None and dict(cex.sizes)["microbatches"] >= 2 and "micro-step 1" in cex.diagnosis[0]
    assert simulator_state.early_sync_violations(p, {**{a: 2 for a in axes}, "microbatches": 2},
                                                 __import__("random").Random(0)) >= {("gi", g) for g in expected}


@pytest.mark.parametrize("axes,extra,group,words", [
    ({"dp": ("data", "R,S,S,R")}, (), None, "every reduced gradient is sharded there"),  # ZeRO-2
    ({"dp": ("data", "R,R,R,R")}, (ov("grads", "reduce_every_microbatch"),), None, "after every micro-step"),
    ({"dp": ("data", "R,R,R,R")}, (), "dense", "for 'dense' alone"),
])
def test_early_sync_that_changes_nothing_is_pl506(axes, extra, group, words):
    spec, p = _with(axes, extra + (ov("grads", "sync_before_last", group),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL506" and words in e.value.diagnostics[0].message
