"""Clip coefficients of different values on ranks that hold replicas of a gradient, as `placement trace` reads
them (trace/lift_clipvalues.py): named (PL614), never proved.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json: 2 data ranks, every gradient
all-reduced over them, so both ranks hold the same gradient) by hand: each rank scales every gradient by a clip
coefficient whose value the test chooses. Equal values are the clip every replica applies alike (nothing named);
different values make the replicas drift apart, which no statement holds (named at the scaling line, and the lifted
spec proves nothing). The slow one runs examples/traced/ddp_clip_eps_rank0.py, an epsilon added to rank 0's own
squared norm where no norm all-reduce follows, and its fix; and examples/traced/hsdp_clip_eps_after.py, an epsilon
added on some ranks after the norm's all-reduce (every rank of a group holding the same sum), and its fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_trace_perrank import AT, _norm_reduced, _params, run, stored

from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.trace.lift import lift
from placement_logic.trace.lift_clipvalues import WHAT
from placement_logic.trace.schema import load_trace

ROOT = Path(__file__).resolve().parent.parent


def _coef(trace: dict, values: dict[int, float | None]) -> dict:
    """Rank r scales every gradient by a data-dependent coefficient of value ``values[r]`` (None: no clip)."""
    for r, v in values.items():
        if v is None:
            continue
        for p in _params(trace, r):
            if p.get("grad") is not None:
                g = p["grad"]
                g["dynamic_scales"].append("after_backward")
                g["dynamic_at"].append(dict(AT, code="g.mul_(coef)"))
                g.setdefault("dynamic_values", []).append(v)
    return trace


def _named(out) -> list:
    return [u for u in out.unliftable if u.what == WHAT]


def test_different_coefficients_on_replicas_are_named_at_the_scaling_line_and_never_proved():
    out = lift(_coef(stored(), {0: 0.5, 1: 0.25}))
    (item,) = _named(out)
    assert item.ranks == (0, 1) and item.where == "examples/traced/ddp_summed.py:31", item
    assert "rank 0: 0.5, rank 1: 0.25" in item.reason and "all-reduced over dp" in item.reason
    assert f'unobserved "{WHAT} (not lifted' in out.text
    report = check_spec(load_string(out.text, "lifted.place"), ["traced"], timeout=20).plans[0]
    assert report.obligations and not [o.name for o in report.obligations if o.verdict is Verdict.PROVED]


@pytest.mark.parametrize("values", [
    {0: 0.5, 1: 0.5},     # the same coefficient on every replica: the clip of single-device training
    {0: None, 1: None},   # no clip
], ids=["equal", "no-clip"])
def test_equal_coefficients_on_replicas_are_nothing(values):
    out = lift(_coef(stored(), values))
    assert not out.unliftable, out.unliftable


def test_a_clip_on_rank_0_alone_stays_clip_rank0_only():
    """One rank applies a coefficient, the other none: ``lift_perrank``'s statement, not a difference of values."""
    out = lift(_coef(stored(), {0: 0.5, 1: None}))
    assert not _named(out)
    assert "  override grads: clip_rank0_only over (dp)" in [x.split("  #")[0] for x in out.text.splitlines()]


def _groups(trace: dict, inputs: dict[int, float | None], groups: dict[int, list[int]]) -> dict:
    """On every step rank r all-reduces its squared norm ``inputs[r]`` (None: not recorded) over ``groups[r]``."""
    for r, part in enumerate(trace["ranks"]):
        for i, st in enumerate(part["steps"]):
            part["collectives"].append({
                "seq": 900 + i, "step": st["step"], "phase": "after_backward", "kind": "all_reduce",
                "ranks": groups[r], "stack": [dict(AT, function="<module>", code="dist.all_reduce(sq)")],
                "dtype": "float32", "bytes": 4, "numel": 1, "op": "sum", "api": "c10d.allreduce_", "carried": [],
                "inputs_reduced": [], "value_in": inputs[r]})
    return trace


def test_coefficients_differing_after_a_norm_summed_over_the_axis_are_named():
    """One norm all-reduce over dp: both ranks hold the same sum (2.5 + 2.5 = 5), so coefficients 0.5 and 0.25
    arise after the sum (``dist.all_reduce(sq); if rank == 0: sq += eps``): named, never proved."""
    out = lift(_coef(_groups(stored(), {0: 2.5, 1: 2.5}, {0: [0, 1], 1: [0, 1]}), {0: 0.5, 1: 0.25}))
    (item,) = _named(out)
    assert "from equal norm sums" in item.reason and "rank 0: 0.5, rank 1: 0.25" in item.reason, item
    report = check_spec(load_string(out.text, "lifted.place"), ["traced"], timeout=20).plans[0]
    assert not [o.name for o in report.obligations if o.verdict is Verdict.PROVED]


