"""Sliding-window attention under context parallelism (``attention { window = W }``,
``override layout[causal_mask]: window_dropped | window_local | window_on_diagonal``, check.cpwindow): the exact
decision against the ring simulator (tests/simulator_cpwindow.py, every query's output summed key by key), the
obligation's verdicts and replays on whole plans, the diagnostics (PL282, PL283, PL506), an undecided layout, the
costs (nothing moves) and the format round trip."""

from __future__ import annotations

from itertools import product

import cpmask_kit as kit
import pytest
import simulator_cpwindow as sim

from placement_logic.check import cpwindow
from placement_logic.diagnostics import Code
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

BEHAVIOURS = (None,) + cpwindow.VERBS


@pytest.mark.parametrize("layout", cpwindow.LAYOUTS)
@pytest.mark.parametrize("c", (2, 3, 4))
def test_decision_agrees_with_the_ring_simulator(layout, c):
    """At every chunk size h ≤ 3 and window 1 ≤ W ≤ n + 1: a pair found exactly where some query's output
    differs, and the pair found is one the ring lets in otherwise than one device."""
    kit.sweep(cpwindow.difference, sim.differing, sim.pair_differs, lambda q, wrong: q in wrong, BEHAVIOURS, layout, c)


def test_decision_at_large_sizes_matches_the_hand_derived_pairs():
    # zigzag, c = 8, N = 32768 (h = 2048), W = 4096: rank 2 holds chunk 2 (positions 4096...) in slots 0...,
    # rank 0 chunk 0 in slots 0...: query 4096 and key 0 are 4096 apart but in the same slot.
    d = cpwindow.difference("window_local", "zigzag", 8, 32768, 4096)
    assert (d["query"], d["key"], d["q_rank"], d["q_slot"], d["k_rank"], d["k_slot"]) == (4096, 0, 2, 0, 0, 0)
    # dropped: the first query W positions past a key, key 0
    d = cpwindow.difference("window_dropped", "contiguous", 8, 32768, 4096)
    assert (d["query"], d["key"], d["computed"]) == (4096, 0, True)
    # a window as long as the sequence never binds: every behaviour is the single-device one
    assert all(cpwindow.difference(v, lay, 4, 64, 64) is None for v, lay in product(BEHAVIOURS, cpwindow.LAYOUTS))


def _src(stmts: str, window: str = "4096", seq: int = 32768, cp: int = 8, extra: str = "") -> str:
    return kit.source(stmts, f"    window = {window}\n", seq, cp, extra)


def _window(src: str, pinned=None):
    return kit.obligation(src, "GI layout[window]", pinned)


@pytest.mark.parametrize("layout", cpwindow.LAYOUTS)
@pytest.mark.parametrize("verb", BEHAVIOURS)
def test_plan_verdicts_agree_with_the_simulator(layout, verb):
    stmts = f"  override layout: {layout}\n" + (f"  override layout[causal_mask]: {verb}\n" if verb else "")
    kit.agrees(_window(_src(stmts, window="6", seq=24, cp=3)), sim.differing(verb, layout, 3, 24, 6), verb)


def test_refutation_names_the_query_and_the_key():
    ob = _window(_src("  override layout: zigzag\n  override layout[causal_mask]: window_on_diagonal\n",
                      window="4", seq=16, cp=2))
    # zigzag, c = 2, h = 4: rank 0 holds 0-3 and 12-15, rank 1 holds 4-11. Query 4 (rank 1, slot 0) and key 0
    # (rank 0, slot 0) are 4 = W apart: out of the window, but another rank's block, let in whole. No query
    # before 4 has a key W apart.
    assert ob.verdict is Verdict.REFUTED
    eq = ob.counterexample.equation
    assert eq.startswith("query 4 (rank 1, slot 0) and key 0 (rank 0, slot 0): the ranks' mask lets it in")
    assert "p − k = 4" in eq and "W = 4" in eq


def test_window_longer_than_the_sequence_proves_every_behaviour():
    for verb in cpwindow.VERBS:
        ob = _window(_src(f"  override layout[causal_mask]: {verb}\n", window="32768"))
        assert ob.verdict is Verdict.PROVED
        assert any("decided at the declared sizes" in n for n in ob.notes)


def test_no_window_no_obligation():
    src = _src("  override layout: zigzag\n").replace("  attention {\n    window = 4096\n  }\n", "")
    assert not [o for o in kit.report(src).obligations if o.name == "GI layout[window]"]


def test_another_layout_is_left_undecided():
    # packs with padding under the cut at the unpadded boundaries (check.cpwindow_packs) are not decided
    ob = _window(_src("  override layout: zigzag_per_document_unpadded\n  override layout[causal_mask]: window_local\n",
                      window="32768"))
    assert ob.verdict is Verdict.UNKNOWN and "padded packs" in ob.reason


def test_sequence_not_cut_into_chunks_is_left_undecided():
    ob = _window(_src("", seq=32768 + 8))
    assert ob.verdict is Verdict.UNKNOWN and "not cut into 2c = 16 chunks" in ob.reason


_code = kit.code


def test_diagnostics():
    assert _code(_src("  override layout[labels]: window_local\n")) == Code.WINDOW_GROUP
    assert _code(_src("  override layout: window_dropped\n")) == Code.WINDOW_GROUP
    assert _code(_src("", window="0")) == Code.WINDOW_SIZE
    assert _code(_src("", window="2.5")) == Code.WINDOW_SIZE
    no_window = _src("  override layout[causal_mask]: window_local\n").replace("  attention {\n    window = 4096\n  }\n",
                                                                               "")
    assert _code(no_window) == Code.OVERRIDE_NO_EFFECT


def test_costs_move_nothing():
    # the mask is the kernel's: no collective moves otherwise than derived
    from placement_logic.ir import collectives

    base = load_string(_src(""), "x.place")
    bug = load_string(_src("  override layout[causal_mask]: window_dropped\n"), "x.place")
    assert collectives.derive(bug.plans[0]) == collectives.derive(base.plans[0])


@pytest.mark.parametrize("stmt", [f"override layout[causal_mask]: {v}" for v in cpwindow.VERBS])
def test_statements_format_round_trip(stmt):
    kit.round_trip(_src(f"  {stmt}\n"), stmt, "window = 4096", "window   =4096")


def test_no_context_axis_is_no_effect():
    assert _code(kit.without_context(_src("  override layout[causal_mask]: window_dropped\n"))) == Code.OVERRIDE_NO_EFFECT


def test_the_layout_simulators_leave_the_window_verbs_to_the_window_simulator():
    import simulator_cp

    spec = load_string(_src("  override layout: zigzag\n  override layout[causal_mask]: window_local\n"), "x.place")
    # the block layout of every tensor is the inputs' zigzag: no layout violation; the window's is GI layout[window]
    assert simulator_cp.layout_violations(spec.plans[0], {"dp": 1, "cp": 2}) == set()
