"""Gradient bucket layout per rank (``override grads[G]: bucket_order over (AXES)``): the checker
against the concrete simulator (tests/simulator_buckets.py, which lays real buffers out per rank
and runs the collectives by offset) on generated plans and hand-derived cases, the replays'
numbers against hand arithmetic, the overrides that change nothing (PL506), and fmt."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
import simulator_buckets
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
NAME = "GI grads bucket layout"
ROLES = ("data", "tensor", "context", "pipeline", "expert")


def verdict(report) -> Verdict:
    return next(o.verdict for o in report.obligations if o.name == NAME)


def simulated(p: ir.Plan) -> bool:
    return any(simulator_buckets.bucket_violations(p, dict(zip(p.mesh.names, sizes)))
               for sizes in product((1, 2, 3), repeat=len(p.mesh.names)))


def _with(axes, overrides=(), sp=False, tied=False):
    spec, p = plan("p", axes, sp=sp, tied=tied, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


@hs.composite
def bucket_plans(draw):
    k = draw(hs.integers(1, 2))
    names = ["a", "b"][:k]
    axes = {}
    for n in names:
        role = draw(hs.sampled_from(ROLES))
        params = draw(hs.sampled_from(("R", "S", "S*")))
        axes[n] = (role, f"{params},{draw(hs.sampled_from(('R', 'S')))},{draw(hs.sampled_from(('R', 'S')))},R")
    sp = any(r == "tensor" for r, _ in axes.values()) and draw(hs.booleans())
    tied = draw(hs.booleans())
    group = hs.sampled_from([None, "dense", "norms", "embedding", "all"])
    axis_lists = hs.lists(hs.sampled_from(names), min_size=1, max_size=2).map(tuple)
    overrides = draw(hs.lists(hs.builds(lambda g, a: ov("grads", "bucket_order", g, a), group, axis_lists),
                              max_size=2))
    return _with(axes, overrides, sp, tied)


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(bucket_plans())
def test_checker_agrees_with_the_bucket_simulator(generated):
    spec, p = generated
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError:
        assume(False)  # an override that changes nothing (PL506) or a placement the step refuses
    assert (verdict(report) is Verdict.REFUTED) == simulated(p), (p.placements, p.overrides)


DDP = {"dp": ("data", "R,R,R,R")}
ZERO2_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,R")}
DDP_PP = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,R")}
DISTOPT_PP = {"dp": ("data", "R,S,S,R"), "pp": ("pipeline", "S,S,S,R")}
BO = "bucket_order"

# (axes, overrides, sp, tied, refuted: derived by hand)
HAND = [
    (DDP, (), False, False, False),
    (DDP, (ov("grads", BO, None, ("dp",)),), False, False, True),  # a DDP all-reduce by offset
    (ZERO2_TP, (ov("grads", BO, "dense", ("dp",)),), False, False, True),  # a ZeRO-2 reduce-scatter
    (ZERO2_TP, (ov("grads", BO, "norms", ("tp",)),), True, False, True),  # SP: norms all-reduced over tp
    # the tied embedding at different offsets on the stages, reduce-scattered over dp before the tie's
    # all-reduce (Megatron-LM's distributed optimizer); after an all-reduce over dp it is harmless (PL506 below)
    (DISTOPT_PP, (ov("grads", BO, "embedding", ("pp",)),), False, True, True),
    (DISTOPT_PP, (), False, True, False),
]


@pytest.mark.parametrize("axes,overrides,sp,tied,refuted", HAND)
def test_hand_cases_checker_and_simulator(axes, overrides, sp, tied, refuted):
    spec, p = _with(axes, overrides, sp, tied)
    assert simulated(p) == refuted
    assert verdict(check_plan(SESSION, spec, p, {})) is (Verdict.REFUTED if refuted else Verdict.PROVED)


@pytest.mark.parametrize("axes,o,sp,tied,words", [
    (DDP_PP, ov("grads", BO, "embedding", ("pp",)), False, True, "all-reduced whole over the data axes"),
    (ZERO2_TP, ov("grads", BO, "dense", ("tp",)), False, False, "not summed over tp by a bucketed collective"),
    (DDP_PP, ov("grads", BO, "dense", ("pp",)), False, True, "not summed over pp"),
    (DDP, ov("grads", BO, None, ()), False, False, "names no axis"),
    (DDP, ov("grads", BO, "experts", ("dp",)), False, False, "no 'experts' parameter group"),
])
def test_overrides_that_change_nothing_are_pl506(axes, o, sp, tied, words):
    spec, p = _with(axes, (o,), sp, tied)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL506" and words in d.message


def test_flat_replay_pairs_two_tensors_by_offset():
    spec, p = _with(DDP, (ov("grads", BO, "dense", ("dp",)),))
    ce = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == NAME).counterexample
    n = dict(ce.sizes)["dp"]
    assert n >= 2
    v = dict(ce.values)
    assert v["layout A"].startswith("P") and v["layout B"].startswith("Q")
    # rank r: P = (r+1)·[1, 2], Q = (r+1)·[10, 20, 30]; offset 0 is P[0] on rank 0 and Q[0] elsewhere
    got = 1 + sum(10 * (r + 1) for r in range(1, n))
    want = sum(r + 1 for r in range(n))
    assert f"= {got} " in ce.equation and ce.equation.endswith(f"= {want}")
    assert "different parameter orders" in ce.diagnosis[0]


def test_tie_replay_adds_a_reduced_shard_to_an_unreduced_copy():
    spec, p = _with(DISTOPT_PP, (ov("grads", BO, "embedding", ("pp",)),), tied=True)
    ce = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == NAME).counterexample
    n = dict(ce.sizes)["dp"]
    assert n >= 2 and dict(ce.sizes)["pp"] >= 2
    # first stage: rank d holds d+1; last stage 10(d+1); dp rank 0 owns E[0] on the first stage only
    reduced, local = sum(d + 1 for d in range(n)), 10
    assert f"= {reduced} + {local} = {reduced + local} " in ce.equation
    assert ce.equation.endswith(f"= {reduced + sum(10 * (d + 1) for d in range(n))}")
    assert "before the reduce-scatter" in ce.diagnosis[0]


def test_bucket_order_formats_round_trip():
    src = ("model {\n  params = 1e9\n}\n\nmesh {\n  dp = 8\n}\n\nplan p {\n  dp: ddp\n"
           "  override grads[dense]:   bucket_order over(dp)\n}\n")
    out = format_source("from std.data import ddp\n\n" + src, "x.place")
    assert "  override grads[dense]: bucket_order over (dp)\n" in out
    assert format_source(out, "x.place") == out
