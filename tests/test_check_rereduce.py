"""The accumulated gradient buffer reduced again after every micro-step into a separate accumulator (``grads:
reduce_accumulated_every_microbatch``, hpcaitech/ColossalAI#247): the checker against the concrete simulator
(tests/simulator_state.py, ``rereduce_violations``, which runs the m micro-steps on every device with a sum
and with a mean reduction) at sizes 1..3 and m 1..3, the replayed counterexample, and the statements that
change nothing (PL506) or contradict another (PL298)."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction

import pytest
import simulator_state
from irkit import const, ov, plan

from placement_logic.check.rereduce import accumulated
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
AGAIN = "reduce_accumulated_every_microbatch"
PLANS = {
    "ddp": {"dp": ("data", "R,R,R,R")},
    "zero1": {"dp": ("data", "R,S,R,R")},
    "zero2": {"dp": ("data", "R,S,S,R")},
    "ddp_tp": {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,R")},
}


def _with(axes, overrides=()):
    spec, p = plan("p", axes, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


def verdicts(report) -> dict[tuple, Verdict]:
    """Whole-plan gradient integrity, its accumulation aspect and replica consistency per group."""
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
    spec, p = _with(axes, (ov("grads", AGAIN),))
    v = verdicts(check_plan(SESSION, spec, p, {**sizes, "m": sizes["microbatches"]}))
    pinned = {**{a: sizes.get(a, 1) for a in axes}, "microbatches": sizes["microbatches"]}
    for reduction in ("sum", "mean"):
        found = simulator_state.rereduce_violations(p, pinned, random.Random(7), reduction)
        bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
        assert not bad, (bad, axes, sizes, reduction)
    return v


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_agrees_with_the_simulator_on_ddp(n, m):
    """Refuted exactly where the simulator's accumulator differs from the global-batch mean: every m >= 2,
    a single device included; replica consistency holds (every device receives the same reduced value)."""
    v = _agree(PLANS["ddp"], {"dp": n, "microbatches": m})
    assert (v[("gi", "dense")] is Verdict.REFUTED) == (m >= 2)
    assert v[("replica", "dense")] is Verdict.PROVED


@pytest.mark.slow
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name", ["zero1", "zero2", "ddp_tp"])
def test_agrees_with_the_simulator(name, n, m):
    _agree(PLANS[name], {a: n for a in PLANS[name]} | {"microbatches": m})


def test_simulator_reference_paths_are_clean():
    """Without the statement, and with the buffer freed after every reduction, the simulator's update reads the
    global-batch mean at every size (the oracle itself distinguishes the defect)."""
    _, p = _with(PLANS["ddp"])
    _, freed = _with(PLANS["zero2"], (ov("grads", "no_accumulation_buffer"),))
    for q in (p, freed):
        for n in (1, 2, 3):
            for m in (1, 2, 3):
                for reduction in ("sum", "mean"):
                    assert not simulator_state.rereduce_violations(q, {"dp": n, "microbatches": m},
                                                                   random.Random(n * m), reduction)


@pytest.mark.parametrize("m,k,times", [(1, 1, 1), (2, 1, 2), (2, 2, 1), (3, 1, 3), (3, 2, 2), (3, 3, 1)])
def test_micro_step_k_counted_m_minus_k_plus_one_times(m, k, times):
    """Micro-step k's share alone (1, the others 0): the buffer holds it from micro-step k to m, so it is
    added into the accumulator m - k + 1 times (m = 3, k = 1: 3; k = 2: 2; k = 3: 1)."""
    shares = [Fraction(int(j == k)) for j in range(1, m + 1)]
    assert accumulated(shares) == times


def test_counterexample_is_replayed():
    spec, p = _with(PLANS["zero1"], (ov("grads", AGAIN),))
    report = check_plan(SESSION, spec, p, {})
    ob = next(o for o in report.obligations if o.name == "GI grads[dense] over microbatches")
    assert ob.verdict is Verdict.REFUTED
    cex = ob.counterexample
    m = dict(cex.sizes)["microbatches"]
    # micro-step 1's share is 1/m of the step's mean; the accumulator adds it m times: m × 1/m = 1, not 1/m
    assert f"= {m} × 1/{m} = 1 (micro-step 1 counted {m} times)" in cex.equation
    assert f"the global-batch gradient is 1/{m}" in cex.equation
    assert "counted m - k + 1 times" in cex.diagnosis[0]
    # the other aspects of the step (reductions over dp, normalisation) stay proved
    assert next(o for o in report.obligations if o.name == "GI grads[dense] over dp").verdict is Verdict.PROVED


def _error(p, spec):
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    return e.value.diagnostics[0]


@pytest.mark.parametrize("name,extra,code,words", [
    ("zero2", (ov("grads", "no_accumulation_buffer"),), "PL506", "freed after every reduction"),
    ("ddp", (ov("grads", "reduce_every_microbatch"),), "PL298", "not both"),
])
def test_statements_beside_it(name, extra, code, words):
    spec, p = _with(PLANS[name], extra + (ov("grads", AGAIN),))
    d = _error(p, spec)
    assert d.code == code and words in d.message


def test_a_named_group_or_one_microbatch_changes_nothing():
    spec, p = _with(PLANS["ddp"], (ov("grads", AGAIN, "norms"),))
    assert "reduced as one" in _error(p, spec).message
    spec, p = _with(PLANS["ddp"], (ov("grads", AGAIN),))
    p = replace(p, model=replace(p.model, microbatches=const(1)))
    d = _error(p, replace(spec, plans=(p,)))
    assert d.code == "PL506" and "one microbatch per step" in d.message


def test_fmt_round_trip_and_check_through_the_cli(tmp_path):
    """`placement fmt` keeps the statement (a spacing variant comes back canonical) and `placement check` refutes
    the plan with exit status 1; with one microbatch it is the located PL506, exit 2."""
    import io

    from placement_logic.cli import main
    from placement_logic.frontend.canonical import format_source

    text = ("from std.data import ddp\n\nmodel {\n  params = 1.3e9\n  microbatches = 3\n}\n\nmesh {\n  dp = 2\n}\n\n"
            "plan p {\n  dp: ddp\n  override grads: reduce_accumulated_every_microbatch\n}\n")
    assert format_source(text, "a.place") == text
    messy = text.replace("override grads: reduce", "override   grads :  reduce")
    assert format_source(messy, "a.place") == text
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
