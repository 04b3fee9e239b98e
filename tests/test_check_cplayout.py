"""The layout of context parallelism's blocks (``override layout[ITEM]: zigzag | contiguous``, check.cplayout):
the checker against the independent layout simulator (tests/simulator_cp.py ``layout_violations``, every
device of the mesh computing its tokens' attention output and loss term) on hand-derived and generated
plans, the replayed counterexamples with hand-derived numbers, the diagnostics (PL506, an unknown tensor,
PL197 for Ulysses' heads), the costs (nothing moves) and the format round trip."""

from __future__ import annotations

from dataclasses import replace
from itertools import product
from pathlib import Path

import pytest
import simulator_cp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
ROOT = Path(__file__).parent.parent
ITEMS = ("labels", "loss_mask", "position_ids", "causal_mask")
DP_CP = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R")}
TWO_CP = {"dp": ("data", "R,R,R,R"), "c1": ("context", "R,R,R,R"), "c2": ("context", "R,R,R,R")}
Z, C, P = "zigzag", "contiguous", "zigzag_per_document"
DM, UP = "zigzag_document_major", "zigzag_per_document_unpadded"


def lay(verb: str, group: str | None = None) -> ir.Override:
    return ov("layout", verb, group)


def _with(axes, overrides=()):
    spec, p = plan("p", axes, overrides=tuple(overrides))
    return replace(spec, plans=(p,)), p


def refuted(report) -> set[str]:
    obs = {o.name: o for o in report.obligations if o.name.startswith("GI layout[")}
    assert set(obs) == {f"GI layout[{i}]" for i in ITEMS}
    assert all(o.verdict in (Verdict.PROVED, Verdict.REFUTED) for o in obs.values())
    return {n[len("GI layout["):-1] for n, o in obs.items() if o.verdict is Verdict.REFUTED}


def simulated(p: ir.Plan) -> set:
    found: set = set()
    for sizes in product((1, 2, 3), repeat=len(p.mesh.names)):
        found |= simulator_cp.layout_violations(p, dict(zip(p.mesh.names, sizes)))
    return found


def observed(wrong: set[str]) -> set[str]:
    """What the simulator sees of the items the checker refutes: a wrong position id or causal mask changes
    the attention output (and so the loss), a wrong label or loss mask the loss term."""
    return ({"output", "loss"} if wrong & {"position_ids", "causal_mask"} else set()) | ({"loss"} if wrong else set())


HAND = [
    # every tensor follows the inputs (stated or derived)
    ((lay(Z),), set()),
    ((lay(Z, "inputs"), lay(Z, "labels"), lay(Z, "position_ids")), set()),
    ((lay(C, "inputs"),), set()),
    # the labels left contiguous under zigzag inputs (the shift done after the split)
    ((lay(Z), lay(C, "labels")), {"labels"}),
    ((lay(Z), lay(C, "loss_mask")), {"loss_mask"}),
    ((lay(Z), lay(C, "position_ids")), {"position_ids"}),
    # the kernel's causal mask computed for the contiguous layout
    ((lay(Z), lay(C, "causal_mask")), {"causal_mask"}),
    # contiguous inputs, zigzag positions: as wrong
    ((lay(Z, "position_ids"),), {"position_ids"}),
    # the last statement of an item wins
    ((lay(Z), lay(C, "labels"), lay(Z, "labels")), set()),
    ((lay(Z), lay(C, "labels"), lay(C, "causal_mask")), {"labels", "causal_mask"}),
    # packed documents (THD): every tensor cut document by document
    ((lay(P),), set()),
    ((lay(P, "inputs"), lay(P, "position_ids"), lay(P, "causal_mask")), set()),
    # the batch cut as one sequence while the attention kernel cuts each document (NeMo#15339)
    ((lay(Z), lay(P, "causal_mask")), {"causal_mask"}),
    # the position ids cut as one sequence under per-document inputs (a pack of two documents tells them apart)
    ((lay(P), lay(Z, "position_ids")), {"position_ids"}),
    ((lay(P), lay(C, "labels")), {"labels"}),
    # PyTorch's per-document head-tail balancer laid out document-major (before pytorch#189902) everywhere: every
    # rank's share is imbalanced but the step is the single-device one
    ((lay(DM),), set()),
    # the batch sharded by the rank-major balancer, the block mask rearranged by the document-major one
    ((lay(P), lay(DM, "causal_mask")), {"causal_mask"}),
    ((lay(DM), lay(P, "position_ids")), {"position_ids"}),
    ((lay(DM), lay(Z, "labels")), {"labels"}),
    # the per-document cut at the unpadded boundaries (cu_seqlens for cu_seqlens_padded): right only where no
    # document is padded, which the packs the solver picks tell apart
    ((lay(UP),), set()),
    ((lay(P), lay(UP, "labels")), {"labels"}),
    ((lay(P), lay(UP, "causal_mask")), {"causal_mask"}),
    ((lay(UP), lay(P, "loss_mask")), {"loss_mask"}),
    ((lay(P), lay(UP, "position_ids")), {"position_ids"}),
]


