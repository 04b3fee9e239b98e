"""The loss scaler's state over steps (check.scalerstate: ``loss_scale: growth_local over (AXES)``):
the checker's verdicts on ``SC loss_scale_state`` against the independent simulator
(tests/simulator_scaler.py) and hand-derived answers, the replayed sequence of flags re-run through
the simulator's own scaler, located input errors and fmt."""

from __future__ import annotations

import random

import pytest
import simulator_scaler
from handcases import obligation, obligation_or_skip, simulator_finds
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
NAME = "SC loss_scale_state"
ZERO2 = {"dp": ("data", "R,S,S,R")}
ZERO2_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,S")}
DDP_PP = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}
GROW = "growth_local"

# (axes, overrides, pinned sizes, hand-derived: does it hold). By hand: over an axis of two or more ranks
# that a group's gradient is sharded on, one shard's overflow reaches one rank's scaler and not the
# other's; two such steps exhaust a hysteresis of 2 on one rank only. Over an axis of one rank, or
# where the scaler reads the flag reduced over every sharded axis, every scaler reads the same flag.
CASES = [
    (ZERO2, (ov("loss_scale", GROW, None, ("dp",)),), {}, False),
    (ZERO2, (ov("loss_scale", GROW, None, ("dp",)),), {"dp": 1}, True),
    (ZERO2_TP, (ov("loss_scale", GROW, None, ("tp",)),), {}, False),
    (ZERO2_TP, (ov("loss_scale", GROW, None, ("tp",)),), {"dp": 3, "tp": 1}, True),
    (ZERO2_TP, (ov("loss_scale", GROW, None, ("dp", "tp")),), {"dp": 1, "tp": 2}, False),
    (DDP_PP, (ov("loss_scale", GROW, None, ("pp",)),), {}, False),
    (DDP_PP, (ov("loss_scale", GROW, None, ("pp",)),), {"dp": 4, "pp": 1}, True),
    # the flag reduced over tp only: its own flag over dp is read by the scaler already
    (ZERO2_TP, (ov("loss_scale", GROW, None, ("tp",)), ov("overflow", "reduce", None, ("tp",))), {"tp": 1}, False),
]


@pytest.mark.parametrize("axes,overrides,pinned,ok", CASES, ids=[str(i) for i in range(len(CASES))])
def test_agrees_with_the_simulator_and_by_hand(axes, overrides, pinned, ok):
    spec, p = plan("p", axes, overrides=overrides)
    ob = obligation(SESSION, spec, p, pinned, NAME)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (ob.verdict, ob.reason)
    assert simulator_finds(p, pinned, 8, simulator_scaler.violations) is (not ok)


def test_the_replayed_flags_part_the_simulators_scalers():
    """The witness's two steps of flags run through the simulator's scaler (not the checker's): rank A
    overflows twice, rank B never; single-device training sees both overflows."""
    spec, p = plan("p", ZERO2, overrides=(ov("loss_scale", GROW, None, ("dp",)),))
    cex = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == NAME).counterexample
    a = b = one = (2 ** 16, 0, 2)
    for _ in range(2):
        a = simulator_scaler.step_scaler(*a, True, 2, 1000)
        b = simulator_scaler.step_scaler(*b, False, 2, 1000)
        one = simulator_scaler.step_scaler(*one, True, 2, 1000)
    assert (a[0], b[0], one[0]) == (32768, 65536, 32768)
    assert f"{a[0]} on (dp=0)" in cex.equation and f"{b[0]} on (dp=1)" in cex.equation, cex.equation
    values = dict(cex.values)
    assert "growth tracker 0, hysteresis 1 on (dp=0)" in values["after step 1"], values
    assert "growth tracker 1, hysteresis 2 on (dp=1)" in values["after step 1"], values
    assert "doubles its scale to 131072" in cex.notes[0]


def _place(body: str, binding: str = "dp: zero2") -> str:
    return ("from std.data import ddp, zero2\nfrom std.tensor import megatron_tp\nmodel { params = 1e9 }\n"
            f"mesh {{\n  dp = 2\n  tp = 2\n}}\nplan p {{\n  {binding}\n  tp: megatron_tp\n  {body}\n}}\n")


@pytest.mark.parametrize("body,binding,words", [
    ("override loss_scale: growth_local over (dp)", "dp: ddp", "holds the same reduced gradients"),
    ("override loss_scale: growth_local over (dp)\n  override overflow: reduce over (tp)", "dp: zero2",
     "not all-reduced over dp"),
    ("override loss_scale[dense]: growth_local over (dp)", "dp: zero2", "one value per rank"),
    ("override loss_scale: growth_local over (dp, dp)", "dp: zero2", "the second time it names dp"),
])
def test_statements_that_change_nothing_are_located(tmp_path, capsys, body, binding, words):
    f = tmp_path / "r.place"
    f.write_text(_place(body, binding))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  " + body.split("\n")[0]) + 1
    assert f"{f}:{line}:3: error:" in err and "[PL506]" in err and words in err, err


def test_fmt_round_trips_the_statement():
    out = format_source(_place("override  loss_scale :growth_local over(dp,tp)"))
    assert "  override loss_scale: growth_local over (dp, tp)\n" in out, out
    assert format_source(out) == out


def test_the_refutation_names_the_root_cause(tmp_path, capsys):
    f = tmp_path / "r.place"
    f.write_text(_place("override loss_scale: growth_local over (dp)"))
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "refuted SC loss_scale_state" in out and "root cause: SC loss_scale_state" in out, out
    assert "from its own found-inf flag over (dp)" in out


MODES = ("R,R,R,R", "R,S,S,R", "S*,S,S,R")


def _random_plans(n: int):
    """Plans of two axes (data or tensor roles, ZeRO modes on data axes) with ``growth_local`` over a
    random non-empty subset and, at random, the overflow flag reduced over a random subset."""
    rng = random.Random(2024)
    out = []
    while len(out) < n:
        roles = [rng.choice(["data", "tensor"]) for _ in range(2)]
        axes = {f"a{i}": (r, rng.choice(MODES) if r == "data" else "S,S,S,S") for i, r in enumerate(roles)}
        names = list(axes)
        named = tuple(x for x in names if rng.random() < 0.6) or (names[0],)
        ovs = [ov("loss_scale", GROW, None, named)]
        if rng.random() < 0.4:
            ovs.append(ov("overflow", "reduce", None, tuple(x for x in names if rng.random() < 0.7)))
        out.append((axes, tuple(ovs)))
    return out


@pytest.mark.parametrize("axes,overrides", _random_plans(16), ids=[str(i) for i in range(16)])
def test_random_plans_agree_with_the_simulator(axes, overrides):
    spec, p = plan("p", axes, overrides=overrides)
    # PL506 (skipped): a named axis no group is sharded on, or one the flag is not reduced over
    ob = obligation_or_skip(SESSION, spec, p, NAME)
    found = simulator_finds(p, {}, 8, simulator_scaler.violations)
    assert (ob.verdict is Verdict.REFUTED) is found, (axes, overrides, ob.verdict)
