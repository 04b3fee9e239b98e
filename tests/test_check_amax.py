"""The fp8 amax read from each rank's own maximum (check.amax: ``amax[g]: local over (AXES)``): the
checker's verdicts on ``SC amax`` against the independent simulator (tests/simulator_amax.py) and
hand-derived answers, the replayed scales recomputed by hand, located input errors and fmt."""

from __future__ import annotations

import random

import pytest
import simulator_amax
from handcases import obligation, obligation_or_skip, simulator_finds
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
DDP_PP = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}
DDP_TPR = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "R,R,R,R")}

# (axes, sp, overrides, pinned, the obligation, hand-derived: does it hold). By hand: over a data axis the
# ranks hold different tokens, over a tensor axis different weight slices (or, sequence-parallel, different
# token slices); two such ranks see different maxima, so their scales 448 / amax differ unless the axis has
# one rank.
CASES = [
    (DDP_TP, False, (ov("amax", "local", None, ("tp",)),), {}, "SC amax", False),
    (DDP_TP, False, (ov("amax", "local", None, ("tp",)),), {"tp": 1}, "SC amax", True),
    (DDP_TP, False, (ov("amax", "local", None, ("dp",)),), {}, "SC amax", False),
    (DDP_TP, True, (ov("amax", "local", "dense", ("dp", "tp")),), {"dp": 1}, "SC amax[dense]", False),
    (DDP_TP, False, (ov("amax", "local", None, ("dp",)),), {"dp": 1}, "SC amax", True),
    (DDP_PP, False, (ov("amax", "local", None, ("dp",)),), {}, "SC amax", False),
    (DDP_TPR, True, (ov("amax", "local", None, ("tp",)),), {}, "SC amax", False),  # replicated weights, SP slices
    # the reduction's own axes (the fp8_group): the data axis alone leaves the tensor slices apart
    (DDP_TP, False, (ov("amax", "reduce", None, ("dp",)),), {}, "SC amax", False),
    (DDP_TP, False, (ov("amax", "reduce", None, ("dp", "tp")),), {}, "SC amax", True),
    (DDP_TPR, False, (ov("amax", "reduce", None, ("dp",)),), {}, "SC amax", True),  # whole weights, no SP
    (DDP_PP, False, (ov("amax", "reduce", None, ()),), {"dp": 1}, "SC amax", True),
]


def _key(name: str, p) -> set:
    return {("amax", g) for g in ([name[len("SC amax["):-1]] if "[" in name else ["dense"])}


@pytest.mark.parametrize("axes,sp,overrides,pinned,name,ok", CASES, ids=[str(i) for i in range(len(CASES))])
def test_agrees_with_the_simulator_and_by_hand(axes, sp, overrides, pinned, name, ok):
    spec, p = plan("p", axes, sp=sp, overrides=overrides)
    ob = obligation(SESSION, spec, p, pinned, name)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (ob.verdict, ob.reason)
    found = simulator_finds(p, pinned, 6, lambda p, at, rng: simulator_amax.violations(p, at, rng) & _key(name, p))
    assert found is (not ok)


def test_the_replayed_scales():
    """amax 2 on rank A, 1 on rank B: 448 / 2 = 224 and 448 / 1 = 448; the global amax 2 gives 224, and B's
    element 1 cast with 448 and read back with 1/224 is 2."""
    spec, p = plan("p", DDP_TP, sp=True, overrides=(ov("amax", "local", None, ("tp",)),))
    cex = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC amax").counterexample
    assert "224 on (dp=0, tp=0) and 448 on (dp=0, tp=1)" in cex.equation, cex.equation
    assert "uses 224 on every piece" in cex.equation
    assert "becomes 2;" in cex.notes[0], cex.notes


def _random_plans(n: int):
    rng = random.Random(7)
    out = []
    while len(out) < n:
        roles = [rng.choice(["data", "tensor", "pipeline", "context"]) for _ in range(2)]
        axes = {f"a{i}": (r, rng.choice(["S,S,S,S", "R,R,R,R"]) if r == "tensor" else
                          "S,S,S,S" if r == "pipeline" else "R,R,R,R") for i, r in enumerate(roles)}
        named = tuple(a for a in axes if rng.random() < 0.6) or (next(iter(axes)),)
        verb = rng.choice(["local", "reduce"])
        out.append((axes, rng.random() < 0.3, (ov("amax", verb, None, named),)))
    return out


