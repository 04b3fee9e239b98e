"""Ignored tokens counted in the loss normaliser (``override tokens: count_ignored``, check.ignored):
the checker against the concrete simulator (tests/simulator.py, whose pieces hold ignored tokens the
stated count includes) on hand-built plans, the replayed counterexample (values derived by hand),
the diagnostics and the format round trip."""

from __future__ import annotations

import pytest
from ignoredkit import (
    DP,
    DP_CP,
    DP_TP,
    SESSION,
    check_a_term_statement_is_pl122,
    check_against_the_simulator,
    check_format_round_trip,
)
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict

IGN = ov("tokens", "count_ignored")


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
    check_against_the_simulator(axes, overrides, wrong, seed=7)


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
    check_a_term_statement_is_pl122("count_ignored")


def test_sum_loss_is_pl506():
    spec, p = plan("p", DP, overrides=(ov("loss", "sum"), IGN))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL506"


def test_format_round_trip():
    check_format_round_trip("count_ignored")
