"""Sliding-window attention over packed documents under context parallelism (check.cpwindow_packs: the per-document
layouts, ``ptrr`` on the windowed mask, ``override layout[causal_mask]: window_across_documents``): the decision over
every pack against the packed ring simulator (tests/simulator_cpwindow.py, every pack of small sizes written out),
the plan verdicts and replays, and what is left undecided."""

from __future__ import annotations

from itertools import product

import pytest
import simulator_cpwindow as sim

from placement_logic.check import cpwindow, cpwindow_packs, encode_cplayout_packs
from placement_logic.check.run import check_plan
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
BEHAVIOURS = (None,) + cpwindow.WINDOW_VERBS


def test_the_simulator_lays_out_packs_as_the_layouts_say():
    for layout, c, units in product(("zigzag_per_document", "zigzag_document_major", "zigzag_per_document_unpadded"),
                                    (2, 3), (1, 2, 3)):
        for pack in sim.all_packs(c, units):
            got = [[encode_cplayout_packs.position(layout, pack, c, r, j) for j in range(2 * units)] for r in range(c)]
            assert sim.pack_holds(layout, c, pack, 1) == got, (layout, c, pack)


@pytest.mark.parametrize("layout", cpwindow_packs.PACKED + cpwindow.LAYOUTS)
@pytest.mark.parametrize("c", (2, 3))
def test_decision_agrees_with_every_pack(layout, c):
    """A witness is a pair the packed ring lets in otherwise than one device, its query the pack's first that
    differs; "no pack differs" is checked against every pack of H ≤ 3 units (padding included); an undecided answer
    is never given under zigzag_per_document or for the layout-free behaviours."""
    for units, verb in product((1, 2, 3), BEHAVIOURS):
        if layout in cpwindow.LAYOUTS and verb != cpwindow_packs.ACROSS:
            continue  # one sequence: check.cpwindow (tests/test_check_cpwindow.py)
        n = 2 * c * units
        for w in range(1, n + 2):
            found, why = cpwindow_packs.decide(verb, layout, c, n, w)
            if found is not None:
                pack = found["pack"]
                assert sum(u for u, _ in pack) == units
                assert sim.pack_pair_differs(verb, layout, c, pack, w, found["query"], found["key"])
                assert sim.pack_differing(verb, layout, c, pack, w)[0] == found["query"]
            elif why is None:
                assert not any(sim.pack_differing(verb, layout, c, p, w) for p in sim.all_packs(c, units)), \
                    (layout, verb, c, units, w)
            else:
                assert layout not in ("zigzag_per_document",) + cpwindow.LAYOUTS
                assert verb in ("window_local", "window_on_diagonal")


def _src(stmts: str, window: str = "4096", seq: int = 32768, cp: int = 8) -> str:
    return (f"from std.context import context_parallel\nfrom std.data import ddp\n\nmodel {{\n  transformer {{\n"
            f"    hidden = 4096\n    layers = 32\n    heads = 32\n    ffn = 14336\n    vocab = 128256\n  }}\n"
            f"  seq = {seq}\n  microbatch = 1\n  attention {{\n    window = {window}\n  }}\n}}\n\n"
            f"mesh {{\n  dp = 2 @ inter_node\n  cp = {cp} @ intra_node\n}}\n\n"
            f"plan p {{\n  dp: ddp\n  cp: context_parallel\n{stmts}}}\n")


def _window(src: str):
    spec = load_string(src, "x.place")
    report = check_plan(SESSION, spec, spec.plans[0], {})
    return next(o for o in report.obligations if o.name == "GI layout[window]")


def test_window_across_documents_names_the_two_documents():
    ob = _window(_src("  override layout: zigzag_per_document\n  override layout[causal_mask]: window_across_documents\n",
                      window="4", seq=16, cp=2))
    # a pack of two documents of 4 positions each (+ 8): query 4 opens document 1, key 3 closes document 0, 1 apart
    assert ob.verdict is Verdict.REFUTED
    eq, values = ob.counterexample.equation, dict(ob.counterexample.values)
    assert eq.startswith("query 4 (") and "key 3 (" in eq and "lets it in" in eq and "is in another document, out of the window" in eq
    assert "query 4 in document 1, key 3 in document 0" in values["pack"]
    assert "cp=2" in ob.scope and any("every pack of documents" in n for n in ob.notes)


@pytest.mark.parametrize("layout", cpwindow_packs.PACKED)
@pytest.mark.parametrize("verb", BEHAVIOURS)
def test_plan_verdicts_agree_with_the_simulator(layout, verb):
    stmts = f"  override layout: {layout}\n" + (f"  override layout[causal_mask]: {verb}\n" if verb else "")
    ob = _window(_src(stmts, window="5", seq=24, cp=2))
    found, why = cpwindow_packs.decide(verb, layout, 2, 24, 5)
    if found is not None:
        assert ob.verdict is Verdict.REFUTED
        assert sim.pack_pair_differs(verb, layout, 2, found["pack"], 5, found["query"], found["key"])
        assert "root cause" in ob.counterexample.diagnosis[0]
    elif why is None:
        assert ob.verdict is Verdict.PROVED
        assert not any(sim.pack_differing(verb, layout, 2, p, 5) for p in sim.all_packs(2, 6))
    else:
        assert ob.verdict is Verdict.UNKNOWN and why in ob.reason


def test_ptrr_reads_the_windowed_mask():
    # c = 2, one document of 8, W = 3: the windowed counts 1 2 3 3 3 3 3 3; the balancer's order against the
    # simulator's, which counts every row of the windowed mask key by key
    ranks = cpwindow_packs.ptrr_ranks(((2, 2),), 2, 3)
    assert [sorted(r) for r in sim.pack_holds("ptrr", 2, ((2, 2),), 3)] == [list(r) for r in ranks]
    # the window's ring bug found on that order at the declared sizes
    ob = _window(_src("  override layout: ptrr\n  override layout[causal_mask]: window_local\n"))
    assert ob.verdict is Verdict.REFUTED and "one document of 32768 positions" in dict(ob.counterexample.values)["pack"]


def test_statement_format_round_trip():
    from placement_logic.frontend.canonical import format_source

    src = _src("  override layout: zigzag_per_document\n  override layout[causal_mask]: window_across_documents\n")
    assert format_source(src, "x.place") == src
    messy = src.replace("layout[causal_mask]: window_across_documents", "layout[ causal_mask ] :   window_across_documents")
    assert format_source(messy, "x.place") == src