def test_an_epsilon_before_the_sum_on_one_rank_changes_no_coefficient_and_keeps_eps_on_ranks():
    """1e-6 added to rank 0's piece before the all-reduce over dp: inside the sum, so both ranks' coefficients are
    equal (nothing named here) and the epsilon stays ``eps_on_ranks``."""
    trace = _norm_reduced(stored(), None, clipped=False)
    (c,) = [c for c in trace["ranks"][0]["collectives"] if c["seq"] == 900]
    c["offset"] = {"value": 1e-6, "at": dict(AT, line=30, code="sq = sq + eps")}
    out = lift(_coef(trace, {0: 0.5, 1: 0.5}))
    assert not _named(out), out.unliftable
    assert any(x.startswith("  override clip_norm: eps_on_ranks over (dp) ranks (0) by 1e-06") for x in
               out.text.splitlines()), out.text


def test_coefficients_from_different_sums_are_left_to_the_norm_statements():
    """Each rank sums its squared norm over a group of its own (2.5 on rank 0, 10 on rank 1): different sums, so
    different coefficients are the norm's reduction, which its own statement holds, not a departure after it."""
    trace = _groups(stored(), {0: 2.5, 1: 10.0}, {0: [0], 1: [1]})
    assert not _named(lift(_coef(trace, {0: 0.5, 1: 0.25})))


def test_coefficients_from_sums_that_cannot_be_recomputed_are_named():
    """Rank 1's input to the norm all-reduce is not recorded: the sums cannot be compared, so the different
    coefficients are named, never left to a statement that may not hold them."""
    trace = _groups(stored(), {0: 2.5, 1: None}, {0: [0, 1], 1: [0, 1]})
    (item,) = _named(lift(_coef(trace, {0: 0.5, 1: 0.25})))
    assert "cannot recompute" in item.reason, item


def test_gradients_not_all_reduced_are_no_replicas():
    """Each rank's own gradient (no all-reduce over dp): coefficients of different values are no departure here."""
    trace = _coef(stored(), {0: 0.5, 1: 0.25})
    for r in (0, 1):
        for p in _params(trace, r):
            if p.get("grad") is not None:
                p["grad"]["collectives"] = []
    assert not _named(lift(trace))


def test_a_trace_with_coefficient_values_is_read_back(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_coef(stored(), {0: 0.5, 1: 0.25})))
    assert _named(lift(load_trace(str(path))))


def _line(text: str, script: str = "ddp_clip_eps_rank0.py") -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)



@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status", [([], 3), (["--every-rank"], 0)], ids=["rank0", "every-rank"])
def test_an_epsilon_on_rank_0s_own_norm_is_named_never_proved(argv, status, tmp_path, monkeypatch):
    """The epsilon on rank 0 alone: the replicas' coefficients differ, named at the scaling line (PL614), no
    obligation proved; on every rank: proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    got, out, err = run(["trace", "--nproc", "2", "--check", "--", "python",
                         "examples/traced/ddp_clip_eps_rank0.py", *argv])
    assert got == status, out + err
    if status == 0:
        assert "proved for all mesh sizes" in out and "[PL614]" not in err, out + err
    else:
        at = f"examples/traced/ddp_clip_eps_rank0.py:{_line('g.mul_(coef)')}:1: error: not lifted: {WHAT}"
        assert at in err and "[PL614]" in err, err
        assert "\n0 proved, 0 refuted, " in out and "UNKNOWN" in out, out


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status", [([], 3), (["--every-rank"], 0)], ids=["main-process", "every-rank"])
def test_an_epsilon_after_the_norm_all_reduce_is_named_never_proved(argv, status, monkeypatch):
    """HSDP, the squared norm all-reduced over groups spanning both axes, then an epsilon on the node-local rank 0
    (ranks 0 and 1) after the sum: the replicas along replicate (ranks 0 and 2) clip by different coefficients,
    named at the scaling line (PL614), nothing proved; the epsilon on every rank: proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    got, out, err = run(["trace", "--nproc", "4", "--check", "--", "python",
                         "examples/traced/hsdp_clip_eps_after.py", *argv])
    assert got == status, out + err
    if status == 0:
        assert "proved for all mesh sizes" in out and "[PL614]" not in err, out + err
    else:
        at = (f"examples/traced/hsdp_clip_eps_after.py:{_line('g.mul_(coef)', 'hsdp_clip_eps_after.py')}:1: "
              f"error: not lifted: {WHAT} (the step, ranks 0, 2)")
        assert at in err and "from equal norm sums" in err and "[PL614]" in err, err
        assert "\n0 proved, 0 refuted, " in out and "UNKNOWN" in out, out
