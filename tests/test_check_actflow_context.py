"""Context parallelism's attention exchange (ir.actflow region ``context``): the checker against the
concrete ring-attention simulator (tests/simulator_cp.py, every device's position on the whole
mesh) on hand-derived and generated plans, the replayed counterexample with exact numbers, the
diagnostics, the point-to-point rings the overrides move in the cost schedule (hand-derived counts)
and the format round trip."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import simulator_cp
from handcases import violations_at_every_size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A, G = "activations", "activation_grads"
KEYS = {f"GI {A}[context]": ("act", "context"), f"GI {G}[context]": ("grad", "context")}
DP_CP = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R")}
DP_TP_CP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S"), "cp": ("context", "R,R,R,R")}
ACT, GRAD = ("act", "context"), ("grad", "context")


def _with(axes, overrides=()):
    spec, p = plan("p", axes, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


def verdicts(report) -> dict[tuple, Verdict]:
    return {KEYS[o.name]: o.verdict for o in report.obligations if o.name in KEYS}


def simulated(p: ir.Plan) -> set:
    return violations_at_every_size(simulator_cp.violations, p)


HAND = [
    ((), ()),
    # the derived exchange and reduce-scatter stated as they are
    ((ov(A, "gather", "context", ("cp",)), ov(G, "gather", "context", ("cp",)), ov(G, "reduce", "context", ("cp",))), ()),
    # the key/value gradients never summed back to their owners
    ((ov(G, "no_reduce", "context"),), {GRAD}),
    # summed into a copy: the gradient that flows on is the rank's own queries' contributions
    ((ov(G, "reduce_copy", "context"),), {GRAD}),
    # the backward reads only the local block (the saved tensors of the first ring step)
    ((ov(G, "gather", "context", ()),), {GRAD}),
    # no exchange in forward: every query meets its own block only
    ((ov(A, "gather", "context", ()),), {ACT}),
    # the ring built over the data ranks: other samples' blocks
    ((ov(A, "gather", "context", ("dp",)),), {ACT}),
    # the ring over data and context ranks: the right blocks and other samples' too
    ((ov(A, "gather", "context", ("dp", "cp")), ov(G, "reduce", "context", ("dp", "cp"))), {ACT, GRAD}),
    # two passes: every block counted cp times
    ((ov(A, "gather", "context", ("cp", "cp")),), {ACT}),
    ((ov(G, "reduce", "context", ("cp", "cp")),), {GRAD}),
    # Ulysses: the all-to-all over the context ranks (sequence shards -> head shards) and its inverse
    ((ov(A, "all_to_all", "context", ("cp",)), ov(G, "all_to_all", "context", ("cp",))), ()),
    ((ov(A, "all_to_all", "context", ("cp",)),), ()),
    # over the data ranks too: heads of other samples' positions meet (DeepSpeed-Ulysses over the wrong group)
    ((ov(A, "all_to_all", "context", ("dp", "cp")), ov(G, "all_to_all", "context", ("dp", "cp"))), {ACT, GRAD}),
    ((ov(G, "all_to_all", "context", ("dp",)),), {GRAD}),
    # no all-to-all: every rank attends over its own position only
    ((ov(A, "all_to_all", "context", ()),), {ACT}),
    # two passes: the second splits the heads each rank holds again, stacking them along the sequence; a
    # third does not put them back (a real all-to-all the same way is no involution)
    ((ov(A, "all_to_all", "context", ("cp", "cp")),), {ACT}),
    ((ov(A, "all_to_all", "context", ("cp", "cp", "cp")),), {ACT}),
    ((ov(G, "all_to_all", "context", ("cp", "cp", "cp")),), {GRAD}),
    ((ov(A, "all_to_all", "context", ("cp", "dp", "cp")),), {ACT}),
    # the key/value gradients come back with the inverse all-to-all: a reduce-scatter on top sums wrong rows
    ((ov(G, "all_to_all", "context", ("cp",)), ov(G, "reduce", "context", ("cp",))), {GRAD}),
    ((ov(G, "all_to_all", "context", ("cp",)), ov(G, "no_reduce", "context")), ()),
    # the last statement of a slot wins: the ring's gather after the all-to-all
    ((ov(G, "all_to_all", "context", ("cp",)), ov(G, "gather", "context", ("cp",))), ()),
]


@pytest.mark.parametrize("stated,expected", HAND)
def test_hand_cases_checker_and_simulator(stated, expected):
    spec, p = _with(DP_CP, stated)
    assert simulated(p) == set(expected)
    v = verdicts(check_plan(SESSION, spec, p, {}))
    assert set(v) == set(KEYS.values())
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == set(expected)
    assert all(x is Verdict.PROVED for k, x in v.items() if k not in expected)


@hs.composite
def context_plans(draw):
    axes = DP_TP_CP if draw(hs.booleans()) else DP_CP
    lists = hs.lists(hs.sampled_from(list(axes)), max_size=3).map(tuple)
    cands = hs.one_of(
        hs.builds(lambda t, a: ov(t, "gather", "context", a), hs.sampled_from((A, G)), lists),
        hs.builds(lambda a: ov(G, "reduce", "context", a), lists),
        hs.builds(lambda t, a: ov(t, "all_to_all", "context", a), hs.sampled_from((A, G)), lists),
        hs.sampled_from((ov(G, "no_reduce", "context"), ov(G, "reduce_copy", "context"))))
    return _with(axes, draw(hs.lists(cands, max_size=3)))


@settings(max_examples=examples(25), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(context_plans())
def test_checker_agrees_with_the_ring_simulator(generated):
    spec, p = generated
    v = verdicts(check_plan(SESSION, spec, p, {}))
    found = simulated(p)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, p.overrides)


def test_refutation_replays_the_missing_gradient_sum():
    spec, p = _with(DP_CP, [ov(G, "no_reduce", "context")])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == f"GI {G}[context]")
    cex = ob.counterexample
    # cp = 2: q = [2, 3], k = [1, 3], dy = [1/2, 1]; Σ dy·q = 1 + 3 = 4, so dv_0 = k_0 · 4 = 4; rank 0
    # keeps its own contributions k_j · dy_0 q_0 = [1, 3] for both blocks
    assert "on rank 0 of cp = [1, 3], single-device = [4]" in cex.equation
    assert "reduce-scatter of the key/value gradients" in cex.diagnosis[0] and "no_reduce" in cex.diagnosis[0]


def test_refutation_replays_the_wrong_ring():
    spec, p = _with(DP_CP, [ov(A, "gather", "context", ("dp",))])
    # sizes pinned: the solver may otherwise pick dp = 1, cp = 2 (rank 0 of cp then sees its own block only)
    ob = next(o for o in check_plan(SESSION, spec, p, {"dp": 2, "cp": 1, "microbatches": 1}).obligations
              if o.name == f"GI {A}[context]")
    # dp = 2 (cp = 1): rank r holds sample r with k·v = [1·2, 3·5] = [2, 15]; rank 0 sums both
    # samples' blocks: y = 2 · 17 = 34, its own sample alone 2 · 2 = 4
    assert "on rank 0 of dp = [34], single-device = [4]" in ob.counterexample.equation
    assert "non-context axis dp" in ob.counterexample.diagnosis[0]


def test_refutation_replays_the_ulysses_all_to_all_over_the_data_ranks():
    spec, p = _with(DP_CP, [ov(A, "all_to_all", "context", ("dp", "cp"))])
    ob = next(o for o in check_plan(SESSION, spec, p, {"dp": 2, "cp": 1, "microbatches": 1}).obligations
              if o.name == f"GI {A}[context]")
    # dp = 2, two heads (head h adds 10h): rank 0's sample has (q, k, v) = (2, 1, 2), (12, 11, 12), rank 1's
    # (3, 3, 5), (13, 13, 15). The all-to-all gives rank 0 head 0 of both samples: Σ k·v = 2 + 15 = 17, its
    # output 2 · 17 = 34; rank 1 head 1: Σ = 132 + 195 = 327, 12 · 327 = 3924, sent back to rank 0.
    # Alone: 2·1·2 = 4 and 12·11·12 = 1584.
    assert "on rank 0 of dp = [34, 3924], single-device = [4, 1584]" in ob.counterexample.equation
    assert "Ulysses' all-to-all" in ob.counterexample.diagnosis[0] and "non-context axis dp" in ob.counterexample.diagnosis[0]


def test_refutation_replays_the_reduce_scatter_after_ulysses():
    spec, p = _with(DP_CP, [ov(G, "all_to_all", "context", ("cp",)), ov(G, "reduce", "context", ("cp",))])
    ob = next(o for o in check_plan(SESSION, spec, p, {"dp": 1, "cp": 2, "microbatches": 1}).obligations
              if o.name == f"GI {G}[context]")
    # cp = 2, two heads: the inverse all-to-all leaves rank r with its own position's dv for both heads;
    # head 0: k = [1, 3], dy·q = [1, 3] (Σ 4), dv = [4, 12]; head 1: k = [11, 13], dy·q = [10.5·12, 11·13]
    # = [126, 143] (Σ 269), dv = [2959, 3497]. Rank 0 holds [4, 2959], rank 1 [12, 3497]; the reduce-scatter
    # sums them, [16, 6456], and keeps one element each: rank 0 [16]
    assert "on rank 0 of cp = [16], single-device = [4, 2959]" in ob.counterexample.equation


@pytest.mark.parametrize("o,words", [
    (ov(A, "reduce", "context", ("cp",)), "key/value exchange"),
    (ov(G, "assert_partial", "context", ("cp",)), "key/value exchange"),
    (ov(A, "dispatch", "context", ("cp",)), "key/value exchange"),
])
def test_statements_that_change_nothing(o, words):
    spec, p = _with(DP_CP, [o])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == Code.OVERRIDE_NO_EFFECT and words in e.value.diagnostics[0].message


@pytest.mark.parametrize("o", [ov(A, "all_to_all", None, ("tp",)), ov(G, "all_to_all", "attention", ("tp",)),
                               ov(A, "all_to_all", "experts", ("tp",))])
def test_ulysses_outside_the_context_region_is_pl506(o):
    spec, p = _with(DP_TP_CP, [o])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == Code.OVERRIDE_NO_EFFECT and "Ulysses" in e.value.diagnostics[0].message


def test_no_context_axis_is_pl506():
    spec, p = plan("p", {"dp": DP_CP["dp"]}, overrides=(ov(G, "no_reduce", "context"),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, replace(spec, plans=(p,)), p, {})
    assert e.value.diagnostics[0].code == Code.OVERRIDE_NO_EFFECT and "no context-parallel axis" in e.value.diagnostics[0].message


def test_a_statement_without_a_region_leaves_the_context_exchange_alone():
    # `activation_grads: no_reduce` names no region: it states the tensor-parallel regions' slot,
    # not context parallelism's (which is stated with [context] only)
    spec, p = _with(DP_TP_CP, [ov(G, "no_reduce")])
    v = verdicts(check_plan(SESSION, spec, p, {}))
    assert v == {ACT: Verdict.PROVED, GRAD: Verdict.PROVED}


def _val(v, sizes: dict) -> int:
    if isinstance(v, ir.Const):
        return v.value
    if isinstance(v, ir.Sym):
        return sizes[v.name]
    a = [_val(x, sizes) for x in v.args]
    out = a[0]
    for x in a[1:]:
        out = {"*": out * x, "-": out - x, "+": out + x, "/": out / x}[v.op]
    return out


def _p2p(p: ir.Plan, sizes: dict) -> dict:
    out: dict = {}
    for c in collectives.derive(p):
        if c.kind.value == "p2p" and c.state is ir.State.ACTIVATIONS:
            key = (c.phase.value, c.axes)
            out[key] = out.get(key, 0) + _val(c.count, sizes)
    return {k: v for k, v in out.items() if v}


def test_costs_follow_the_overrides():
    # L = 10 layers, m = 3 microbatches, dp = 4, cp = 3: the ring has cp - 1 = 2 steps per layer per
    # microbatch: 2·10·3 = 60 in forward, twice that in backward (K,V again and their gradients)
    sizes = {"L": 10, "m": 3, "dp": 4, "cp": 3}
    _, base = _with(DP_CP)
    _, gone = _with(DP_CP, [ov(G, "no_reduce", "context")])
    _, moved = _with(DP_CP, [ov(A, "gather", "context", ("dp",))])
    _, wide = _with(DP_CP, [ov(G, "reduce", "context", ("dp", "cp"))])
    assert _p2p(base, sizes) == {("forward", ("cp",)): 60, ("backward", ("cp",)): 120}
    assert _p2p(gone, sizes) == {("forward", ("cp",)): 60, ("backward", ("cp",)): 60}
    # a ring over dp = 4: 3 steps per layer per microbatch = 90
    assert _p2p(moved, sizes) == {("forward", ("dp",)): 90, ("backward", ("cp",)): 120}
    # the gradients' ring over dp·cp = 12 devices: 11·30 = 330
    assert _p2p(wide, sizes) == {("forward", ("cp",)): 60, ("backward", ("cp",)): 60,
                                 ("backward", ("dp", "cp")): 330}


def test_ulysses_costs_hand_derived():
    # examples/safe/ulysses_group_world.place: L = 32, m = 4, s = 65536, b = 2, h = 4096, heads = kv_heads =
    # 32, bf16 (2 bytes), cp = 4, no tensor axis. Per layer and microbatch each all-to-all pair moves
    # (cp - 1)/cp of s/cp·b·h·(2 + 2·32/32)·2 = 16384·2·4096·4·2 = 1073741824 bytes: 3/4 of it = 805306368,
    # times 32·4 = 128 = 103079215104 bytes in forward and as many in backward; the ring's steps are gone.
    import json
    import subprocess
    import sys

    path = Path(__file__).parent.parent / "examples/safe/ulysses_group_world.place"
    out = subprocess.run([sys.executable, "-m", "placement_logic", "cost", str(path), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = [r for r in json.loads(out)["plans"][0]["communication"]["collectives"] if r["axes"] == ["cp"]]
    a2a = {r["phase"]: r["bytes_per_device"] for r in rows if r["kind"] == "all_to_all"}
    assert a2a == {"forward": 103079215104, "backward": 103079215104}
    assert all(r["bytes_per_device"] == 0 for r in rows if r["kind"] == "p2p")
    # over (dp, cp) (examples/bugs/ulysses_group_world.place): a group of 8, 7/8 of the same payload
    path = Path(__file__).parent.parent / "examples/bugs/ulysses_group_world.place"
    out = subprocess.run([sys.executable, "-m", "placement_logic", "cost", str(path), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = [r for r in json.loads(out)["plans"][0]["communication"]["collectives"] if r["kind"] == "all_to_all"]
    assert {(r["phase"], tuple(r["axes"])): r["bytes_per_device"] for r in rows} == {
        ("forward", ("dp", "cp")): 1073741824 * 7 // 8 * 128, ("backward", ("dp", "cp")): 1073741824 * 7 // 8 * 128}


@pytest.mark.parametrize("stmt", [
    "override activations[context]: all_to_all over (cp)", "override activation_grads[context]: all_to_all over (dp, cp)",
    "override activations[context]: gather over (cp)", "override activation_grads[context]: gather over ()",
    "override activation_grads[context]: reduce over (dp, cp)", "override activation_grads[context]: no_reduce",
])
def test_statements_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    src = (Path(__file__).parent.parent / "examples/safe/cp_dkv_not_accumulated.place").read_text()
    body = [ln for ln in src.splitlines() if not ln.startswith("  override")]
    src = "\n".join(body[:-1] + [f"  {stmt}", "}"]) + "\n"
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :  ").replace("(cp)", "( cp )"))
    assert format_source(messy, "x.place") == src
