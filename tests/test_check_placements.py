"""Verdicts that follow from placements and from the vocabulary the semantics reads:
each case is a plan the old role-only checker proved, with the condition the step
semantics (docs/semantics.md) says it breaks, or a correct plan it refuted."""

from __future__ import annotations

from fractions import Fraction

import pytest
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.report import Verdict
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.solver.session import Session

SESSION = Session(timeout=10)


def verdicts(spec, p, pinned=None):
    r = check_plan(SESSION, spec, p, pinned or {})
    return {o.name: o.verdict for o in r.obligations}, r


def refuted(spec, p):
    v, _ = verdicts(spec, p)
    return {n for n, x in v.items() if x is Verdict.REFUTED}


def test_params_sharded_on_a_data_axis_and_never_gathered():
    spec, p = plan("p", {"dp": ("data", "S,S,S,R")})
    assert "SC params usable over dp" in refuted(spec, p)


def test_params_offloaded_in_pieces_on_a_context_axis():
    spec, p = plan("p", {"cp": ("context", "O,O,S,S")})
    assert "SC params usable over cp" in refuted(spec, p)


@pytest.mark.parametrize("axes,bad", [((), True), (("dp",), False), (("dp", "dp"), True)],
                         ids=["never", "once", "twice"])
def test_sharded_with_gather_means_gathered_exactly_once(axes, bad):
    spec, p = plan("p", {"dp": ("data", "S*,S,S,R")}, overrides=(ov("params", "gather", None, axes),))
    v, r = verdicts(spec, p)
    assert (v["SC params gathered over dp"] is Verdict.REFUTED) == bad
    if bad:
        ob = next(o for o in r.obligations if o.name == "SC params gathered over dp")
        assert ob.counterexample is not None and "forward output" in ob.counterexample.equation


def test_reduce_scattered_grads_with_a_replicated_optimizer():
    spec, p = plan("p", {"dp": ("data", "R,R,S,R")})
    assert "SC optimizer step over dp" in refuted(spec, p)
    spec, p = plan("p", {"dp": ("data", "R,S,R,R")})  # ZeRO-1: each rank steps its own shard
    assert not refuted(spec, p)


def test_tensor_axis_with_whole_params_is_replicated_not_sharded():
    """Params R over a tensor axis: every rank computes the whole layer on the same tokens,
    so reducing the gradient over it multiplies it by the axis size."""
    spec, p = plan("p", {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "R,R,R,R")},
                   overrides=(ov("grads", "reduce", "dense", ("dp", "tp")),))
    assert "GI grads[dense]" in refuted(spec, p)
    spec, p = plan("p", {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")},
                   overrides=(ov("grads", "reduce", "dense", ("dp", "tp")),))
    assert "GI grads[dense]" in refuted(spec, p)  # sharded: sums different elements


def test_cancelling_errors_are_proved_with_a_note():
    spec, p = plan("p", {"dp": ("data", "R,R,R,R")},
                   overrides=(ov("grads", "reduce", None, ("dp", "dp")), ov("grads", "divide", None, by=ir.Sym("dp"))))
    v, r = verdicts(spec, p)
    assert r.verdict is Verdict.PROVED
    dense = next(o for o in r.obligations if o.name == "GI grads[dense]")
    assert any("errors cancel" in n for n in dense.notes)


def test_a_repeated_token_reduction_multiplies_the_count():
    spec, p = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("tokens", "reduce", None, ("dp", "dp")),))
    assert "GI grads[dense]" in refuted(spec, p)
    spec, p = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("tokens", "reduce", None, ("dp",)),))
    assert not refuted(spec, p)


def test_equal_token_counts_make_a_per_device_mean_exact():
    spec, p = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("loss", "per_device_mean"),))
    assert "GI grads[dense]" in refuted(spec, p)
    spec, p = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("loss", "per_device_mean"), ov("tokens", "equal")))
    assert not refuted(spec, p)


def test_clip_norm_override_for_one_group_only():
    """ZeRO-2: the squared norm must be summed over dp; summing only the norms group's part
    over dp leaves the dense gradients clipped locally."""
    base = {"dp": ("data", "R,S,S,R")}
    spec, p = plan("p", base, overrides=(ov("clip_norm", "reduce", "norms", ("dp",)),))
    assert not refuted(spec, p)  # norms over dp, every other group as derived (dp)
    spec, p = plan("p", base, overrides=(ov("clip_norm", "reduce", "dense", ()),))
    assert "SC clip_norm" in refuted(spec, p)


