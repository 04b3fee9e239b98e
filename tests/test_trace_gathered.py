"""A loss computed on a sequence all-gathered over a context axis, lifted from a trace (``lift_gathered``).

The fast tests edit the stored trace of examples/traced/sp_gathered_loss.py ``--fixed``
(tests/data/traces/sp_gathered_loss.json: 4 ranks, dp=2 x sp=2 from the script's DeviceMesh; each step the logits
all-gathered over sp (ranks {0, 1} and {2, 3}) in forward, the cross-entropy on the gathered logits, the token
count all-reduced over dp (ranks {0, 2} and {1, 3}), the gradients all-reduced over the world): the statements
each record implies, and the verdict `placement check` gives them; what the records cannot tell is named (PL614),
never proved. The slow tests run the script.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "sp_gathered_loss.json"
SCRIPT = "examples/traced/sp_gathered_loss.py"
GATHERED = "override loss: on_gathered_sequence over (sp)"
WHAT = "the loss over a gathered sequence"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _plan(text: str) -> list[str]:
    body = text.split("plan traced {")[1].split("}")[0]
    return [x.split("  #")[0].strip() for x in body.splitlines() if x.strip()]


def _traced() -> dict:
    return json.loads(STORED.read_text())


def _count_over_world(trace: dict) -> dict:
    """The bug by hand: the count all-reduced over the world instead of dp. Every sp rank holds the whole
    sequence's count, so the world sum is sp = 2 times the dp sum; the script's loss (loss_sum · world / count)
    is then half of what it was."""
    for part in trace["ranks"]:
        for c in part["collectives"]:
            if c["kind"] == "all_reduce" and c["phase"] == "forward" and c["numel"] == 1:
                c["ranks"], c["value_out"] = [0, 1, 2, 3], c["value_out"] * 2
        for st in part["steps"]:
            for loss in st["losses"]:
                loss["value"] /= 2
    return trace


def test_the_stored_records_are_what_the_script_does():
    """The record the lift reads: the cross-entropy of every rank and step reads that step's forward all-gather over
    its sp pair, and each sp pair's count is the same (the whole sequence's)."""
    trace = _traced()
    for part in trace["ranks"]:
        pair = sorted({part["rank"], part["rank"] ^ 1})  # the sp neighbour: rank = 2·dp + sp
        for st in part["steps"]:
            gathers = [c["seq"] for c in part["collectives"] if c["step"] == st["step"] and c["kind"] == "all_gather"
                       and c["phase"] == "forward" and c["ranks"] == pair]
            assert len(gathers) == 1 and st["nll"][0]["input_collectives"] == gathers
    tokens = {(p["rank"], s["step"]): s["nll"][0]["tokens"] for p in trace["ranks"] for s in p["steps"]}
    assert all(tokens[(r, k)] == tokens[(r ^ 1, k)] for r, k in tokens)


def test_the_gathered_loss_is_lifted_at_the_gather():
    lifted = lift(_traced())
    plan = _plan(lifted.text)
    assert plan == ["dp: ddp", "sp: context_parallel", "override tokens: reduce over (dp)", GATHERED], lifted.text
    assert not lifted.unliftable, lifted.unliftable
    line = next(x for x in lifted.text.splitlines() if GATHERED in x)
    gather = next(i for i, x in enumerate((ROOT / SCRIPT).read_text().splitlines(), 1) if "all_gather_into_tensor" in x)
    assert line.endswith(f"{SCRIPT}:{gather}"), line


def test_the_count_over_the_world_is_stated_with_both_axes():
    """Reduced over every data and context axis, the count is still stated (the derived count under the gather is
    reduced over dp only)."""
    lifted = lift(_count_over_world(_traced()))
    assert _plan(lifted.text) == ["dp: ddp", "sp: context_parallel", "override tokens: reduce over (dp, sp)",
                                  GATHERED], lifted.text
    assert not lifted.unliftable, lifted.unliftable


def _drop_link(trace: dict, ranks: set[int]) -> dict:
    for part in trace["ranks"]:
        if part["rank"] in ranks:
            for st in part["steps"]:
                for n in st["nll"]:
                    n.pop("input_collectives", None)
    return trace


@pytest.mark.parametrize("ranks", [{0, 1, 2, 3}, {3}])
def test_a_loss_not_shown_to_read_the_gather_is_named(ranks):
    """A cross-entropy whose logits do not show the gathered output (a head applied after the gather, a record
    without the link) on some rank: whether the loss is on the gathered sequence is named, no gathered statement."""
    lifted = lift(_count_over_world(_drop_link(_traced(), ranks)))
    assert GATHERED not in lifted.text and "context_parallel" not in lifted.text, lifted.text
    named = [u for u in lifted.unliftable if u.what == WHAT]
    assert len(named) == 1 and set(named[0].ranks) == ranks and "not observed" in named[0].reason, lifted.unliftable
    assert f'unobserved "{WHAT}' in lifted.text


def _no_padding(trace: dict) -> dict:
    """Every position labelled: 16 tokens on every rank (2 sequences of 8), the count all-reduced over dp 32, the
    script's loss loss_sum · 4 / 32."""
    for part in trace["ranks"]:
        for st in part["steps"]:
            n = st["nll"][0]
            n["tokens"] = n["positions"] = 16
            st["losses"][0]["value"] = n["value"] * 4 / 32
        for c in part["collectives"]:
            if c["kind"] == "all_reduce" and c["phase"] == "forward" and c["numel"] == 1:
                c["value_in"], c["value_out"] = 16.0, 32.0
    return trace


