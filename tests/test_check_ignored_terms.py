"""Ignored tokens' loss terms summed into the loss (``override tokens: ignored_in_loss``, check.encode_ignored_loss):
the checker against the concrete simulator (tests/simulator.py, whose pieces hold ignored tokens whose
terms the stated loss sums) on hand-built plans, the replayed counterexample (values derived by hand), the
diagnostics, the costs and the format round trip."""

from __future__ import annotations

import pytest
from ignoredkit import (
    DP,
    DP_CP,
    DP_TP,
    SESSION,
    SRC,
    check_a_term_statement_is_pl122,
    check_against_the_simulator,
    check_format_round_trip,
)
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.outcome import Verdict

TERMS = ov("tokens", "ignored_in_loss")


CASES = [
    (DP, (), False),
    (DP, (TERMS,), True),
    (DP_CP, (TERMS,), True),
    (DP_TP, (TERMS,), True),
    # the numerator is wrong: every objective, a sum included, and every normaliser
    (DP, (TERMS, ov("loss", "sum")), True),
    (DP, (TERMS, ov("loss", "per_device_mean")), True),
    (DP, (TERMS, ov("loss", "per_microbatch_mean"), ov("tokens", "equal")), True),
    # counting the ignored tokens too does not compensate their terms (ℓ = lse is no labelled term's mean)
    (DP, (TERMS, ov("tokens", "count_ignored")), True),
    (DP, (ov("loss", "sum"),), False),
]


@pytest.mark.parametrize("axes,overrides,wrong", CASES)
def test_checker_and_simulator(axes, overrides, wrong):
    check_against_the_simulator(axes, overrides, wrong, seed=11)


def test_replay_adds_one_ignored_term():
    spec, p = plan("p", DP_TP, overrides=(TERMS,))
    rep = check_plan(SESSION, spec, p, {})
    obs = {o.name: o for o in rep.obligations}
    ob = obs["GI grads[dense]"]
    assert ob.verdict is Verdict.REFUTED
    cex = ob.counterexample
    # by hand: logits [0, 1] in base 2 give the softmax [1/3, 2/3]; the labelled token (target word 0) has the
    # gradient [1/3 - 1, 2/3] = [-2/3, 2/3], the ignored one (no one-hot) [1/3, 2/3]; their sum [-1/3, 4/3]
    assert "= [-1/3, 4/3], single-device = [-2/3, 2/3]" in cex.equation
    assert "ignored_in_loss at line" in cex.diagnosis[0] and "outside every tensor rank's vocabulary slice" in \
        cex.diagnosis[0]
    # one finding, naming the statement; no other aspect is blamed (the per-axis reductions are right): the
    # terms' own aspect is the root
    assert len(rep.findings) == 1 and "no ignore_index" in rep.findings[0].cause
    assert rep.findings[0].root == "GI grads[dense] ignored tokens' terms"
    assert all(o.verdict is Verdict.PROVED for o in rep.obligations if o.name.startswith("GI grads[") and "] " in o.name
               and not o.name.endswith("ignored tokens' terms"))


def test_term_statement_is_pl122():
    check_a_term_statement_is_pl122("ignored_in_loss")


def test_format_round_trip():
    check_format_round_trip("ignored_in_loss")


def test_moves_no_bytes():
    from placement_logic.frontend.loader import load_string
    from placement_logic.ir import collectives

    def schedule(lines: str):
        p = load_string(SRC.replace("{lines}", lines)).plan("p")
        return sorted((c.kind.value, c.axes, c.phase.value, str(c.count), c.payload.tensor)
                      for c in collectives.derive(p))

    # the ignored tokens' terms are computed where the labelled ones are: the same collectives
    assert schedule("  override tokens: ignored_in_loss\n") == schedule("") != []


def test_a_count_and_the_terms_are_two_findings_each_at_its_statement(tmp_path):
    """Counting the ignored tokens and summing their terms are two defects (either alone is a bug): each
    statement's line is the location of a finding of its own, the terms' rooted at their own aspect."""
    text = open("examples/bugs/tp_ce_no_ignore_index.place").read().replace(
        "  override tokens: ignored_in_loss", "  override tokens: count_ignored\n  override tokens: ignored_in_loss")
    lines = text.splitlines()
    count_line = lines.index("  override tokens: count_ignored") + 1
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_spec

    path = tmp_path / "both.place"
    path.write_text(text)
    report = check_spec(load_spec(path), pinned={}).plans[0]
    assert {f.location.line for f in report.findings} == {count_line, count_line + 1}
    terms = next(f for f in report.findings if f.location.line == count_line + 1)
    assert terms.root.endswith("ignored tokens' terms")
    assert "ignore_index" in next(o for o in report.obligations if o.name == terms.root).counterexample.diagnosis[0]
