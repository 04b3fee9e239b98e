"""A loss term added, or scaled, on some ranks only, and the grad norm's epsilon added on some ranks only, as
`placement trace` lifts them (trace/lift_termranks.py).

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json, 2 data ranks) by hand, each edit an
independent statement of what one rank did: the balancing loss (test_trace_auxloss's routed trace, its value from
the definition E · Σ f_i P_i) left out on rank 1 or given another coefficient there, a z-loss (test_trace_terms's)
on rank 0 alone, an epsilon on one rank's norm piece (test_trace_perrank's norm all-reduce). The statement expected
is the rank set the test edited; what no statement holds is named (PL614), never proved. The slow ones run
examples/traced/moe_aux_rank0.py and fsdp_clip_eps.py and require each verdict at the script line that caused it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_trace_auxloss import GATHERED, _routed
from test_trace_perrank import _norm_reduced, run, stored
from test_trace_terms import _line, _with_term

from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.trace.lift import lift
from placement_logic.trace.lift_layout import _Layout
from placement_logic.trace.lift_termranks import rank_set

ROOT = Path(__file__).resolve().parent.parent
AUX = "an auxiliary loss"


def _plan(text: str) -> list[str]:
    return [x.split("  #")[0] for x in text.split("\nplan ")[1].splitlines()[1:-1]]


def _rank_set(layout, present, among=None):
    return rank_set(layout, set(present), set(layout.coords) if among is None else set(among))


def test_a_rank_set_is_read_on_one_axis_else_over_the_axes_the_ranks_differ_on():
    """A 2 x 3 mesh (rows a, columns b; rank = 3·a + b): membership by one coordinate is a set of that axis, by
    both the process group's indices (a most significant); every rank, or one that a coordinate cannot tell, too."""
    layout = _Layout(["a", "b"], [2, 3], [[0, 1, 2], [3, 4, 5]])
    assert _rank_set(layout, {0, 3}) == (("b",), (0,))          # b == 0
    assert _rank_set(layout, {3, 4, 5}) == (("a",), (1,))       # a == 1
    assert _rank_set(layout, {0, 2, 3, 5}) == (("b",), (0, 2))  # b in (0, 2)
    assert _rank_set(layout, {0}) == (("a", "b"), (0,))         # rank 0 of the world
    assert _rank_set(layout, {1, 5}) == (("a", "b"), (1, 5))
    assert _rank_set(layout, {0, 1}, among={0, 1, 2}) == (("b",), (0, 1))  # among one row: b alone differs
    assert rank_set(layout, {0}, set(layout.coords), allowed=("b",)) is None  # rank 0 alone needs a too


def _absent(trace: dict, rank: int) -> dict:
    """``rank`` adds no term to its cross-entropy (its loss the cross-entropy alone)."""
    for st in trace["ranks"][rank]["steps"]:
        st["terms"] = []
        st["losses"][0]["value"] = st["nll"][0]["value"]
    return trace


def _scaled(trace: dict, rank: int, factor: float, step: int | None = None) -> dict:
    """``rank``'s term (on ``step``, else every step) times ``factor``."""
    for st in trace["ranks"][rank]["steps"]:
        if step is None or st["step"] == step:
            t = st["terms"][0]
            st["losses"][0]["value"] += t["other"] * (factor - 1)
            t["other"] *= factor
    return trace


@pytest.mark.parametrize("edit,stated", [
    (lambda t: _absent(t, 1), "override loss[aux]: on_ranks over (dp) ranks (0)"),
    (lambda t: _absent(t, 0), "override loss[aux]: on_ranks over (dp) ranks (1)"),
    (lambda t: _scaled(t, 1, 0.5), "override loss[aux]: divide_on_ranks over (dp) ranks (1) by 2"),
    (lambda t: _scaled(t, 0, 0.25), "override loss[aux]: divide_on_ranks over (dp) ranks (0) by 4"),
    (lambda t: _scaled(t, 1, 0.4), "override loss[aux]: divide_on_ranks over (dp) ranks (1) by 5 / 2"),
    (lambda t: t, None),
], ids=["rank0-only", "rank1-only", "halved-on-1", "quartered-on-0", "0.4-on-1", "every-rank"])
def test_the_balancing_loss_on_some_ranks_is_a_rank_set(edit, stated):
    out = lift(edit(_routed(GATHERED, gathered=True)))
    assert not out.unliftable, out.unliftable
    lines = [x for x in _plan(out.text) if "on_ranks" in x]
    assert lines == ([f"  {stated}"] if stated else []), out.text
    assert "the balancing loss, 0.01 · E · Σ f·P" in out.text  # the larger coefficient: the term as written
    assert "  override loss[aux]: stats_per_step over (dp)" in _plan(out.text)
    # the lifted spec: a term weighted 0 or 1/X on some devices and 1 on the others is not single-device training's
    spec = load_string(out.text, "lifted.place")
    report = check_spec(spec, ["traced"], timeout=20).plans[0]
    ob = next(o for o in report.obligations if o.name == "GI loss[aux] grads[moe_router]")
    assert ob.verdict is (Verdict.REFUTED if stated else Verdict.PROVED), ob.unknown


@pytest.mark.parametrize("edit,why", [
    (lambda t: _absent(_scaled(t, 0, 0.5, step=0), 1), "coefficient differs between steps"),
    (lambda t: _scaled(_absent(t, 1), 0, 0.5, step=1), "coefficient differs between steps"),
], ids=["scaled-on-one-step", "absent-and-scaled-later"])
def test_a_balancing_loss_no_rank_set_holds_is_named(edit, why):
    out = lift(edit(_routed(GATHERED, gathered=True)))
    assert "loss[aux]" not in out.text and "aux_stats" not in out.text, out.text
    named = [u for u in out.unliftable if u.what == AUX]
    assert named and why in named[0].reason, out.unliftable