def test_double_count_without_a_group_counts_every_group_twice():
    spec, p = plan("p", {"dp": ("data", "R,S,S,R")}, overrides=(ov("clip_norm", "double_count"),))
    assert "SC clip_norm" in refuted(spec, p)


def test_transient_params_are_a_diagnostic():
    spec, p = plan("p", {"dp": ("data", "M,R,R,R")})
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL505"


@pytest.mark.parametrize("o", [ov("grads", "reduce", "experts", ("dp",)), ov("params", "no_fetch"),
                               ov("params", "no_regather"), ov("embedding", "tie_reduce", None, ("pp",))],
                         ids=["absent-group", "no-fetch-on-device", "no-regather-needed", "tie-without-tie"])
def test_an_override_that_changes_nothing_is_an_error(o):
    spec, p = plan("p", {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}, overrides=(o,))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL506"


DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
TP_SUM = ov("clip_norm", "reduce", None, ("tp",))


@pytest.mark.parametrize("overrides,code", [
    ((ov("clip_norm", "dedupe", "norms", ("tp",)),), "PL506"),  # the derived reduction filters already
    ((TP_SUM, ov("clip_norm", "dedupe", "norms", ("dp",))), "PL506"),  # dp is not summed
    ((TP_SUM, ov("clip_norm", "dedupe", "norms", ())), "PL506"),  # no axis
    ((TP_SUM, ov("clip_norm", "dedupe", "norms", ("tp", "tp"))), "PL506"),  # tp twice
    ((TP_SUM, ov("clip_norm", "dedupe", "dense", ("tp",))), "PL150"),  # dense is sharded over tp
], ids=["beside-derived", "axis-not-summed", "no-axis", "axis-twice", "sharded-group"])
def test_a_duplicate_filter_that_filters_nothing_is_an_error(overrides, code):
    spec, p = plan("p", DDP_TP, overrides=overrides)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == code


def test_a_written_norm_reduction_is_a_plain_sum_and_the_filter_is_stated():
    """Norms and biases are replicated over tp: the derived reduction over tp filters their copies
    (and says so in a note); a written `reduce over (tp)` counts every copy until `dedupe` states the
    filter."""
    spec, p = plan("p", DDP_TP)
    v, r = verdicts(spec, p)
    assert v["SC clip_norm"] is Verdict.PROVED
    note = [n for o in r.obligations if o.name == "SC clip_norm" for n in o.notes]
    assert note and "derived" in note[0] and "norms, biases" in note[0] and "(tp)" in note[0]
    spec, p = plan("p", DDP_TP, overrides=(TP_SUM,))
    assert "SC clip_norm" in refuted(spec, p)
    spec, p = plan("p", DDP_TP, overrides=(TP_SUM, ov("clip_norm", "dedupe", None, ("tp",))))
    v, r = verdicts(spec, p, {"dp": 2, "tp": 4, "microbatches": 1})
    assert v["SC clip_norm"] is Verdict.PROVED
    assert [n for o in r.obligations if o.name == "SC clip_norm" for n in o.notes][0].startswith(
        "duplicate filter (stated)")


def test_one_defect_is_one_finding_with_its_root_cause():
    spec, p = plan("p", {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}, sp=True,
                   overrides=(ov("grads", "reduce", "norms", ("dp",)),))
    _, r = verdicts(spec, p)
    assert len(r.findings) == 1
    f = r.findings[0]
    assert f.root == "GI grads[norms] over tp" and "tp" in f.cause
    assert {"GI grads[norms]", "SC grads[norms]"} <= set(f.breaks)
    assert {o.name for o in r.obligations if o.verdict is Verdict.REFUTED} == set(f.breaks)


def test_unsplit_experts_on_an_expert_axis_are_reduced_like_data():
    spec, p = plan("p", {"ep": ("expert", "S*,S,S,R")}, experts=8)
    assert not refuted(spec, p)
    spec, p = plan("p", {"ep": ("expert", "S,S,R,R")}, experts=8)  # split experts all-reduced together
    assert "GI grads[experts]" in refuted(spec, p)


def test_pinned_sizes_of_one_make_placement_bugs_vanish():
    spec, p = plan("p", {"dp": ("data", "S,S,S,R")})
    v, _ = verdicts(spec, p, {"dp": 1, "microbatches": 1})
    assert v["SC params usable over dp"] is Verdict.PROVED
    assert Fraction(1) == 1
