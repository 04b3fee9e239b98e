"""Ignored tokens counted in the loss normaliser (``override tokens: count_ignored``, check.ignored):
the checker against the concrete simulator (tests/simulator.py, whose pieces hold ignored tokens the
stated count includes) on hand-built plans, the replayed counterexample (values derived by hand),
the diagnostics and the format round trip."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DP = {"dp": ("data", "R,R,R,R")}
DP_CP = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R")}
DP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
IGN = ov("tokens", "count_ignored")


def gi(report) -> dict[str, Verdict]:
    return {o.name[len("GI grads["):-1]: o.verdict for o in report.obligations
            if o.name.startswith("GI grads[") and "] " not in o.name}


def simulated(p) -> set:
    rng = random.Random(7)
    found: set = set()
    for sizes in product((1, 2), repeat=len(p.mesh.names)):
        for m in (1, 2):
            found |= simulator.violations(p, {**dict(zip(p.mesh.names, sizes)), "microbatches": m}, rng, {}, trials=2)
    return {k[1] for k in found if k[0] == "gi"}


CASES = [
    (DP, (), False),
    (DP, (IGN,), True),
    (DP_CP, (IGN,), True),
    (DP_TP, (IGN,), True),
    # every normalisation that counts tokens counts the ignored ones too
    (DP, (IGN, ov("loss", "per_device_mean")), True),
    (DP, (IGN, ov("loss", "per_microbatch_mean"), ov("tokens", "equal")), True),
    (DP, (ov("loss", "per_microbatch_mean"), ov("tokens", "equal")), False),
    # equal counts of labelled tokens do not help: the normaliser is still T + Q
    (DP, (IGN, ov("tokens", "equal")), True),
    # the count of labelled tokens missing the context axis: refuted without ignored tokens too
    (DP_CP, (ov("tokens", "reduce", None, ("dp",)),), True),
]


@pytest.mark.parametrize("axes,overrides,wrong", CASES)
def test_checker_and_simulator(axes, overrides, wrong):
    spec, p = plan("p", axes, overrides=overrides)
    v = gi(check_plan(SESSION, spec, p, {}))
    found = simulated(p)
    assert v and all((x is Verdict.REFUTED) == wrong for x in v.values()), v
    assert found == (set(v) if wrong else set())


def test_replay_counts_one_ignored_token():
    spec, p = plan("p", DP_CP, overrides=(ov("tokens", "reduce", None, ("dp", "cp")), IGN))
    obs = {o.name: o for o in check_plan(SESSION, spec, p, {}).obligations}
    ob = obs["GI grads[dense] normalisation"]
    assert ob.verdict is Verdict.REFUTED
    cex = ob.counterexample
    sizes = dict(cex.sizes)
    pieces = sizes["dp"] * sizes["cp"] * sizes["microbatches"]
    # by hand: every piece one labelled token, the first one ignored token too: P + 1 counted, P labelled
    assert f"counts {pieces + 1} tokens, but {pieces} carry a label" in cex.equation
    assert "count_ignored at line" in cex.diagnosis[0]
    # the finding names the statement
    rep = check_plan(SESSION, spec, p, {})
    assert len(rep.findings) == 1 and "ignored" in rep.findings[0].cause


def test_term_count_is_pl122():
    spec, p = plan("p", DP, overrides=(ov("tokens", "count_ignored", "mtp"),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL122"
    # the language says the same at resolve
    from placement_logic.frontend.loader import load_string

    src = ("from std.data import ddp\nmodel {\n  params = 1e9\n  losses {\n    mtp = global_mean\n  }\n}\n"
           "mesh {\n  dp = 2\n}\nplan p {\n  dp: ddp\n  override tokens[mtp]: count_ignored\n}\n")
    with pytest.raises(DiagnosticError) as e:
        load_string(src)
    assert e.value.diagnostics[0].code == "PL122"


def test_sum_loss_is_pl506():
    spec, p = plan("p", DP, overrides=(ov("loss", "sum"), IGN))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL506"


def test_format_round_trip():
    from placement_logic.frontend.canonical import format_source

    src = ("from std.data import ddp\n\nmodel {\n  params = 1000000000\n  seq = 4096\n  microbatch = 1\n}\n\n"
           "mesh {\n  dp = 8\n}\n\nplan p {\n  dp: ddp\n  override tokens: count_ignored\n}\n")
    assert format_source(src, "x.place") == src
    assert format_source(src.replace("tokens: count_ignored", "tokens :count_ignored"), "x.place") == src
