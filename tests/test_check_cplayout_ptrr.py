"""The layout PyTorch's processing-time round-robin balancer computes from the mask (``override layout: ptrr``,
check.cplayout_ptrr): its order against PyTorch's own ``ptrr_scheduling`` fed a mask written out position by
position, and against the example in ``_PTRRLoadBalancer``'s docstring; the checker against the independent
layout simulator (tests/simulator_cplayout.py ``_ptrr``); replayed counterexamples with hand-derived numbers;
a group beyond the sizes decided concretely; the format round trip."""

from __future__ import annotations

from itertools import product

import pytest
import simulator_cplayout
import z3
from test_check_cplayout import DP_CP, ITEMS, SESSION, _ob, _src, _with, lay, observed, refuted, simulated

from placement_logic.check import cplayout_ptrr
from placement_logic.check import encode_cplayout_packs as cp
from placement_logic.check.run import check_plan
from placement_logic.outcome import Verdict

R, Z, C, P = "ptrr", "zigzag", "contiguous", "zigzag_per_document"
DM, UP = "zigzag_document_major", "zigzag_per_document_unpadded"
OTHERS = (Z, C, P, DM, UP)


def _mask_rows(pack, c: int) -> list[int]:
    """Each query's count of keys, from the mask written out: a query attends to a key of its own document, not
    after it, that is a real token (a document of 2c·u positions holding 2c·a real tokens first)."""
    doc, real = [], []
    for d, (u, a) in enumerate(pack):
        doc += [d] * (2 * c * u)
        real += [i < 2 * c * a for i in range(2 * c * u)]
    n = len(doc)
    return [sum(1 for k in range(n) if doc[k] == doc[q] and k <= q and real[k]) for q in range(n)]


@pytest.mark.torch
@pytest.mark.parametrize("c", [2, 3, 4, 5])
def test_the_order_is_pytorchs_ptrr_scheduling(c):
    # PyTorch's own scheduler (one position per block: the block mask's kv_num_blocks are the rows' key counts)
    torch = pytest.importorskip("torch")
    lb = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    packs = set(cp.PACKS) | {((3, 3),), ((3, 1), (1, 1)), ((1, 1), (2, 2), (1, 1))}
    for pack in packs:
        groups = lb._PTRRLoadBalancer.ptrr_scheduling(torch.tensor(_mask_rows(pack, c)), c).tolist()
        share = 2 * cp.units(pack)
        assert [[cp.position(R, pack, c, r, j) for j in range(share)] for r in range(c)] == groups, pack
        order = simulator_cplayout._ptrr([(2 * c * u, 2 * c * a) for u, a in pack], c)
        assert [order[r * share:(r + 1) * share] for r in range(c)] == groups, pack


def test_the_docstrings_example():
    # _PTRRLoadBalancer's docstring: documents of 4, 8 and 4 blocks on 2 ranks reorder to
    # [2, 3, 5, 6, 8, 11, 12, 13 | 0, 1, 4, 7, 9, 10, 14, 15] (each rank 28 key blocks)
    assert cplayout_ptrr.schedule(((1, 1), (2, 2), (1, 1)), 2) == ((2, 3, 5, 6, 8, 11, 12, 13), (0, 1, 4, 7, 9, 10, 14, 15))
    assert simulator_cplayout._ptrr([(4, 4), (8, 8), (4, 4)], 2) == [2, 3, 5, 6, 8, 11, 12, 13, 0, 1, 4, 7, 9, 10, 14, 15]


