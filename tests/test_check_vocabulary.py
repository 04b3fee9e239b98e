"""Checker vocabulary: a summed objective, and what the step semantics refuses (PL129).

Oracle for the sum loss: the concrete simulator (tests/simulator.py) runs the step on
small meshes with exact fractions; the checker's verdict must agree with it, and the
refutation must name the divisor as the root cause.
"""

from __future__ import annotations

import json
import random

import pytest
import simulator

from placement_logic.cli import main
from placement_logic.frontend.loader import load_string

SPEC = """from std.data import ddp, zero2, zero3
from std.tensor import megatron_tp
model {{ params = 1000 }}
mesh {{ dp = 4  tp = 2 }}
plan p {{
  dp: {data}
  tp: megatron_tp
  {lines}
}}
"""


def _check(tmp_path, capsys, text):
    f = tmp_path / "s.place"
    f.write_text(text)
    status = main(["check", str(f), "--format", "json"])
    return status, json.loads(capsys.readouterr().out) if status in (0, 1) else None


@pytest.mark.parametrize("data", ["ddp", "zero2", "zero3"])
@pytest.mark.parametrize("lines,proved", [
    ("override loss: sum", True),
    ("override loss: sum\n  override grads: divide by dp", False),
    ("override loss: sum\n  override grads: reduce over (dp, dp)", False),
    ("override loss: sum\n  override grads: reduce over (dp, dp)\n  override grads: divide by dp", True),
    ("override loss: global_mean\n  override grads: divide by dp", False),
])
def test_sum_loss_verdicts_agree_with_the_simulator(tmp_path, capsys, data, lines, proved):
    text = SPEC.format(data=data, lines=lines)
    status, out = _check(tmp_path, capsys, text)
    assert status == (0 if proved else 1)
    plan = load_string(text).plan("p")
    rng = random.Random(7)
    bad = set()
    for dp in (1, 2, 3):
        for m in (1, 2):
            bad |= {v for v in simulator.violations(plan, {"dp": dp, "tp": 2, simulator.MB: m}, rng)
                    if v[0] == "gi"}
    assert (not bad) == proved
    if not proved:
        findings = out["plans"][0]["findings"]
        assert len(findings) == 1


def test_tokens_beside_a_sum_loss_change_nothing(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(data="ddp", lines="override loss: sum\n  override tokens: equal"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL506]" in err and "sum over tokens" in err


@pytest.mark.parametrize("line,words", [
    ("override process_group: reduce over (dp)", "'process_group' is not modelled"),
    ("override one_rank: clip", "'one_rank' is not modelled"),
    ("override expert_tensor: reduce over (tp)", "'expert_tensor' is not modelled"),
])
def test_out_of_scope_vocabulary_is_refused_with_a_location(tmp_path, capsys, line, words):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(data="ddp", lines=line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL129]" in err and words in err and "s.place:8:3" in err and "Traceback" not in err


EVERY = """from std.data import ddp, zero1, zero2
model {{ params = 1000  microbatches = {m} }}
mesh {{ dp = 4 }}
plan p {{
  dp: {data}
  {lines}
}}
"""


@pytest.mark.parametrize("data", ["ddp", "zero1"])
def test_reduce_every_microbatch_keeps_the_verdict(tmp_path, capsys, data):
    """Reducing after every microbatch reduces each microbatch's gradient once: the verdict is the simulator's
    and the one without the override, here and with a wrong divisor beside it."""
    for extra, proved in (("", True), ("\n  override grads: divide by dp", False)):
        text = EVERY.format(m="m", data=data, lines="override grads: reduce_every_microbatch" + extra)
        status, _ = _check(tmp_path, capsys, text.replace("model {", "let m = 4\nmodel {"))
        assert status == (0 if proved else 1)
        plan = load_string(text.replace("model {", "let m = 4\nmodel {")).plan("p")
        bad = set()
        for dp in (1, 2, 3):
            for m in (1, 2, 3):
                bad |= {v for v in simulator.violations(plan, {"dp": dp, simulator.MB: m}, random.Random(3))
                        if v[0] == "gi"}
        assert (not bad) == proved


@pytest.mark.parametrize("m,data,lines,words", [
    ("1", "ddp", "override grads: reduce_every_microbatch", "one microbatch per step"),
    ("4", "zero2", "override grads: reduce_every_microbatch", "made after each microbatch already"),
    ("4", "ddp", "override grads[norms]: reduce_every_microbatch", "reduced as one"),
    ("4", "ddp", "override grads: reduce_every_microbatch\n  override grads: no_accumulation_buffer",
     "no accumulation buffer is needed"),
])
def test_reduce_every_microbatch_that_changes_nothing_is_pl506(tmp_path, capsys, m, data, lines, words):
    f = tmp_path / "s.place"
    f.write_text(EVERY.format(m=m, data=data, lines=lines))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL506]" in err and words in err, err