@pytest.mark.parametrize("axes,sp,overrides", _random_plans(20), ids=[str(i) for i in range(20)])
def test_random_plans_agree_with_the_simulator(axes, sp, overrides):
    spec, p = plan("p", axes, sp=sp, overrides=overrides)
    ob = obligation_or_skip(SESSION, spec, p, "SC amax")
    found = simulator_finds(p, {}, 6, simulator_amax.violations)
    assert (ob.verdict is Verdict.REFUTED) is found, (axes, sp, overrides, ob.verdict)


# Two statements for one group hold together in any order (the checker and the simulator read them so): the
# reduction over the reduce statement's axes (the group's own, else those for every group), less the local ones.
# By hand, DDP_TP without sequence parallelism: dense's pieces differ over dp (tokens) and tp (weight slices).
TWO = [
    # reduced over dp, local on tp: tp's slices are cast apart, in either order
    ((ov("amax", "reduce", "dense", ("dp",)), ov("amax", "local", "dense", ("tp",))), "SC amax[dense]", False),
    ((ov("amax", "local", "dense", ("tp",)), ov("amax", "reduce", "dense", ("dp",))), "SC amax[dense]", False),
    # the group's own reduction over both axes beside one over dp for every group: dense is reduced over both
    ((ov("amax", "reduce", None, ("dp",)), ov("amax", "reduce", "dense", ("dp", "tp"))), "SC amax[dense]", True),
    ((ov("amax", "reduce", "dense", ("dp", "tp")), ov("amax", "reduce", None, ("dp",))), "SC amax[dense]", True),
    # the group's own reduction over dp alone beside one over both for every group: tp left out
    ((ov("amax", "reduce", None, ("dp", "tp")), ov("amax", "reduce", "dense", ("dp",))), "SC amax[dense]", False),
    # local on dp for every group, the group's reduction over tp: dp left out
    ((ov("amax", "local", None, ("dp",)), ov("amax", "reduce", "dense", ("tp",))), "SC amax[dense]", False),
]


@pytest.mark.parametrize("overrides,name,ok", TWO, ids=[str(i) for i in range(len(TWO))])
def test_two_statements_for_one_group_in_either_order(overrides, name, ok):
    spec, p = plan("p", DDP_TP, overrides=overrides)
    assert obligation(SESSION, spec, p, {}, name).verdict is (Verdict.PROVED if ok else Verdict.REFUTED)
    found = simulator_finds(p, {}, 6, lambda p, at, rng: simulator_amax.violations(p, at, rng) & _key(name, p))
    assert found is (not ok)


