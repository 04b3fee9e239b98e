"""Chunked (local) attention under context parallelism (``attention { chunk = C }``,
``override layout[causal_mask]: chunk_dropped | chunk_local | chunk_on_diagonal``, check.cpchunk): the exact decision
against the ring simulator (tests/simulator_cpwindow.py, every query's output summed key by key), the obligation's
verdicts and replays on whole plans, the diagnostics (PL294, PL295, PL506), what is left undecided, the costs (the
chunk's FLOPs against pairs counted one by one; nothing moves) and the format round trip."""

from __future__ import annotations

from itertools import product

import cpmask_kit as kit
import pytest
import simulator_cpwindow as sim
import sympy

from placement_logic.check import cpchunk, cpwindow
from placement_logic.costs.window import Chunked, causal_share
from placement_logic.diagnostics import Code
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

BEHAVIOURS = (None,) + cpchunk.VERBS


@pytest.mark.parametrize("layout", cpwindow.LAYOUTS)
@pytest.mark.parametrize("c", (2, 3, 4))
def test_decision_agrees_with_the_ring_simulator(layout, c):
    """At every block size h ≤ 3 and chunk 1 ≤ C ≤ n + 1: a pair found exactly where some query's output differs,
    the pair one the ring lets in otherwise than one device, its query the first that differs."""
    kit.sweep(cpchunk.difference, sim.chunk_differing, sim.chunk_pair_differs, lambda q, wrong: q == min(wrong),
              BEHAVIOURS, layout, c)


def test_decision_at_large_sizes_matches_the_hand_derived_pairs():
    # contiguous, c = 8, N = 65536: rank 1 holds 8192...16383 in slots 0...; its query 8192 (slot 0, local chunk 0)
    # and rank 0's key 0 (slot 0) share a local chunk of 8192 but not a global one
    d = cpchunk.difference("chunk_local", "contiguous", 8, 65536, 8192)
    assert (d["query"], d["key"], d["q_rank"], d["q_slot"], d["k_rank"], d["k_slot"], d["computed"]) == \
        (8192, 0, 1, 0, 0, 0, True)
    # zigzag, c = 8, h = 4096: chunk 2 (positions 8192...) is rank 2's head; key 0 is rank 0's: another rank's block,
    # let in whole on the ring
    d = cpchunk.difference("chunk_on_diagonal", "zigzag", 8, 65536, 8192)
    assert (d["query"], d["key"], d["q_rank"], d["k_rank"]) == (8192, 0, 2, 0)
    # a chunk cut on slots that are the global positions' own: rank r's slots begin at a multiple of C (contiguous,
    # C dividing N/c) only for rank 0; with C = N/c every rank's local chunk is its whole buffer: key 0 seen by rank 1
    assert cpchunk.difference("chunk_local", "contiguous", 2, 16, 8)["query"] == 8
    # one chunk as long as the sequence never binds: every behaviour is causal attention
    assert all(cpchunk.difference(v, lay, 4, 64, 64) is None for v, lay in product(BEHAVIOURS, cpwindow.LAYOUTS))


def _src(stmts: str, chunk: str = "8192", seq: int = 65536, cp: int = 8, attention: str = "") -> str:
    return kit.source(stmts, f"    chunk = {chunk}\n{attention}", seq, cp)


_report = kit.report


def _chunk(src: str, pinned=None):
    return kit.obligation(src, "GI layout[chunk]", pinned)


@pytest.mark.parametrize("layout", cpwindow.LAYOUTS)
@pytest.mark.parametrize("verb", BEHAVIOURS)
def test_plan_verdicts_agree_with_the_simulator(layout, verb):
    stmts = f"  override layout: {layout}\n" + (f"  override layout[causal_mask]: {verb}\n" if verb else "")
    ob = _chunk(_src(stmts, chunk="5", seq=24, cp=3))
    wrong = sim.chunk_differing(verb, layout, 3, 24, 5)
    kit.agrees(ob, wrong, verb)
    assert "cp=3" in ob.scope  # the declared size the decision fixes
    if wrong:
        assert ob.counterexample.equation.startswith(f"query {min(wrong)} ")


def test_refutation_names_the_query_and_the_key():
    ob = _chunk(_src("  override layout: zigzag\n  override layout[causal_mask]: chunk_on_diagonal\n",
                     chunk="4", seq=16, cp=2))
    # zigzag, c = 2, h = 4: rank 0 holds 0-3 and 12-15, rank 1 holds 4-11. Query 4 (rank 1, slot 0) begins chunk 1;
    # key 0 is rank 0's block, let in whole. No earlier query has a key of another chunk.
    assert ob.verdict is Verdict.REFUTED
    eq = ob.counterexample.equation
    assert eq.startswith("query 4 (rank 1, slot 0) and key 0 (rank 0, slot 0): the ranks' mask lets it in")
    assert "chunk ⌊p/C⌋ = 1, ⌊k/C⌋ = 0" in eq and "C = 4" in eq