def test_the_closed_form_of_one_document():
    # what the z3 negation reads (linear in c and r) is the schedule at every size it is evaluated at
    c, r = z3.Ints("c r")
    for u in (1, 2, 3):
        pack = ((u, u),)
        for j in range(2 * u):
            term = cp.position(R, pack, c, r, j)
            for size, rank in [(s, x) for s in range(2, 11) for x in range(s)]:
                got = z3.simplify(z3.substitute(term, (c, z3.IntVal(size)), (r, z3.IntVal(rank)))).as_long()
                assert got == cplayout_ptrr.schedule(pack, size)[rank][j], (u, size, rank, j)
    # u = 1: the zigzag (rank r holds r and 2c − 1 − r)
    assert [cplayout_ptrr.schedule(((1, 1),), 4)[x] for x in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


@pytest.mark.parametrize("c", [2, 3, 5, 6, 7, 9])
def test_the_packs_tell_ptrr_from_every_other_layout(c):
    for other in OTHERS:
        assert any(cp.position(R, p, c, r, j) != cp.position(other, p, c, r, j)
                   for p in cp.PACKS for r in range(c) for j in range(2 * cp.units(p))), other


HAND = [
    # everything rearranged by the balancer: the single-device step
    ((lay(R),), set()),
    ((lay(R, "inputs"), lay(R, "labels"), lay(R, "causal_mask")), set()),
    # the inputs by the balancer, a buffer by the default head-tail balancer or the per-document one
    ((lay(R), lay(Z, "labels")), {"labels"}),
    ((lay(R), lay(P, "position_ids")), {"position_ids"}),
    ((lay(R), lay(DM, "causal_mask")), {"causal_mask"}),
    ((lay(R), lay(C, "loss_mask")), {"loss_mask"}),
    ((lay(R), lay(P, "loss_mask")), {"loss_mask"}),
    # the inputs by a head-tail balancer, one tensor by the balancer computed from the mask
    ((lay(P), lay(R, "causal_mask")), {"causal_mask"}),
    ((lay(Z), lay(R, "labels"), lay(R, "position_ids")), {"labels", "position_ids"}),
    ((lay(UP), lay(R, "loss_mask")), {"loss_mask"}),
]


@pytest.mark.parametrize("stated,wrong", HAND)
def test_hand_cases_checker_and_simulator(stated, wrong):
    spec, p = _with(DP_CP, stated)
    assert refuted(check_plan(SESSION, spec, p, {})) == wrong
    assert simulated(p) == observed(wrong)


@pytest.mark.slow
@pytest.mark.parametrize("base,mine,item", [(b, m, i) for b, m in [(R, x) for x in OTHERS] + [(x, R) for x in OTHERS]
                                            for i in ITEMS])
def test_every_pair_with_the_balancer_is_refuted_as_the_simulator_sees(base, mine, item):
    spec, p = _with(DP_CP, (lay(base), lay(mine, item)))
    assert refuted(check_plan(SESSION, spec, p, {})) == {item}
    assert simulated(p) == observed({item})


def test_replay_labels_by_the_head_tail_balancer():
    ob = _ob((lay(R), lay(Z, "labels")), "labels", {"dp": 1, "cp": 2, "microbatches": 1})
    # one document: both give rank r chunks r and 3 − r. Two documents of 4: times 1 2 3 4 | 1 2 3 4, sorted
    # 3 7 2 6 1 5 0 4, dealt in rows of 2, odd rows reversed: rank 0 holds 1, 3, 4, 6. The zigzag of the pack of 8
    # gives rank 0 the labels of 0, 1, 6, 7: token 1 (slot 0) reads position 0's label 1/3: y_1 = 2·3·(1 + 2) = 18,
    # 18 − 1/3 = 53/3 against 18 − 4/3 = 50/3
    cex = ob.counterexample
    assert ob.verdict is Verdict.REFUTED
    assert "loss term mask·(y − label) of token 1 (rank 0, slot 0) = 53/3, single-device = 50/3" in cex.equation
    assert "2 packed documents of 4 and 4 positions" in dict(cex.values)["sequence"]
    assert "laid out zigzag" in cex.diagnosis[0] and "root cause" in cex.diagnosis[0]


def test_replay_a_block_mask_by_the_per_document_balancer():
    ob = _ob((lay(R), lay(P, "causal_mask")), "causal_mask", {"dp": 1, "cp": 2, "microbatches": 1})
    # rank 0 holds tokens 1, 3, 4, 6 (above), the per-document mask gives it positions 0, 3, 4, 7; rank 1 holds
    # 0, 2, 5, 7 at mask positions 1, 2, 5, 6. Token 1 (slot 0, mask position 0) sees the keys at mask position 0 of
    # document 0: token 1 alone, k·v = 2, y = 2·3·2 = 12; alone it sees tokens 0 and 1: 2·3·3 = 18
    assert "attention output y of token 1 (rank 0, slot 0) = 12, single-device = 18" in ob.counterexample.equation


def test_replay_positions_by_the_balancer_under_per_document_inputs():
    ob = _ob((lay(P), lay(R, "position_ids")), "position_ids", {"dp": 1, "cp": 2, "microbatches": 1})
    # per document rank 0 holds 0, 3, 4, 7; the balancer's rank 0 the position ids of 1, 3, 4, 6: token 0 reads
    # position id 1: y_0 = (1 + 1)·2·1 = 4 against 1·2·1 = 2
    assert "attention output y of token 0 (rank 0, slot 0) = 4, single-device = 2" in ob.counterexample.equation


def test_a_group_beyond_the_concrete_sizes_is_replayed_at_its_size():
    # cp = 8: the two documents' orders are not linear in c; the negation leaves the group open and the replay
    # at 8 finds the loss mask of another position (never a proof it did not compute)
    ob = _ob((lay(R), lay(P, "loss_mask")), "loss_mask", {"dp": 1, "cp": 8, "microbatches": 1})
    assert ob.verdict is Verdict.REFUTED and dict(ob.counterexample.sizes)["cp"] == 8
    same = _ob((lay(R), lay(R, "loss_mask")), "loss_mask", {"dp": 1, "cp": 8, "microbatches": 1})
    assert same.verdict is Verdict.PROVED
    # past the largest group replayed (256) the open group is unknown, never proved
    far = _ob((lay(R), lay(P, "loss_mask")), "loss_mask", {"dp": 1, "cp": 300, "microbatches": 1})
    assert far.verdict is Verdict.UNKNOWN


@pytest.mark.parametrize("sizes", list(product((1, 2), (2, 3))))
def test_two_context_axes(sizes):
    from test_check_cplayout import TWO_CP

    spec, p = _with(TWO_CP, (lay(R), lay(Z, "position_ids")))
    pins = {"dp": 1, "c1": sizes[0], "c2": sizes[1], "microbatches": 1}
    ob = next(o for o in check_plan(SESSION, spec, p, pins).obligations if o.name == "GI layout[position_ids]")
    assert ob.verdict is Verdict.REFUTED
    assert simulator_cplayout.layout_violations(p, {"dp": 1, "c1": sizes[0], "c2": sizes[1]}) == {"output", "loss"}


@pytest.mark.parametrize("stmt", ["override layout: ptrr", "override layout[labels]: ptrr"])
def test_statements_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    src = _src(f"  {stmt}\n")
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :   ").replace("[", "[ ").replace("]", " ]"))
    assert format_source(messy, "x.place") == src
