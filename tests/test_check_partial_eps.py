"""An epsilon added to a partial value (check.partial: ``tokens: eps_before_reduce by EPS``): each
microbatch's local token count has ε added on its rank before the counts are summed and all-reduced,
so the normaliser is Σ (n + ε) = T + P·ε where single-device training divides by T + ε. The
checker's verdicts against the independent simulator and hand-derived answers, the replayed
counterexample's concrete values, input errors and fmt."""

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
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP = {"dp": ("data", DDP)}
DP_CP = {"dp": ("data", DDP), "cp": ("context", DDP)}
EPS = ov("tokens", "eps_before_reduce", by=ir.Const(Fraction(1, 1000)))

CASES = [
    # (axes, overrides, hand-derived: is the gradient the global token mean's at every size). The
    # epsilon is wrong exactly when the normaliser sums two or more pieces: Σ (n + ε) = T + P·ε.
    (DP, (EPS,), False),
    (DP_CP, (EPS,), False),
    (DP, (EPS, ov("tokens", "equal")), False),  # equal counts: still T + P·ε
    (DP, (EPS, ov("tokens", "reduce", None, ())), False),  # the microbatches are still summed
]


@pytest.mark.parametrize("axes,overrides,ok", CASES, ids=[str(i) for i in range(len(CASES))])
def test_eps_agrees_with_the_simulator_and_by_hand(axes, overrides, ok):
    spec, p = plan("p", axes, overrides=overrides)
    report = check_plan(SESSION, spec, p, {})
    gi = next(o for o in report.obligations if o.name == "GI grads[dense]")
    assert gi.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (gi.verdict, gi.reason)
    names = p.mesh.names
    found = False
    for sizes in product((1, 2), repeat=len(names)):
        for m in (1, 2):
            for seed in range(3):
                found |= ("gi", "dense") in simulator.violations(
                    p, {**dict(zip(names, sizes)), "microbatches": m}, random.Random(seed), trials=2)
    assert found is (not ok)


@pytest.mark.parametrize("sizes,bad", [({"dp": 1, "microbatches": 1}, False), ({"dp": 2, "microbatches": 1}, True),
                                        ({"dp": 1, "microbatches": 3}, True), ({"dp": 3, "microbatches": 2}, True)])
def test_eps_pinned_sizes_by_hand(sizes, bad):
    """One piece: n + ε is single-device training's T + ε, proved; P ≥ 2 pieces of one token each:
    the normaliser is P·(1 + ε) where it should be P + ε (the replay's concrete values)."""
    spec, p = plan("p", DP, overrides=(EPS,))
    report = check_plan(SESSION, spec, p, sizes)
    gi = next(o for o in report.obligations if o.name == "GI grads[dense] normalisation")
    assert gi.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (gi.verdict, gi.reason)
    found = any(("gi", "dense") in simulator.violations(p, sizes, random.Random(s), trials=3) for s in range(6))
    assert found is bad
    if bad:
        cex = gi.counterexample
        P = sizes["dp"] * sizes["microbatches"]
        eps = Fraction(1, 1000)
        wrong, right = P * (1 + eps), P + eps  # by hand
        assert f"Σ (n + ε) = {wrong}, but Σ n + ε = {right}" in cex.equation, cex.equation
        assert f"every token's loss weight is {1 / wrong}" in cex.equation
        assert any("added on its rank" in d and f"{P}·ε" in d for d in cex.diagnosis), cex.diagnosis


def test_eps_of_a_model_symbol_is_refuted_where_it_is_not_zero():
    spec, p = plan("p", DP, overrides=(ov("tokens", "eps_before_reduce", by=ir.Sym("dp")),))
    report = check_plan(SESSION, spec, p, {"dp": 2, "microbatches": 1})
    gi = next(o for o in report.obligations if o.name == "GI grads[dense] normalisation")
    assert gi.verdict is Verdict.REFUTED
    assert "Σ (n + ε) = 6, but Σ n + ε = 4" in gi.counterexample.equation  # (1 + 2) + (1 + 2) vs 1 + 1 + 2


def _place(body: str, extra: str = "") -> str:
    return ("from std.data import ddp\nmodel {\n  params = 1e9\n  microbatches = 2\n}\nmesh {\n  dp = 2\n}\n"
            f"plan p {{\n  dp: ddp\n{extra}  {body}\n}}\n")


@pytest.mark.parametrize("body,extra,words", [
    ("override tokens: eps_before_reduce by 0", "", "the epsilon is 0"),
    ("override tokens: eps_before_reduce by 1e-6", "  override loss: per_microbatch_mean\n", "per-microbatch mean"),
    ("override tokens: eps_before_reduce by 1e-6", "  override loss: sum\n", "sum over tokens"),
])
def test_eps_that_changes_nothing_is_a_located_error(tmp_path, capsys, body, extra, words):
    f = tmp_path / "e.place"
    f.write_text(_place(body, extra))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL506]" in err and words in err and f"{f}:" in err, err


def test_eps_without_its_value_is_a_located_error(tmp_path, capsys):
    f = tmp_path / "e.place"
    f.write_text(_place("override tokens: eps_before_reduce"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  override tokens: eps_before_reduce") + 1
    assert f"{f}:{line}:" in err and "needs 'by <epsilon>'" in err and "[PL122]" in err, err


def test_eps_in_a_file_is_refuted_and_its_fix_proved(tmp_path, capsys):
    f = tmp_path / "e.place"
    f.write_text(_place("override tokens: eps_before_reduce by 1e-6"))
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "refuted GI grads[dense] normalisation" in out and "eps_before_reduce at line 11" in out


def test_fmt_round_trips_the_eps():
    src = ("from std.data import ddp\nmodel { params = 1e9 }\nmesh { dp = 2 }\nplan p {\n  dp: ddp\n"
           "  override tokens :eps_before_reduce  by 1e-8\n}\n")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    assert "override tokens: eps_before_reduce by 1e-8" in out, out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.by) for o in a.plans[0].overrides]
    assert [(o.target, o.group, o.verb, o.by) for o in b.plans[0].overrides] == key
    assert key[0][3] == ir.Const(Fraction(1, 10 ** 8))
