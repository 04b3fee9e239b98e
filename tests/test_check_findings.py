"""Where a finding points and what it says first: a placement-caused finding at the binding
of the axis (or the group block whose own mode causes it), naming its groups; the headline
the root cause, side remarks as notes after it. Line numbers are read off the texts below."""

from __future__ import annotations

from corpus import EXAMPLES

from placement_logic.check.report import Verdict
from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_spec, load_string

GROUP_OWN_MODE = """from std.data import ddp

model {
  params = 1000000
  group vision {
    count = 1000
    params = {dp: S}
  }
}

mesh {
  dp = 4
}

plan p {
  dp: ddp
}
"""

STRATEGY_MODE = """strategy bad_zero = data(S, S, S, R)

model {
  params = 1000000
}

mesh {
  dp = 4
}

plan q {
  dp: bad_zero
}
"""


def _only_finding(text: str):
    report = check_spec(load_string(text, "<t>"), timeout=10)
    (plan,) = report.plans
    assert plan.verdict is Verdict.REFUTED
    (finding,) = plan.findings
    return plan, finding


def test_a_groups_own_mode_points_at_its_block_and_names_it():
    plan, f = _only_finding(GROUP_OWN_MODE)
    assert f.root == "SC params usable over dp"
    assert f.location.line == 5  # `group vision {`
    assert f.cause.startswith("group vision: params are sharded over dp")
    usable = next(o for o in plan.obligations if o.name == "SC params usable over dp")
    assert usable.location.line == 5 and usable.groups == ("vision",)


def test_a_strategys_placement_points_at_the_binding():
    plan, f = _only_finding(STRATEGY_MODE)
    assert f.root == "SC params usable over dp"
    assert f.location.line == 12  # `dp: bad_zero`, not the plan header (line 11)
    assert f.cause.startswith("params are sharded over dp")  # every group: none singled out


def test_a_proved_placement_obligation_keeps_its_place():
    report = check_spec(load_string(GROUP_OWN_MODE.replace("{dp: S}", "{dp: R}"), "<t>"), timeout=10)
    (plan,) = report.plans
    usable = next(o for o in plan.obligations if o.name == "SC params usable over dp")
    assert usable.verdict is Verdict.PROVED and usable.groups == ()


def test_a_side_remark_is_a_note_after_the_cause():
    """A sum-loss divisor bug under a mean-of-means loss, refuted on equal token counts: the
    cause is the divisor; that the mean of means is exact on this run is a note."""
    spec = load_spec(EXAMPLES / "measure" / "grad_sync_bugs.place")
    report = check_spec(spec, plans=["ddp_sum_not_mean"], timeout=10)
    remark = "every shard has the same token count in this run, so the mean of means is exact here"
    shown = [o.counterexample for o in report.obligations if o.counterexample is not None]
    assert shown
    for cex in shown:
        assert remark not in cex.diagnosis
    assert any(remark in cex.notes for cex in shown)
    for f in report.plans[0].findings:
        assert f.cause != remark


def test_measure_prints_the_checkers_notes_after_its_causes():
    from placement_logic.measure.render import counterexample_lines
    from placement_logic.measure.report import CounterexampleView

    cex = CounterexampleView("GI grads[dense]", (("dp", 2),), (), "a = b", ("the cause",), "placement check x",
                             ("a side remark",))
    lines = counterexample_lines(cex)
    assert lines.index("because: the cause") < lines.index("note: a side remark") < lines.index("re-run: placement check x")
