"""Per-rank ownership in the grad norm (check.perrank: ``clip_norm[g]: rank0_only over (AXES)``)
and an operation on a partial value (check.partial: ``tokens: clamp_before_reduce``). The
checker's verdicts against the independent simulator and hand-derived answers, the replayed
counterexamples' concrete values, input errors and fmt."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP = {"dp": ("data", DDP)}
DDP_TP = {"dp": ("data", DDP), "tp": ("tensor", "S,S,S,S")}
ZERO2_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,S")}
DP_CP = {"dp": ("data", DDP), "cp": ("context", DDP)}

# ---------------------------------------------------------------------------------------------------
# a group's part of the norm counted on rank 0 of an axis only

RANK0_CASES = [
    # (axes, overrides, hand-derived: is every device's norm the global one). Under DDP_TP dense and
    # embedding are sharded over tp, norms and biases whole on every tp rank; every group is whole over dp.
    (DDP_TP, (ov("clip_norm", "rank0_only", "dense", ("tp",)),), False),  # dense's tp shards 1.. dropped
    (DDP_TP, (ov("clip_norm", "rank0_only", None, ("tp",)),), False),  # every group: dense and embedding lose
    (DDP_TP, (ov("clip_norm", "reduce", "norms", ("tp",)), ov("clip_norm", "rank0_only", "norms", ("tp",))), True),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "rank0_only", "norms", ("tp",))), False),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "rank0_only", "norms", ("tp",)),
              ov("clip_norm", "rank0_only", "biases", ("tp",))), True),  # both copies counted once
    (ZERO2_TP, (ov("clip_norm", "rank0_only", "norms", ("dp",)),), False),  # norms' dp shards (ZeRO-2)
    (DP, (ov("clip_norm", "reduce", None, ("dp",)), ov("clip_norm", "rank0_only", None, ("dp",))), True),
    # one contributor per axis: a root before the sum, an average or a max of it (x, x/n, x)
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "rank0_only", None, ("tp",)),
              ov("clip_norm", "sqrt_before_reduce", "norms")), False),  # dense's tp shards dropped
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "dedupe", "biases", ("tp",)),
              ov("clip_norm", "rank0_only", "norms", ("tp",)), ov("clip_norm", "sqrt_before_reduce", "norms")), True),
    (DP, (ov("clip_norm", "average", None, ("dp",)), ov("clip_norm", "rank0_only", None, ("dp",))), False),  # x/dp
    (DP, (ov("clip_norm", "max", None, ("dp",)), ov("clip_norm", "rank0_only", None, ("dp",))), True),
]


@pytest.mark.parametrize("axes,overrides,ok", RANK0_CASES, ids=[str(i) for i in range(len(RANK0_CASES))])
def test_rank0_only_agrees_with_the_simulator_and_by_hand(axes, overrides, ok):
    spec, p = plan("p", axes, overrides=overrides)
    report = check_plan(SESSION, spec, p, {})
    clip = next(o for o in report.obligations if o.name == "SC clip_norm")
    assert clip.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (clip.verdict, clip.reason)
    names = p.mesh.names
    found = False
    for sizes in product((1, 2, 3), repeat=len(names)):
        for seed in range(3):
            found |= ("clip",) in simulator.norm_violations(p, {**dict(zip(names, sizes)), "microbatches": 1},
                                                             random.Random(seed))
    assert found is (not ok)
    if not ok and not any(o.verb == "reduce" for o in overrides):
        cex = clip.counterexample
        assert any("on rank 0 of" in d and ("dropped" in d or "averaged" in d) for d in cex.diagnosis), cex.diagnosis
        # the replayed values: the observer's norm misses a piece the global norm holds
        assert "global grad-norm²" in cex.equation


def _place(body: str, mesh: str = "dp = 2\n  tp = 2", extra: str = "") -> str:
    return (f"from std.data import ddp\nfrom std.tensor import megatron_tp\nmodel {{ params = 1e9 }}\n"
            f"mesh {{\n  {mesh}\n}}\nplan p {{\n  dp: ddp\n  tp: megatron_tp\n{extra}  {body}\n}}\n")


@pytest.mark.parametrize("body,extra,code,words", [
    ("override clip_norm[dense]: rank0_only over (dp)", "", "PL170", "is not summed over dp"),
    ("override clip_norm[norms]: rank0_only over (tp)", "", "PL506", "counted on one rank already"),
    ("override clip_norm[dense]: rank0_only over (tp, tp)", "", "PL506", "the second time it names tp"),
])
def test_rank0_only_errors_are_located(tmp_path, capsys, body, extra, code, words):
    f = tmp_path / "r.place"
    f.write_text(_place(body, extra=extra))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  " + body) + 1
    assert f"{f}:{line}:3: error:" in err and f"[{code}]" in err and words in err, err


# ---------------------------------------------------------------------------------------------------
# the token count clamped to >= 1 on each rank and microbatch before its reduction

CLAMP = ov("tokens", "clamp_before_reduce")
CLAMP_CASES = [
    # (axes, overrides, hand-derived: is the gradient the global token mean's). The clamp is wrong
    # exactly when the normaliser sums two or more pieces (microbatches and ranks of the reduced axes).
    (DP, (CLAMP,), False),
    (DP_CP, (CLAMP,), False),
    (DP, (CLAMP, ov("tokens", "reduce", None, ())), False),  # the microbatches are still summed
    (DP, (CLAMP, ov("loss", "per_device_mean")), False),  # a per-device mean: wrong already, and the clamp too
]


@pytest.mark.parametrize("axes,overrides,ok", CLAMP_CASES, ids=[str(i) for i in range(len(CLAMP_CASES))])
def test_clamp_agrees_with_the_simulator_and_by_hand(axes, overrides, ok):
    spec, p = plan("p", axes, overrides=overrides)
    report = check_plan(SESSION, spec, p, {})
    gi = next(o for o in report.obligations if o.name == "GI grads[dense]")
    assert gi.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (gi.verdict, gi.reason)
    names = p.mesh.names
    found = False
    for sizes in product((1, 2, 3), repeat=len(names)):
        for m in (1, 2):
            for seed in range(4):
                found |= ("gi", "dense") in simulator.violations(
                    p, {**dict(zip(names, sizes)), "microbatches": m}, random.Random(seed), trials=2)
    assert found is (not ok)


@pytest.mark.parametrize("sizes,bad", [({"dp": 1, "microbatches": 1}, False), ({"dp": 2, "microbatches": 1}, True),
                                        ({"dp": 1, "microbatches": 2}, True), ({"dp": 3, "microbatches": 2}, True)])
def test_clamp_pinned_sizes_by_hand(sizes, bad):
    """One piece (one rank, one microbatch): the clamp is the derived clamp of the whole count, proved;
    two or more: refuted, with the replay's concrete counts (one piece empty, the others 1 token)."""
    spec, p = plan("p", DP, overrides=(CLAMP,))
    report = check_plan(SESSION, spec, p, sizes)
    gi = next(o for o in report.obligations if o.name == "GI grads[dense] normalisation")
    assert gi.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (gi.verdict, gi.reason)
    found = any(("gi", "dense") in simulator.violations(p, sizes, random.Random(s), trials=3) for s in range(8))
    assert found is bad
    if bad:
        cex = gi.counterexample
        pieces = sizes["dp"] * sizes["microbatches"]
        assert f"Σ max(n, 1) = {pieces}, but max(Σ n, 1) = {pieces - 1}" in cex.equation, cex.equation
        assert any("max(0, 1) + max(1, 1) = 2 but max(0 + 1, 1) = 1" in d for d in cex.diagnosis)


