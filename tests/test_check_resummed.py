"""The accumulating gradient buffer all-reduced with a sum in place after every micro-step (``grads:
reduce_summed_every_microbatch``, NVIDIA/Megatron-LM#6660): the checker against the concrete simulator
(tests/simulator_state.py, ``rereduce_violations``, which overwrites every device's buffer with its group's sum
after each of the m micro-steps) at sizes 1..3 and m 1..3, the n^(m - k) factor by hand, the replayed
counterexample, and the statements that change nothing (PL506) or contradict another (PL298)."""

from __future__ import annotations

import io
import random
from dataclasses import replace
from fractions import Fraction

import pytest
import simulator_state
from irkit import const, ov, plan

from placement_logic.check.resummed import summed
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
SUMMED = "reduce_summed_every_microbatch"
PLANS = {
    "ddp": {"dp": ("data", "R,R,R,R")},
    "zero1": {"dp": ("data", "R,S,R,R")},
    "ddp_tp": {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,R")},
}


def _with(axes, overrides=()):
    spec, p = plan("p", axes, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


def verdicts(report) -> dict[tuple, Verdict]:
    out = {}
    for o in report.obligations:
        if o.name.startswith("GI grads[") and "] " not in o.name:
            out[("gi", o.name[9:-1])] = o.verdict
        elif o.name.startswith("GI grads[") and o.name.endswith("] over microbatches"):
            out[("gi", o.name[9:-len("] over microbatches")])] = o.verdict
        elif o.name.startswith("SC grads["):
            out[("replica", o.name[9:-1])] = o.verdict
    return out


def _agree(axes, sizes):
    spec, p = _with(axes, (ov("grads", SUMMED),))
    v = verdicts(check_plan(SESSION, spec, p, {**sizes, "m": sizes["microbatches"]}))
    pinned = {**{a: sizes.get(a, 1) for a in axes}, "microbatches": sizes["microbatches"]}
    found = simulator_state.rereduce_violations(p, pinned, random.Random(7), "sum")
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, axes, sizes)
    return v


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_agrees_with_the_simulator_on_ddp(n, m):
    """Refuted exactly where the simulator's update differs from the global-batch gradient: n >= 2 and m >= 2
    (at n = 1 the sum over one rank leaves the buffer as it is); the replicas agree at every size."""
    v = _agree(PLANS["ddp"], {"dp": n, "microbatches": m})
    assert (v[("gi", "dense")] is Verdict.REFUTED) == (n >= 2 and m >= 2)
    assert v[("replica", "dense")] is Verdict.PROVED


@pytest.mark.slow
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name", ["zero1", "ddp_tp"])
def test_agrees_with_the_simulator(name, n, m):
    _agree(PLANS[name], {a: n for a in PLANS[name]} | {"microbatches": m})


def test_simulator_without_the_statement_is_clean():
    """The same plan without the statement: the simulator's update reads the global-batch gradient (the oracle
    itself separates the defect)."""
    _, p = _with(PLANS["ddp_tp"])
    for n in (1, 2, 3):
        for m in (1, 2, 3):
            assert not simulator_state.rereduce_violations(p, {"dp": n, "tp": 2, "microbatches": m},
                                                           random.Random(n * m), "sum")


@pytest.mark.parametrize("n,m,k,factor", [(2, 2, 1, 2), (2, 2, 2, 1), (2, 3, 1, 4), (3, 3, 1, 9), (3, 3, 2, 3),
                                          (3, 3, 3, 1), (1, 3, 1, 1), (3, 1, 1, 1)])
def test_micro_step_k_multiplied_by_n_to_the_m_minus_k(n, m, k, factor):
    """Micro-step k's gradient 1 on rank 0 alone, the rest 0: summed once (1), then each of the m - k later
    reductions sums n copies of it (n = 2, m = 3, k = 1: 1 → 2 → 4 = 2^2; n = 3, m = 3, k = 2: 1 → 3 = 3^1)."""
    parts = [[Fraction(int(j == k and r == 0)) for r in range(n)] for j in range(1, m + 1)]
    assert summed(parts) == factor


def test_counterexample_is_replayed():
    spec, p = _with(PLANS["ddp"], (ov("grads", SUMMED),))
    report = check_plan(SESSION, spec, p, {})
    ob = next(o for o in report.obligations if o.name == "GI grads[dense] over microbatches")
    assert ob.verdict is Verdict.REFUTED
    cex = ob.counterexample
    n, m = dict(cex.sizes)["dp"], dict(cex.sizes)["microbatches"]
    assert n >= 2 and m >= 2
    # n ranks, one token each in micro-step 1 with gradient 1 of n·m tokens: n × 1/(n·m) = 1/m summed once, then
    # multiplied by n at each of the m - 1 later reductions: n^(m-1)/m
    held, want = Fraction(n ** (m - 1), m), Fraction(1, m)
    text = lambda f: str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"  # noqa: E731
    assert f"= {n}^{m - 1} × {text(want)} = {text(held)}" in cex.equation
    assert f"global-batch gradient is {n} × 1/{n * m} = {text(want)}" in cex.equation
    assert "n^(m - k)" in cex.diagnosis[0]
    assert next(o for o in report.obligations if o.name == "GI grads[dense] over dp").verdict is Verdict.PROVED


def _error(p, spec):
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    return e.value.diagnostics[0]


@pytest.mark.parametrize("name,extra,code,words", [
    ("ddp", (ov("grads", "no_accumulation_buffer"),), "PL506", "freed after every reduction"),
    ("ddp", (ov("grads", "reduce_every_microbatch"),), "PL298", "not both"),
    ("ddp", (ov("grads", "sync_before_last"),), "PL298", "not both"),
    ("zero2", (), "PL506", "no gradient is all-reduced"),
])
def test_statements_beside_it(name, extra, code, words):
    axes = PLANS.get(name, {"dp": ("data", "R,S,S,R")})
    spec, p = _with(axes, extra + (ov("grads", SUMMED),))
    d = _error(p, spec)
    assert d.code == code and words in d.message, d.message


def test_accumulated_beside_it_is_pl298():
    spec, p = _with(PLANS["ddp"], (ov("grads", SUMMED), ov("grads", "reduce_accumulated_every_microbatch")))
    d = _error(p, spec)
    assert d.code == "PL298" and SUMMED in d.message


def test_a_named_group_or_one_microbatch_changes_nothing():
    spec, p = _with(PLANS["ddp"], (ov("grads", SUMMED, "norms"),))
    assert "reduced as one" in _error(p, spec).message
    spec, p = _with(PLANS["ddp"], (ov("grads", SUMMED),))
    p = replace(p, model=replace(p.model, microbatches=const(1)))
    d = _error(p, replace(spec, plans=(p,)))
    assert d.code == "PL506" and "one microbatch per step" in d.message


def test_fmt_round_trip_and_check_through_the_cli(tmp_path):
    text = ("from std.data import ddp\n\nmodel {\n  params = 1.3e9\n  microbatches = 3\n}\n\nmesh {\n  dp = 2\n}\n\n"
            f"plan p {{\n  dp: ddp\n  override grads: {SUMMED}\n}}\n")
    assert format_source(text, "a.place") == text
    assert format_source(text.replace("override grads: reduce", "override  grads :   reduce"), "a.place") == text
    path = tmp_path / "a.place"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", str(path)], out=out, err=err) == 1
    assert "refuted GI grads[dense] over microbatches" in out.getvalue()
    path.write_text(text.replace("microbatches = 3", "microbatches = 1"))
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", str(path)], out=out, err=err) == 2
    assert f"{path}:14:3: error:" in err.getvalue() and "[PL506]" in err.getvalue()
    assert "Traceback" not in err.getvalue()
