"""Documents whose real length is not a multiple of 2c (``override layout[ITEM]: pad_to_chunks |
truncate_to_chunks | cut_unequal``, check.encode_cpshort): the checker against the independent simulator
(tests/simulator_cpshort.py, every real length up to 6c) on every pair of layouts for every item, the replayed
counterexamples with hand-derived numbers, the mixed-family diagnostic (PL286) and the format round trip."""

from __future__ import annotations

import re
from dataclasses import replace
from itertools import product

import pytest
import simulator_cp
import simulator_cpshort
from irkit import ov, plan

from placement_logic.check import encode_cpshort as cs
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
ITEMS = ("labels", "loss_mask", "position_ids", "causal_mask")
DP_CP = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R")}
PAD, TRUNC, CUT, ZPD = "pad_to_chunks", "truncate_to_chunks", "cut_unequal", "zigzag_per_document"
VERBS = (PAD, TRUNC, CUT, ZPD)


def _with(overrides):
    spec, p = plan("p", DP_CP, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


def verdicts(overrides) -> tuple[set[str], object]:
    spec, p = _with(overrides)
    report = check_plan(SESSION, spec, p, {})
    obs = {o.name: o for o in report.obligations if o.name.startswith("GI layout[")}
    assert set(obs) == {f"GI layout[{i}]" for i in ITEMS}
    assert all(o.verdict in (Verdict.PROVED, Verdict.REFUTED) for o in obs.values())
    return {n[len("GI layout["):-1] for n, o in obs.items() if o.verdict is Verdict.REFUTED}, report


def simulated(p) -> set:
    found: set = set()
    for c in (2, 3, 4):
        found |= simulator_cp.layout_violations(p, {"dp": 1, "cp": c})
    return found


def observed(wrong: set[str]) -> set[str]:
    return ({"output", "loss"} if wrong & {"position_ids", "causal_mask"} else set()) | ({"loss"} if wrong else set())


@pytest.mark.parametrize("base,mine", [(b, m) for b in VERBS for m in VERBS if PAD in (b, m) or TRUNC in (b, m)
                                       or CUT in (b, m)])
@pytest.mark.parametrize("item", ITEMS)
def test_agrees_with_simulator(base, mine, item):
    overrides = [ov("layout", base, "inputs"), ov("layout", mine, item)]
    wrong, _ = verdicts(overrides)
    _, p = _with(overrides)
    sim = simulated(p)
    # refuted exactly where the simulator sees the step change; every refuted item is one it sees
    assert bool(wrong) == bool(sim)
    if base != TRUNC:  # truncated inputs make every item's loss term wrong, whatever the item
        assert observed(wrong) == sim


def test_pairs_differ_at_one_unit():
    """Every two different layouts already differ on a document of at most 2c positions (a = 1), for every
    c the test reaches: the bound on a narrows where a difference is looked for, never what is proved."""
    for c in range(2, 9):
        for one, two in product((PAD, TRUNC, CUT), repeat=2):
            if one == two:
                continue
            assert any(cs.slot(one, 1, c, e, r, j) != cs.slot(two, 1, c, e, r, j)
                       for e in range(2 * c) for r in range(c) for j in range(2)), (one, two, c)


def test_simulator_hand_values():
    # L = 7 at c = 2, padded to 8: TE divides the valid length by cp (7 // 2 = 3 real slots per rank)
    assert simulator_cpshort.held(TRUNC, 7, 2, 1) == [(2, True), (3, True), (4, True), (5, False)]
    assert simulator_cpshort.held(PAD, 7, 2, 0) == [(0, True), (1, True), (6, True), (7, False)]
    # chunks of 7 // 4 = 1, the last the rest: rank 0 holds chunk 0 and positions 3..6
    assert simulator_cpshort.held(CUT, 7, 2, 0) == [(0, True), (3, True), (4, True), (5, True), (6, True)]
    assert simulator_cpshort.held(CUT, 7, 2, 1) == [(1, True), (2, True)]


def test_truncated_mask_replay():
    wrong, report = verdicts([ov("layout", PAD, "inputs"), ov("layout", TRUNC, "causal_mask")])
    assert wrong == {"causal_mask"}
    ce = next(o for o in report.obligations if o.name == "GI layout[causal_mask]").counterexample
    # hand-derived: a real token taken as padding by the mask gives 0; on one device token t sees every real key
    # at or before it, y_t = (t + 1)(t + 2)(2^(t+1) − 1) (keys 0..t real); e.g. c = 2, L = 3: rank 1 holds 2, 3,
    # 3 // 2 = 1 real slot, so token 2 gives 0 where one device gives 3 · 4 · 7 = 84
    m = re.search(r"token (\d+) \(rank (\d+), slot (\d+)\) = 0, single-device = (\d+)", ce.equation)
    t = int(m.group(1))
    assert int(m.group(4)) == (t + 1) * (t + 2) * (2 ** (t + 1) - 1)
    assert "root cause is the attention's causal mask cut as padded" in ce.diagnosis[0]
    length = int(re.search(r"a document of (\d+) real tokens", ce.diagnosis[0]).group(1))
    c = dict(ce.sizes)["cp"]
    assert t < length
    # the token is one the simulator's Transformer Engine rank takes as padding (its slot past L // c)
    r, j = int(m.group(2)), int(m.group(3))
    assert simulator_cpshort.held(TRUNC, length, c, r)[j] == (t, False)


def test_unequal_cut_replay():
    wrong, report = verdicts([ov("layout", CUT, "inputs"), ov("layout", PAD, "position_ids")])
    assert wrong == {"position_ids"}
    ce = next(o for o in report.obligations if o.name == "GI layout[position_ids]").counterexample
    assert "single-device" in ce.equation and "position" in ce.diagnosis[0]


def test_everything_cut_alike_proved():
    for verb in (PAD, CUT):
        assert verdicts([ov("layout", verb)])[0] == set()
    assert verdicts([ov("layout", PAD), ov("layout", ZPD, "labels")])[0] == set()
    # the step reading every valid length divided by c: the loss mask and the causal mask drop real tokens
    assert verdicts([ov("layout", TRUNC)])[0] == {"loss_mask", "causal_mask"}


def test_mixed_family_is_pl286():
    spec, p = _with([ov("layout", PAD), ov("layout", "zigzag", "labels")])
    with pytest.raises(DiagnosticError) as err:
        check_plan(SESSION, spec, p, {})
    assert err.value.diagnostics[0].code == Code.LAYOUT_SHORT_MIXED


@pytest.mark.parametrize("stmt", ["override layout: pad_to_chunks", "override layout[causal_mask]: truncate_to_chunks",
                                  "override layout[inputs]: cut_unequal"])
def test_statements_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    src = (f"from std.context import context_parallel\nfrom std.data import ddp\n\nmodel {{\n  transformer {{\n"
           f"    hidden = 4096\n    layers = 32\n    heads = 32\n    ffn = 14336\n    vocab = 128256\n  }}\n"
           f"  seq = 65536\n  microbatch = 1\n}}\n\nmesh {{\n  dp = 2 @ inter_node\n  cp = 4 @ intra_node\n}}\n\n"
           f"plan p {{\n  dp: ddp\n  cp: context_parallel\n  {stmt}\n}}\n")
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :   ").replace("[", "[ ").replace("]", " ]"))
    assert format_source(messy, "x.place") == src
