"""Clip coefficients of different values on ranks that hold replicas of a gradient, as `placement trace` reads
them (trace/lift_clipvalues.py): named (PL614), never proved.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json: 2 data ranks, every gradient
all-reduced over them, so both ranks hold the same gradient) by hand: each rank scales every gradient by a clip
coefficient whose value the test chooses. Equal values are the clip every replica applies alike (nothing named);
different values make the replicas drift apart, which no statement holds (named at the scaling line, and the lifted
spec proves nothing). The slow one runs examples/traced/ddp_clip_eps_rank0.py, an epsilon added to rank 0's own
squared norm where no norm all-reduce follows, and its fix.
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


def test_coefficients_from_a_norm_summed_over_the_axis_are_left_to_the_norm_statements():
    """A norm all-reduced over dp (its epsilon, its reduction): those statements hold the coefficients."""
    trace = _norm_reduced(stored(), 1e-6, clipped=False)
    out = lift(_coef(trace, {0: 0.5, 1: 0.25}))
    assert not _named(out), out.unliftable


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


def _line(text: str) -> int:
    lines = (ROOT / "examples" / "traced" / "ddp_clip_eps_rank0.py").read_text().splitlines()
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