def test_a_balancing_loss_added_on_other_ranks_on_other_steps_is_named():
    trace = _routed(GATHERED, gathered=True)
    for part in trace["ranks"]:  # rank 0 adds it on its first step, rank 1 on its last
        st = part["steps"][-1] if part["rank"] == 0 else part["steps"][0]
        st["terms"] = []
        st["losses"][0]["value"] = st["nll"][0]["value"]
    out = lift(trace)
    assert "loss[aux]" not in out.text
    assert [u for u in out.unliftable if u.what == AUX and "other ranks on other steps" in u.reason]


def test_a_z_loss_on_rank_0_only_is_named_never_lifted_as_every_ranks():
    """1e-4 · lse² on rank 0, nothing on rank 1: no statement holds a cross-entropy term on some ranks."""
    out = lift(_absent(_with_term(stored(), 1e-4), 1))
    named = [u for u in out.unliftable if u.what == AUX]
    assert named and "on ranks [0] of the 2 that compute the loss" in named[0].reason, out.unliftable
    assert 'unobserved "an auxiliary loss' in out.text


def test_label_smoothing_on_one_rank_only_is_named():
    trace = stored()
    for st in trace["ranks"][0]["steps"]:
        st["nll"][0]["label_smoothing"] = 0.1
    out = lift(trace)
    assert [u for u in out.unliftable if u.what == AUX and u.reason.startswith("label smoothing on ranks [0]")]


def _eps_on(trace: dict, values: dict[int, float]) -> dict:
    """The norm all-reduce of test_trace_perrank, each rank's offset ``values[rank]`` (0: none)."""
    trace = _norm_reduced(trace, 1.0)
    for part in trace["ranks"]:
        rec = next(c for c in part["collectives"] if c["seq"] == 900)
        if values[part["rank"]]:
            rec["offset"] = dict(rec["offset"], value=values[part["rank"]])
        else:
            del rec["offset"]
    return trace


@pytest.mark.parametrize("values,stated", [
    ({0: 1e-6, 1: 0.0}, "override clip_norm: eps_on_ranks over (dp) ranks (0) by 1e-06"),
    ({0: 0.0, 1: 1e-6}, "override clip_norm: eps_on_ranks over (dp) ranks (1) by 1e-06"),
    ({0: 1e-6, 1: 1e-6}, "override clip_norm: eps_before_reduce by 1e-06"),
    ({0: 1e-6, 1: 2e-6}, None),
], ids=["rank0", "rank1", "every-rank", "two-epsilons"])
def test_an_epsilon_on_some_ranks_norm_pieces_is_eps_on_ranks(values, stated):
    out = lift(_eps_on(stored(), values))
    lines = [x for x in out.text.splitlines() if x.startswith("  override clip_norm: eps_")]
    assert [x.split("  #")[0] for x in lines] == ([f"  {stated}"] if stated else []), out.text
    if stated:
        assert lines[0].endswith("examples/traced/ddp_summed.py:30")  # the addition, not the all-reduce
    named = [u for u in out.unliftable if u.what == "the grad norm's epsilon"]
    assert bool(named) == (stated is None), out.unliftable


# --------------------------------------------------------------------------- slow: the examples

SCRIPTS = [
    # script, ranks, arguments, exit, the lifted line, the refuted obligation, the text of the script line it names
    ("moe_aux_rank0.py", 2, [], 1, "override loss[aux]: on_ranks over (dp) ranks (0)", "GI loss[aux] grads[moe_router]",
     "loss = loss + coef * aux"),
    ("moe_aux_rank0.py", 2, ["--scaled"], 1, "override loss[aux]: divide_on_ranks over (dp) ranks (1) by 2",
     "GI loss[aux] grads[moe_router]", "loss = loss + coef * aux"),
    ("moe_aux_rank0.py", 2, ["--every-rank"], 0, None, None, None),
    ("fsdp_clip_eps.py", 4, [], 1, "override clip_norm: eps_on_ranks over (dp) ranks (0, 2) by 1e-06",
     "SC clip_norm", "sq = sq + EPS"),
    ("fsdp_clip_eps.py", 4, ["--rank0"], 0, "override clip_norm: eps_on_ranks over (dp) ranks (0) by 1e-06", None,
     None),
    ("fsdp_clip_eps.py", 4, ["--every-rank"], 1, "override clip_norm: eps_before_reduce by 1e-06", "SC clip_norm",
     "sq = sq + EPS"),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,nproc,argv,status,lifted,obligation,where", SCRIPTS,
                         ids=[" ".join([s[0], *s[2]]) for s in SCRIPTS])
def test_a_term_or_an_epsilon_on_some_ranks_is_lifted_and_judged(script, nproc, argv, status, lifted, obligation,
                                                                  where, tmp_path, monkeypatch):
    """The balancing loss added on rank 0 alone, or halved on rank 1, refuted at the line that adds it; on every
    rank proved. The norm's epsilon on each node's first rank (2 of 4) refuted at the addition, on rank 0 alone
    proved (the sum holds it once, as single-device training's norm), on every rank refuted."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", str(nproc), "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    ranked = [x for x in _plan(text) if "on_ranks" in x or "eps_before_reduce" in x]
    assert ranked == ([f"  {lifted}"] if lifted else []), text
    if status == 0:
        assert "proved for all mesh sizes" in out
    else:
        assert f"examples/traced/{script}:{_line(script, where)}: refuted {obligation}: " in out, out