def test_a_pinned_size_is_the_one_decided():
    src = _src("  override layout[causal_mask]: chunk_local\n", chunk="8", seq=32, cp=8)
    # contiguous, c = 8: 4 slots a rank, the local chunk of 8 is the whole buffer: query 4 lets in key 0
    assert _chunk(src).verdict is Verdict.REFUTED
    ob = _chunk(src, {"cp": 2})  # c = 2: 16 slots a rank; rank 1's slots 0..7 are positions 16..23, one chunk each
    wrong = sim.chunk_differing("chunk_local", "contiguous", 2, 32, 8)
    assert ob.verdict is (Verdict.REFUTED if wrong else Verdict.PROVED) and "cp=2" in ob.scope


def test_what_is_left_undecided():
    ob = _chunk(_src("  override layout: ptrr\n  override layout[causal_mask]: chunk_local\n"))
    assert ob.verdict is Verdict.UNKNOWN and "ptrr" in ob.reason
    ob = _chunk(_src("", seq=65536 + 8))
    assert ob.verdict is Verdict.UNKNOWN and "not cut into 2c = 16 chunks" in ob.reason
    report = _report(_src("  override layout[causal_mask]: chunk_local\n", attention="    window = 4096\n"))
    both = {o.name: o for o in report.obligations}
    assert both["GI layout[chunk]"].verdict is Verdict.UNKNOWN and "window" in both["GI layout[chunk]"].reason
    assert both["GI layout[window]"].verdict is Verdict.UNKNOWN and "chunks" in both["GI layout[window]"].reason


def test_no_chunk_no_obligation():
    src = _src("  override layout: zigzag\n").replace("    chunk = 8192\n", "    window = 4096\n")
    assert not [o for o in _report(src).obligations if o.name == "GI layout[chunk]"]


_code = kit.code


def test_diagnostics():
    assert _code(_src("  override layout[labels]: chunk_local\n")) == Code.CHUNK_GROUP
    assert _code(_src("  override layout: chunk_dropped\n")) == Code.CHUNK_GROUP
    assert _code(_src("", chunk="0")) == Code.CHUNK_SIZE
    assert _code(_src("", chunk="2.5")) == Code.CHUNK_SIZE
    no_chunk = _src("  override layout[causal_mask]: chunk_local\n").replace("    chunk = 8192\n", "    window = 64\n")
    assert _code(no_chunk) == Code.OVERRIDE_NO_EFFECT
    assert _code(kit.without_context(_src("  override layout[causal_mask]: chunk_dropped\n"))) == Code.OVERRIDE_NO_EFFECT


def _pairs(s: int, size: int, w: int | None) -> int:
    return sum(1 for p in range(s) for k in range(p + 1) if k // size == p // size and (w is None or p - k < w))


def test_share_is_the_count_of_unmasked_pairs():
    for s, size in product(range(1, 12), range(1, 14)):
        for w in (None,) + tuple(range(1, s + 2)):
            got = causal_share(sympy.Integer(s), Chunked(sympy.Integer(size), None if w is None else sympy.Integer(w)))
            if size < s:
                assert got == sympy.Rational(_pairs(s, size, w), s * s), (s, size, w)
            else:  # one chunk: the window's share, or the causal half
                assert got == causal_share(sympy.Integer(s), None if w is None else sympy.Integer(w))


def test_costs_move_nothing_and_count_the_chunks():
    from placement_logic.costs import derive
    from placement_logic.costs.steptime import flops_per_token, step_time
    from placement_logic.ir import collectives

    base = load_string(_src(""), "x.place")
    bug = load_string(_src("  override layout[causal_mask]: chunk_dropped\n"), "x.place")
    assert collectives.derive(bug.plans[0]) == collectives.derive(base.plans[0])
    dev = "  device = h100_sxm\n"
    src = _src("", chunk="1024", seq=8192, cp=4).replace("@ intra_node\n}", "@ intra_node\n" + dev + "}")
    chunked = load_string(src, "x.place").plans[0]
    plain = load_string(src.replace("  attention {\n    chunk = 1024\n  }\n", ""), "x.place").plans[0]
    a, b = step_time(derive(plain), plain.mesh.hardware), step_time(derive(chunked), chunked.mesh.hardware)
    t, s = plain.model.transformer, sympy.Integer(8192)
    full = flops_per_token(t, s, False).attention  # the whole s × s scores
    # 8 chunks of 1024: each query at offset i of its chunk attends i + 1 keys
    per_token = full / 2 - full * sympy.Rational(8 * 1024 * 1025 // 2, 8192 * 8192)
    assert sympy.simplify(a.model_flops - b.model_flops - 3 * per_token * a.tokens) == 0
    assert per_token > 0 and any("chunk" in x for x in b.assumptions)


@pytest.mark.parametrize("stmt", [f"override layout[causal_mask]: {v}" for v in cpchunk.VERBS])
def test_statements_format_round_trip(stmt):
    kit.round_trip(_src(f"  {stmt}\n"), stmt, "chunk = 8192", "chunk   =8192")
