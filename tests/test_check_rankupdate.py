"""Per-rank operations on the update and the loss scale, and an epsilon on each rank's squared norm
(check.rankupdate: ``grads[g]: clip_rank0_only / divide_rank0_only over (AXES)``, ``loss_scale:
local over (AXES)``, ``clip_norm: eps_before_reduce by EPS``). The checker's verdicts against the
independent simulator (tests/simulator_perrank.py) and hand-derived answers, the replayed
counterexamples' concrete values, located input errors and fmt."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP = {"dp": ("data", DDP)}
DDP_TP = {"dp": ("data", DDP), "tp": ("tensor", "S,S,S,S")}
ZERO2_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,S")}
ZERO2 = {"dp": ("data", "R,S,S,R")}
EPS = ov("clip_norm", "eps_before_reduce", by=ir.Const(Fraction(1, 1000)))

# (axes, overrides, pinned sizes, the obligation, hand-derived: does it hold). By hand: a coefficient
# applied on rank 0 of an axis only differs from the other ranks' 1 whenever the axis has two ranks
# (a clip below 1, a divisor not 1); the loss scale read from a rank's own flag over an axis a group
# is sharded on differs when only one shard overflows; ε through a sum over P ranks is P·ε, through
# an average or a max ε.
CASES = [
    (DDP_TP, (ov("grads", "clip_rank0_only", None, ("dp",)),), {}, "SC update[dense]", False),
    (DDP_TP, (ov("grads", "clip_rank0_only", "norms", ("tp",)),), {}, "SC update[norms]", False),
    (DDP_TP, (ov("grads", "divide_rank0_only", "dense", ("tp",), by=ir.Const(Fraction(2))),), {}, "SC update[dense]",
     False),
    (DP, (ov("grads", "divide_rank0_only", None, ("dp",), by=ir.Sym("dp")),), {}, "SC update[dense]", False),
    (DP, (ov("grads", "divide_rank0_only", None, ("dp",), by=ir.Sym("dp")),), {"dp": 1}, "SC update[dense]", True),
    (DDP_TP, (ov("grads", "clip_rank0_only", None, ("tp",)),), {"dp": 2, "tp": 1}, "SC update[dense]", True),
    (ZERO2_TP, (ov("loss_scale", "local", None, ("dp",)),), {}, "SC loss_scale", False),
    (ZERO2_TP, (ov("loss_scale", "local", None, ("tp",)),), {}, "SC loss_scale", False),
    (ZERO2, (ov("loss_scale", "local", None, ("dp",)),), {"dp": 1}, "SC loss_scale", True),
    (DDP_TP, (EPS,), {}, "SC clip_norm", False),
    (DP, (ov("clip_norm", "reduce", None, ("dp",)), ov("clip_norm", "dedupe", None, ("dp",)), EPS), {}, "SC clip_norm",
     False),
    (DP, (ov("clip_norm", "max", None, ("dp",)), EPS), {}, "SC clip_norm", True),
    (DP, (ov("clip_norm", "average", None, ("dp",)), EPS), {}, "SC clip_norm", True),
    (DDP_TP, (EPS,), {"dp": 2, "tp": 1}, "SC clip_norm", True),  # the norm summed over tp only: one rank
]
KEY = {"SC clip_norm": ("clip",), "SC loss_scale": ("loss_scale",)}


def _key(name: str) -> tuple:
    return KEY.get(name) or ("update", name[len("SC update["):-1])


@pytest.mark.parametrize("axes,overrides,pinned,name,ok", CASES, ids=[str(i) for i in range(len(CASES))])
def test_agrees_with_the_simulator_and_by_hand(axes, overrides, pinned, name, ok):
    spec, p = plan("p", axes, overrides=overrides)
    report = check_plan(SESSION, spec, p, pinned)
    ob = next(o for o in report.obligations if o.name == name)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (ob.verdict, ob.reason)
    names = p.mesh.names
    found = False
    for sizes in product((1, 2, 3), repeat=len(names)):
        at = {**dict(zip(names, sizes)), "microbatches": 1}
        if any(at[k] != v for k, v in pinned.items()):
            continue
        for seed in range(6):
            found |= _key(name) in simulator.violations(p, at, random.Random(seed), {}, trials=1)
    assert found is (not ok)


def test_the_replays_hold_the_concrete_values():
    spec, p = plan("p", DDP_TP, overrides=(ov("grads", "divide_rank0_only", "dense", ("tp",), by=ir.Const(Fraction(4))),))
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC update[dense]")
    cex = ob.counterexample
    assert dict(cex.values)["coefficient applied"].startswith("1/4 on"), cex.values
    assert "-1 per element" in cex.equation and "-1/4" in cex.equation and "sharded over tp" in cex.diagnosis[0]
    spec, p = plan("p", ZERO2, overrides=(ov("loss_scale", "local", None, ("dp",)),))
    cex = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC loss_scale").counterexample
    assert "32768 on (dp=0)" in cex.equation and "65536 on (dp=1)" in cex.equation, cex.equation
    assert "g0 + 2·g1" in cex.notes[0]
    spec, p = plan("p", DP, overrides=(ov("clip_norm", "reduce", None, ("dp",)), ov("clip_norm", "dedupe", None, ("dp",)),
                                       EPS))
    cex = next(o for o in check_plan(SESSION, spec, p, {"dp": 4}).obligations if o.name == "SC clip_norm").counterexample
    # S = 1 on rank 0, ε = 1/1000 on each of 4 ranks: 1 + 4/1000 = 251/250 against 1 + 1/1000 = 1001/1000
    assert "= 251/250" in cex.equation and "S + ε = 1001/1000" in cex.equation, cex.equation


def _place(body: str, binding: str = "dp: ddp") -> str:
    return ("from std.data import ddp, zero2\nfrom std.tensor import megatron_tp\nmodel { params = 1e9 }\n"
            f"mesh {{\n  dp = 2\n  tp = 2\n}}\nplan p {{\n  {binding}\n  tp: megatron_tp\n  {body}\n}}\n")


@pytest.mark.parametrize("body,binding,words", [
    ("override grads: clip_rank0_only over (dp, dp)", "dp: ddp", "the second time it names dp"),
    ("override grads[dense]: divide_rank0_only over (tp) by 1", "dp: ddp", "a division by 1"),
    ("override clip_norm: eps_before_reduce by 0", "dp: ddp", "the epsilon is 0"),
    ("override clip_norm[dense]: eps_before_reduce by 1e-6", "dp: ddp", "state it without a group"),
    ("override loss_scale: local over (dp)", "dp: ddp", "holds the same reduced gradients"),
    ("override loss_scale: local over (dp)\n  override overflow: reduce over (tp)", "dp: zero2",
     "not all-reduced over dp"),
])
def test_statements_that_change_nothing_are_located(tmp_path, capsys, body, binding, words):
    f = tmp_path / "r.place"
    f.write_text(_place(body, binding))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  " + body.split("\n")[0]) + 1
    assert f"{f}:{line}:3: error:" in err and "[PL506]" in err and words in err, err


def test_fmt_round_trips_the_new_statements():
    src = _place("override grads[dense]: divide_rank0_only over (tp) by dp\n"
                 "  override  grads :clip_rank0_only over(dp)\n  override clip_norm: eps_before_reduce  by 1e-6\n"
                 "  override loss_scale: local over (dp)", "dp: zero2")
    out = format_source(src)
    for line in ("override grads[dense]: divide_rank0_only over (tp) by dp", "override grads: clip_rank0_only over (dp)",
                 "override clip_norm: eps_before_reduce by 1e-6", "override loss_scale: local over (dp)"):
        assert f"  {line}\n" in out, out
    assert format_source(out) == out