@pytest.mark.parametrize("first,second", [
    ("override amax: local over (tp)", "override amax: reduce over (dp, tp)"),
    ("override amax: reduce over (dp, tp)", "override amax: local over (tp)"),
    ("override amax[dense]: local over (tp)", "override amax: reduce over (tp)"),
    ("override amax: local over (dp)", "override amax[dense]: reduce over (dp)"),
])
def test_an_axis_both_local_and_reduced_is_pl271_at_the_later_statement(tmp_path, capsys, first, second):
    f = tmp_path / "a.place"
    f.write_text(_place(f"{first}\n  {second}"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  " + second) + 1
    assert f"{f}:{line}:3: error:" in err and "[PL271]" in err and "both left out" in err, err
    assert "Traceback" not in err


def _two_statement_plans(n: int):
    rng = random.Random(11)
    out = []
    while len(out) < n:
        roles = [rng.choice(["data", "tensor", "context"]) for _ in range(2)]
        axes = {f"a{i}": (r, rng.choice(["S,S,S,S", "R,R,R,R"]) if r == "tensor" else "R,R,R,R")
                for i, r in enumerate(roles)}
        stmts = tuple(ov("amax", rng.choice(["local", "reduce"]), rng.choice([None, "dense"]),
                         tuple(a for a in axes if rng.random() < 0.5) or (rng.choice(list(axes)),)) for _ in range(2))
        out.append((axes, rng.random() < 0.3, stmts))
    return out


@pytest.mark.parametrize("axes,sp,overrides", _two_statement_plans(16), ids=[str(i) for i in range(16)])
def test_random_two_statement_plans_agree_with_the_simulator(axes, sp, overrides):
    spec, p = plan("p", axes, sp=sp, overrides=overrides)
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError as e:
        code = e.diagnostics[0].code
        assert code in (Code.OVERRIDE_NO_EFFECT, Code.AMAX_LOCAL_AND_REDUCED)
        if code == Code.AMAX_LOCAL_AND_REDUCED:  # by hand: some local and reduce applying to dense share an axis
            own = any(o.verb == "reduce" and o.group == "dense" for o in overrides)
            red = {a for o in overrides if o.verb == "reduce" and (o.group == "dense" or not own) for a in o.axes}
            assert red & {a for o in overrides if o.verb == "local" for a in o.axes}
        pytest.skip(code)
    refuted = any(o.verdict is Verdict.REFUTED for o in report.obligations if o.name.startswith("SC amax"))
    assert refuted is simulator_finds(p, {}, 6, simulator_amax.violations), (axes, sp, overrides)


def _place(body: str) -> str:
    return ("from std.data import ddp\nfrom std.tensor import megatron_tp\nfrom std.pipeline import one_f_one_b\n"
            "model { params = 1e9 }\nmesh {\n  dp = 2\n  tp = 2\n  pp = 2\n}\n"
            f"plan p {{\n  dp: ddp\n  tp: megatron_tp\n  pp: one_f_one_b\n  {body}\n}}\n")


@pytest.mark.parametrize("body,words", [
    ("override amax: local over (pp)", "each pipeline stage holds its own layers"),
    ("override amax: local over (tp, tp)", "the second time it names tp"),
    ("override amax[nope]: local over (tp)", "unknown parameter group"),
])
def test_statements_that_change_nothing_are_located(tmp_path, capsys, body, words):
    f = tmp_path / "a.place"
    f.write_text(_place(body))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  " + body) + 1
    assert f"{f}:{line}:3: error:" in err and words in err, err


def test_fmt_round_trips_the_statement():
    out = format_source(_place("override  amax[dense] :local over(dp,tp)"))
    assert "  override amax[dense]: local over (dp, tp)\n" in out, out
    assert format_source(out) == out


@pytest.mark.parametrize("plain,every,ok", [
    # by hand: tp left out by one statement, dp by the other: every pair of dp or tp ranks casts differently
    pytest.param("override amax: local over (tp)", "override amax[all]: local over (dp)", False, marks=pytest.mark.slow),
    # reduced over tp (the [all] statement), dp left out (the plain one): two dp ranks' tokens differ
    ("override amax: local over (dp)", "override amax[all]: reduce over (tp)", False),
    # the reductions for every group hold together whatever their spelling: over dp and tp, the pipeline stages
    # holding their own layers, so every scale is the global one
    pytest.param("override amax: reduce over (dp)", "override amax[all]: reduce over (tp)", True, marks=pytest.mark.slow),
    pytest.param("override amax: reduce over (dp, tp)", "override amax[all]: reduce over (dp)", True, marks=pytest.mark.slow),
])
def test_amax_and_amax_all_are_one_obligation_naming_both(tmp_path, plain, every, ok):
    """``amax`` and ``amax[all]`` both state every group's reduction: one ``SC amax``, its note naming both."""
    f = tmp_path / "a.place"
    f.write_text(_place(f"{plain}\n  {every}"))
    spec = load_string(f.read_text(), str(f))
    p = spec.plan("p")
    report = check_plan(SESSION, spec, p, {})
    amax = [o for o in report.obligations if o.name.startswith("SC amax")]
    assert [o.name for o in amax] == ["SC amax"]
    assert amax[0].verdict is (Verdict.PROVED if ok else Verdict.REFUTED)
    lines = f.read_text().splitlines()
    note = next(n for n in amax[0].notes if n.startswith("one obligation"))
    for stmt in (plain, every):
        assert f"{stmt.removeprefix('override ')} (line {lines.index('  ' + stmt) + 1})" in note, note
    assert simulator_finds(p, {}, 6, simulator_amax.violations) is (not ok)
