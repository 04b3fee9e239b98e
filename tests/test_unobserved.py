"""`unobserved "FACT"`: a plan that names a fact of the real step it does not state. What the
checker would prove of such a plan is unknown (exit 3), naming the fact; refutations stay; the
lift writes one for each thing it could not lift."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
SPEC = """from std.data import ddp

model {
  params = 1e9
}

mesh {
  dp = 4
}

plan p {
  dp: ddp
  {extra}
}
"""


def _spec(extra: str):
    return load_string(SPEC.replace("{extra}", extra), "u.place")


def test_a_proof_becomes_unknown_naming_the_fact():
    plain = check_spec(_spec(""), ["p"]).plans[0]
    assert all(o.verdict is Verdict.PROVED for o in plain.obligations)
    report = check_spec(_spec('unobserved "the loss normalisation"'), ["p"]).plans[0]
    assert report.obligations and all(o.verdict is Verdict.UNKNOWN for o in report.obligations)
    assert all("the loss normalisation (line 13)" in o.reason for o in report.obligations)
    assert all(o.location.line == 13 for o in report.obligations)
    assert any("not stated by the plan: the loss normalisation" in a for a in report.assumed)


def test_a_refutation_stays_refuted():
    report = check_spec(_spec('override grads: reduce over ()\n  unobserved "x"'), ["p"]).plans[0]
    verdicts = {o.verdict for o in report.obligations}
    assert Verdict.REFUTED in verdicts and Verdict.PROVED not in verdicts


def test_cli_exit_status_and_inspect(tmp_path):
    f = tmp_path / "u.place"
    f.write_text(SPEC.replace("{extra}", 'unobserved "the RNG state"'))
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", str(f)], out, err) == 3
    assert out.getvalue().rstrip().endswith("UNKNOWN") and "the RNG state" in out.getvalue()
    out = io.StringIO()
    assert main(["inspect", str(f), "--format", "json"], out, io.StringIO()) == 0
    notes = json.loads(out.getvalue())["plans"][0]["notes"]
    assert any(n.startswith("unobserved: the RNG state (line 13)") for n in notes)


def test_formatting_round_trips():
    text = SPEC.replace("{extra}", 'unobserved    "a b"')
    once = format_source(text, "u.place")
    assert 'unobserved "a b"' in once and format_source(once, "u.place") == once


@pytest.mark.parametrize("text,code", [
    ('unobserved ""', "PL114"),
])
def test_bad_unobserved(text, code):
    with pytest.raises(DiagnosticError) as exc:
        _spec(text)
    assert [d.code for d in exc.value.diagnostics] == [code]


def test_not_in_a_strategy():
    text = SPEC.replace("{extra}", "").replace("plan p {", 'strategy s {\n  role = data\n  unobserved "x"\n}\n\nplan p {')
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "u.place")
    assert any(d.code == "PL113" and "'unobserved' belongs in a plan" in d.message for d in exc.value.diagnostics)


def test_lift_states_what_it_could_not_lift():
    """A stored trace with its cross-entropy records removed: the normalisation is not observed, and the
    lifted spec says so in the plan, so checking the lifted spec proves nothing."""
    trace = json.loads((ROOT / "tests" / "data" / "traces" / "ddp_summed.json").read_text())
    for part in trace["ranks"]:
        for s in part["steps"]:
            s["nll"] = []
    lifted = lift(trace)
    assert any(u.what == "the loss normalisation" for u in lifted.unliftable)
    assert 'unobserved "the loss normalisation (not lifted: see placement lift)"' in lifted.text
    spec = load_string(lifted.text, "lifted.place")
    report = check_spec(spec, [lifted.plan]).plans[0]
    assert Verdict.PROVED not in {o.verdict for o in report.obligations}