@pytest.mark.parametrize("stated,wrong", HAND)
def test_hand_cases_checker_and_simulator(stated, wrong):
    spec, p = _with(DP_CP, stated)
    assert refuted(check_plan(SESSION, spec, p, {})) == wrong
    assert simulated(p) == observed(wrong)


@hs.composite
def layout_plans(draw):
    axes = TWO_CP if draw(hs.booleans()) else DP_CP
    stmt = hs.builds(lay, hs.sampled_from((Z, C, P, DM, UP, "ptrr")), hs.sampled_from((None,) + ("inputs",) + ITEMS))
    return _with(axes, draw(hs.lists(stmt, min_size=1, max_size=4)))


@settings(max_examples=examples(25), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(layout_plans())
def test_checker_agrees_with_the_layout_simulator(generated):
    spec, p = generated
    assert simulated(p) == observed(refuted(check_plan(SESSION, spec, p, {}))), p.overrides


def test_no_statement_no_obligation_and_the_simulator_agrees():
    spec, p = _with(DP_CP)
    assert not [o for o in check_plan(SESSION, spec, p, {}).obligations if o.name.startswith("GI layout")]
    assert simulated(p) == set()


def _ob(stated, item, pinned):
    spec, p = _with(DP_CP, stated)
    return next(o for o in check_plan(SESSION, spec, p, pinned).obligations if o.name == f"GI layout[{item}]")


def test_refutation_replays_the_unpermuted_labels():
    ob = _ob((lay(Z), lay(C, "labels")), "labels", {"dp": 1, "cp": 2, "microbatches": 1})
    # cp = 2, 4 positions: zigzag rank 1 holds tokens 1 and 2, the contiguous labels of positions 2 and 3.
    # y_1 = (1 + 1)·q_1·(kv_0 + kv_1) = 2·3·3 = 18; its label 1 + 1/3, the one rank 1 reads 2 + 1/3:
    # 18 - 7/3 = 47/3 against 18 - 4/3 = 50/3 (rank 0 slot 0 holds chunk 0 either way; slot 1 token 3's mask is 0)
    cex = ob.counterexample
    assert "token 1 (rank 1, slot 0) = 47/3, single-device = 50/3" in cex.equation
    assert "labels" in cex.diagnosis[0] and "contiguous" in cex.diagnosis[0] and "root cause" in cex.diagnosis[0]


def test_refutation_replays_positions_cut_as_one_sequence_under_packed_documents():
    ob = _ob((lay(P), lay(Z, "position_ids")), "position_ids", {"dp": 1, "cp": 2, "microbatches": 1})
    # one document: the two layouts coincide, so the witness packs two documents of 4 positions. Per document,
    # rank 0 holds positions 0, 3, 4, 7; the position ids cut as one sequence of 8 in chunks of 2 give rank 0
    # those of 0, 1, 6, 7. Token 3 (slot 1): y_3 = (3 + 1)·q_3·(kv_0 + ... + kv_3) = 4·5·15 = 300, with
    # position id 1: 2·5·15 = 150 (its keys are right: the causal mask follows the inputs)
    cex = ob.counterexample
    assert "attention output y of token 3 (rank 0, slot 1) = 150, single-device = 300" in cex.equation
    assert "2 packed documents" in dict(cex.values)["sequence"]
    assert "zigzag" in cex.diagnosis[0] and "root cause" in cex.diagnosis[0]


def test_refutation_replays_the_contiguous_causal_mask():
    ob = _ob((lay(Z), lay(C, "causal_mask")), "causal_mask", {"dp": 1, "cp": 2, "microbatches": 1})
    # zigzag: rank 0 holds tokens 0, 3; rank 1 tokens 1, 2; the mask gives them positions 0, 1, 2, 3. Token 3
    # (rank 0 slot 1, mask position 1) sees tokens 0 and 3: kv = 1 + 8 = 9, y = 4·5·9 = 180; alone it sees
    # every token: 1 + 2 + 4 + 8 = 15, y = 4·5·15 = 300
    assert "y of token 3 (rank 0, slot 1) = 180, single-device = 300" in ob.counterexample.equation


def test_the_obligation_points_at_the_statement():
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_spec

    report = check_spec(load_spec(ROOT / "examples/bugs/cp_zigzag_position_ids.place"), timeout=20)
    ob = next(o for o in report.obligations if o.name == "GI layout[position_ids]")
    line = next(i for i, ln in enumerate((ROOT / "examples/bugs/cp_zigzag_position_ids.place").read_text().splitlines(), 1)
                if ln.strip().startswith("override layout[position_ids]"))
    assert ob.verdict is Verdict.REFUTED and ob.location.line == line


def test_no_context_axis_is_pl506():
    spec, p = _with({"dp": DP_CP["dp"]}, (lay(Z),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == Code.OVERRIDE_NO_EFFECT and "no context-parallel axis" in e.value.diagnostics[0].message


def test_costs_move_nothing():
    # the permutation is a local index select before the step: the schedule is the derived one
    _, base = _with(DP_CP)
    _, zig = _with(DP_CP, (lay(Z), lay(C, "labels"), lay(C, "causal_mask")))
    assert collectives.derive(zig) == collectives.derive(base)
    _, packed = _with(DP_CP, (lay(DM), lay(UP, "labels"), lay(P, "causal_mask")))
    assert collectives.derive(packed) == collectives.derive(base)


def _src(body: str, model: str = "heads = 32", mesh: str = "dp = 2 @ inter_node\n  cp = 4 @ intra_node") -> str:
    return (f"from std.context import context_parallel\nfrom std.data import ddp\nfrom std.tensor import megatron_tp\n\n"
            f"model {{\n  transformer {{\n    hidden = 4096\n    layers = 32\n    {model}\n    ffn = 14336\n"
            f"    vocab = 128256\n  }}\n  seq = 65536\n  microbatch = 1\n  microbatches = 4\n}}\n\n"
            f"mesh {{\n  {mesh}\n}}\n\nplan p {{\n  dp: ddp\n  cp: context_parallel\n{body}}}\n")


def _errors(src: str):
    from placement_logic.frontend.loader import load_string

    try:
        load_string(src, "x.place")
    except DiagnosticError as e:
        return e.diagnostics
    return []


def test_unknown_layout_tensor_is_refused():
    d = _errors(_src("  override layout[tokens]: zigzag\n"))
    assert d and d[0].code == Code.BAD_OVERRIDE and "per-token tensor 'tokens'" in d[0].message


@pytest.mark.parametrize("model,mesh,axes,code", [
    # 28 heads over a group of 8 (Qwen2.5's 28 heads on one node: DAMO-NLP-SG/LongPO#5)
    ("heads = 28", "dp = 2 @ inter_node\n  cp = 8 @ intra_node", "cp", Code.ULYSSES_HEADS),
    ("heads = 28", "dp = 2 @ inter_node\n  cp = 4 @ intra_node", "cp", None),
    # 8 kv heads over 16 ranks: each repeated on 2 (verl-project/verl#1226); 6 over 4: neither way
    ("heads = 32\n    kv_heads = 8", "dp = 2 @ inter_node\n  cp = 16 @ intra_node", "cp", None),
    ("heads = 48\n    kv_heads = 6", "dp = 2 @ inter_node\n  cp = 4 @ intra_node", "cp", Code.ULYSSES_HEADS),
    # the group over dp × cp: 32 heads over 16 ranks fit, over 64 not
    ("heads = 32", "dp = 4 @ inter_node\n  cp = 4 @ intra_node", "dp, cp", None),
    ("heads = 32", "dp = 8 @ inter_node\n  cp = 8 @ intra_node", "dp, cp", Code.ULYSSES_HEADS),
])
def test_ulysses_heads_divisible_by_the_group(model, mesh, axes, code):
    d = _errors(_src(f"  override activations[context]: all_to_all over ({axes})\n", model, mesh))
    assert [x.code for x in d] == ([code] if code else [])
    if code:
        assert d[0].span.line and "Ulysses group" in d[0].message


def test_ulysses_heads_per_tensor_rank():
    # 32 heads over tp = 4: 8 per tensor rank, over a Ulysses group of 16 (cp) they cannot be split
    body = "  tp: megatron_tp\n  override activations[context]: all_to_all over (cp)\n"
    d = _errors(_src(body, "heads = 32", "dp = 2 @ inter_node\n  tp = 4 @ intra_node\n  cp = 16 @ intra_node"))
    assert [x.code for x in d] == [Code.ULYSSES_HEADS] and "(8 = 32 / 4)" in d[0].message


@pytest.mark.parametrize("stmt", ["override layout: zigzag", "override layout[labels]: contiguous",
                                  "override layout[causal_mask]: zigzag",
                                  "override layout[position_ids]: zigzag_per_document",
                                  "override layout: zigzag_document_major",
                                  "override layout[labels]: zigzag_per_document_unpadded"])
def test_statements_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    src = _src(f"  {stmt}\n")
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :   ").replace("[", "[ ").replace("]", " ]"))
    assert format_source(messy, "x.place") == src


def test_refutation_replays_a_document_major_block_mask():
    ob = _ob((lay(P), lay(DM, "causal_mask")), "causal_mask", {"dp": 1, "cp": 2, "microbatches": 1})
    # one document: the two orders coincide, so a pack of two documents of 4. Rank-major, rank 0 holds tokens
    # 0, 3, 4, 7; the document-major list 0 3 1 2 | 4 7 5 6 gives rank 0's mask the positions 0, 3, 1, 2. Token
    # 3 (slot 1) sees the keys whose mask position is at most 3 in document 0: tokens 0 (0), 4 (1), 7 (2), 3 (3):
    # k·v = 1 + 16 + 128 + 8 = 153, y = 4·5·153 = 3060; alone it sees tokens 0..3: 15, y = 4·5·15 = 300
    cex = ob.counterexample
    assert "attention output y of token 3 (rank 0, slot 1) = 3060, single-device = 300" in cex.equation
    assert "2 packed documents of 4 and 4 positions" in dict(cex.values)["sequence"]
    assert "zigzag_document_major" in cex.diagnosis[0] and "root cause" in cex.diagnosis[0]


def test_refutation_replays_labels_cut_at_the_unpadded_boundaries():
    ob = _ob((lay(P), lay(UP, "labels")), "labels", {"dp": 1, "cp": 2, "microbatches": 1})
    # without padding the two cuts coincide: the witness is one document of 4 real tokens padded to 8. Padded,
    # rank 0 holds 0, 1, 6, 7 (chunks of 2); cut at 4 real + a dummy 4, rank 0's labels are those of 0, 3, 4, 7.
    # Token 1 (slot 1, mask 1): y_1 = 2·3·(1 + 2) = 18, its label 1 + 1/3, read 3 + 1/3: 44/3 against 50/3
    cex = ob.counterexample
    assert "loss term mask·(y − label) of token 1 (rank 0, slot 1) = 44/3, single-device = 50/3" in cex.equation
    assert "one document of 4 (+4 padding) positions" in dict(cex.values)["sequence"]


def _torch_head_tail_per_document(lengths: list[int], ws: int, rank_major: bool) -> list[int]:
    """The index order of PyTorch's per-document head-tail load balancer, written here as an oracle: rank-major since
    pytorch/pytorch#189902 (the per-document rows stacked rank-wise), document-major before it."""
    rows, start = [], 0
    for length in lengths:
        ch = length // (2 * ws)
        chunks = [list(range(start + i * ch, start + (i + 1) * ch)) for i in range(2 * ws)]
        rows.append([chunks[r] + chunks[2 * ws - 1 - r] for r in range(ws)])
        start += length
    if rank_major:
        return [p for r in range(ws) for doc in rows for p in doc[r]]
    return [p for doc in rows for r in range(ws) for p in doc[r]]


def _te_partitioned_indices(cu_seqlens: list[int], total: int, ws: int, rank: int) -> list[int]:
    """The token order of Transformer Engine's THD partitioning, written here as an oracle (every length a multiple
    of 2·ws)."""
    cu_s = [x // ws for x in cu_seqlens]
    out = []
    for token in range(total // ws):
        seq = max(i for i in range(len(cu_s) - 1) if cu_s[i] <= token)
        half = (cu_s[seq + 1] - cu_s[seq]) // 2
        index = token - cu_s[seq]
        offset = rank if index < half else 2 * ws - 1 - rank
        out.append(cu_seqlens[seq] + offset * half + index % half)
    return out


@pytest.mark.parametrize("c", [2, 3, 4])
def test_layouts_are_the_systems_index_generators(c):
    # the checker's positions (check.encode_cplayout_packs) against the systems' own generators on every pack the
    # obligation quantifies over: unequal lengths, padded documents; torch shards the rearranged sequence in c
    # contiguous chunks
    from placement_logic.check import encode_cplayout_packs as cp

    for pack in cp.PACKS:
        lengths = [2 * c * u for u, _ in pack]
        share = 2 * cp.units(pack)
        mine = {lay: [[cp.position(lay, pack, c, r, j) for j in range(share)] for r in range(c)] for lay in (P, DM, UP)}
        for rank_major, lay in ((True, P), (False, DM)):
            order = _torch_head_tail_per_document(lengths, c, rank_major)
            assert mine[lay] == [order[r * share:(r + 1) * share] for r in range(c)], (lay, pack)
        cu_padded = [sum(lengths[:d]) for d in range(len(lengths) + 1)]
        assert mine[P] == [_te_partitioned_indices(cu_padded, sum(lengths), c, r) for r in range(c)]
        # the unpadded boundaries: the real lengths back to back, the padding one dummy sequence at the end
        real = [2 * c * a for _, a in pack]
        cu = [sum(real[:d]) for d in range(len(real) + 1)] + ([sum(lengths)] if sum(real) < sum(lengths) else [])
        assert mine[UP] == [_te_partitioned_indices(cu, sum(lengths), c, r) for r in range(c)]


@pytest.mark.parametrize("c", [2, 3, 5, 6])
def test_the_packs_tell_every_two_layouts_apart(c):
    # the obligation's bounded family of packs (at most two documents of 2c or 4c positions, padded or not)
    # separates every two different layouts at every c it is asked about; the simulator's larger family is the
    # oracle that it misses no difference (test_checker_agrees_with_the_layout_simulator)
    from placement_logic.check import encode_cplayout_packs as cp

    for a, b in [(x, y) for x in (Z, C, P, DM, UP) for y in (Z, C, P, DM, UP) if x < y]:
        assert any(cp.position(a, p, c, r, j) != cp.position(b, p, c, r, j)
                   for p in cp.PACKS for r in range(c) for j in range(2 * cp.units(p))), (a, b)