def test_clamp_changes_the_stated_assumption():
    spec, p = plan("p", DP, overrides=(CLAMP,))
    assumed = check_plan(SESSION, spec, p, {"dp": 1, "microbatches": 1}).assumed
    assert any("may hold 0 tokens" in a for a in assumed)


@pytest.mark.parametrize("extra,words", [
    ("  override tokens: equal\n", "holds the same number of tokens"),
    ("  override loss: per_microbatch_mean\n", "per-microbatch mean"),
    ("  override loss: sum\n", "sum over tokens"),
])
def test_clamp_that_changes_nothing_is_an_error(tmp_path, capsys, extra, words):
    f = tmp_path / "c.place"
    f.write_text(_place("override tokens: clamp_before_reduce", extra=extra))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL506]" in err and words in err and f"{f}:" in err, err


def test_fmt_round_trips_the_new_verbs():
    src = ("from std.data import zero2\nmodel { params = 1e9 }\nmesh { dp = 2 }\nplan p {\n  dp: zero2\n"
           "  override clip_norm[norms]:rank0_only over(dp)\n  override tokens :clamp_before_reduce\n}\n")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    assert "override clip_norm[norms]: rank0_only over (dp)" in out and "override tokens: clamp_before_reduce" in out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.axes) for o in a.plans[0].overrides]
    assert key == [(o.target, o.group, o.verb, o.axes) for o in b.plans[0].overrides] == [
        ("clip_norm", "norms", "rank0_only", ("dp",)), ("tokens", None, "clamp_before_reduce", None)]


def test_one_rank_vocabulary_points_at_the_modelled_verb(tmp_path, capsys):
    """`rank` / `one_rank` stay out of scope (PL129) and name the one per-rank operation modelled."""
    f = tmp_path / "o.place"
    f.write_text(_place("override one_rank: clip"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL129]" in err and "rank0_only over (AXES)" in err and f"{f}:11:3" in err, err