def test_equal_counts_under_the_gather_still_state_the_count():
    """Every rank holding the same count is no `tokens: equal` here: the count's axes are stated, as the derived
    count under the gather is reduced over dp alone."""
    lifted = lift(_no_padding(_traced()))
    assert _plan(lifted.text) == ["dp: ddp", "sp: context_parallel", "override tokens: reduce over (dp)",
                                  GATHERED], lifted.text


def test_a_count_never_all_reduced_is_named():
    """A divided loss whose count is not observed all-reduced: which ranks' counts it holds is named."""
    trace = _traced()
    for part in trace["ranks"]:
        part["collectives"] = [c for c in part["collectives"] if not (c["kind"] == "all_reduce"
                                                                      and c["phase"] == "forward")]
    lifted = lift(trace)
    named = [u for u in lifted.unliftable if u.what == WHAT]
    assert len(named) == 1 and "not observed all-reduced" in named[0].reason, lifted.unliftable
    assert f'unobserved "{WHAT}' in lifted.text


def test_a_gather_over_two_axes_is_named():
    trace = _traced()
    for part in trace["ranks"]:
        for c in part["collectives"]:
            if c["kind"] == "all_gather":
                c["ranks"] = [0, 1, 2, 3]
    lifted = lift(trace)
    named = [u for u in lifted.unliftable if u.what == WHAT]
    assert len(named) == 1 and "two axes" in named[0].reason and GATHERED not in lifted.text, lifted.unliftable


def test_a_parameter_gather_is_no_sequence_gather():
    """An all-gather carrying a parameter (FSDP's) is no sequence gather: the axis stays a data axis."""
    trace = _traced()
    for part in trace["ranks"]:
        for c in part["collectives"]:
            if c["kind"] == "all_gather":
                c["carried"] = ["1.weight"]
    lifted = lift(trace)
    assert GATHERED not in lifted.text and "sp: ddp" in _plan(lifted.text), lifted.text
    assert not [u for u in lifted.unliftable if u.what == WHAT]


@pytest.mark.parametrize("edit,status,verdict", [
    (lambda t: t, 0, "PROVED"),
    (_count_over_world, 1, "REFUTED"),
    (lambda t: _drop_link(_count_over_world(t), {3}), 3, "UNKNOWN"),
    (_no_padding, 0, "PROVED"),
])
def test_the_lifted_plans_verdicts(edit, status, verdict, tmp_path):
    """The count over dp proved; over dp and sp refuted for its root cause (every token counted sp times); a loss
    not shown to read the gather: unknown with the fact named, never proved (the count over the world would
    otherwise be read as a data axis's, as derived)."""
    spec = tmp_path / "lifted.place"
    spec.write_text(lift(edit(_traced())).text)
    got, out, err = run(["check", str(spec)])
    assert got == status and out.rstrip().endswith(verdict), out + err
    if verdict == "REFUTED":
        assert "root cause: GI grads[dense] normalisation" in out and "counts every token sp times" in out, out
    if verdict == "UNKNOWN":
        assert "0 proved" in out and f"{WHAT} (not lifted" in out, out


# --------------------------------------------------------------------------- slow: the example

def _line(text: str) -> int:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,tokens", [
    ([], 1, "override tokens: reduce over (dp, sp)"),
    (["--fixed"], 0, "override tokens: reduce over (dp)"),
])
def test_the_gathered_loss_is_traced_and_judged(argv, status, tokens, tmp_path, monkeypatch):
    """The count over the world refuted at the count's all-reduce; over dp proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "4", "--check", "--spec-file", str(spec), "--", "python", SCRIPT, *argv])
    assert got == status and "[PL614]" not in err, out + err
    plan = _plan(spec.read_text())
    assert "sp: context_parallel" in plan and GATHERED in plan and tokens in plan, plan
    if status == 0:
        assert "proved for all mesh sizes" in out
    else:
        assert f"{SCRIPT}:{_line('dist.all_reduce(count')}: refuted GI grads[dense] normalisation: " in out, out
