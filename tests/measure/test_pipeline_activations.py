"""Saved activations of pipeline stages under ``conventions { activations = pytorch_eager }``.

Oracles, none of them the engine: the bytes of one block and of the output layer for one
microbatch written by hand from the tiny shape (what eager PyTorch saves for each op, as
tests/measure/test_eager_rows.py writes them), and the microbatches each stage keeps in flight
derived here by running the schedule's order (GPipe: every forward, then every backward; 1F1B:
p − s − 1 warm-up forwards, then one forward and one backward in turn, then the cool-down
backwards; interleaved 1F1B: Megatron's order of chunk forwards and backwards) and counting the
microbatches whose forward has run and backward has not. The stage's peak is then the hand bytes
times those counts. The engine's prediction must equal it, the real gloo runs must measure it
(``match``), and every perturbation (a term removed, an in-flight count off by one, a total off
by a byte) must make the row differ, never match.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from placement_logic.frontend.loader import load_string
from placement_logic.measure.eager_rows import stage_rows
from placement_logic.measure.session import Prepared, measure_many, prepare

SPEC = """from std.pipeline import {imp}
model {{
  transformer {{
    hidden = 4096
    layers = 32
    heads = 32
    ffn = 16384
    vocab = 50304
  }}
  seq = 2048
  microbatch = 4
  microbatches = 8
  conventions {{ activations = pytorch_eager }}
}}
mesh {{
  pp = 2
}}
plan p {{
  pp: {use}
}}
"""

SCHEDULES = {"gpipe": ("gpipe", "gpipe"), "1f1b": ("one_f_one_b", "one_f_one_b"),
             "interleaved": ("interleaved_1f1b", "interleaved_1f1b(v = 2)")}


def _spec(kind: str, stages: int = 2):
    imp, use = SCHEDULES[kind]
    text = SPEC.format(imp=imp, use=use).replace("pp = 2", f"pp = {stages}")
    if stages == 3:  # whole layers on every stage (and chunk)
        text = text.replace("layers = 32", "layers = 48")
    return load_string(text, file=f"<{kind} {stages}>")


def _prepared(kind: str, stages: int = 2) -> Prepared:
    p = prepare(_spec(kind, stages), "p", devices=stages)
    assert isinstance(p, Prepared)
    assert p.realisation.stages == stages
    return p


def _by_hand(p: Prepared) -> tuple[int, int]:
    """One block and the output layer of one microbatch (fp32, LayerNorm, ungated MLP, MHA): per
    token two norms with input, mean, rstd and output, Q, K, V, SDPA's fp32 log-sum-exp per head,
    its output, the MLP's first output and GELU's output; outside, the final norm's input, mean and
    rstd, the head's input, the fp32 log-softmax (V wide) and the cross entropy's 0-d total weight."""
    sh = p.shape
    n, h, a, f, V = sh.seq * sh.microbatch, sh.hidden, sh.heads, sh.ffn, sh.vocab
    return n * (2 * (h + 2 + h) * 4 + 3 * h * 4 + 4 * a + h * 4 + 2 * f * 4), n * ((h + 2) * 4 + h * 4 + V * 4) + 4


def _order(kind: str, p: int, m: int, s: int, v: int = 1) -> list[tuple[str, int, int]]:
    """Stage ``s``'s actions (F or B, chunk, microbatch) in the schedule's order."""
    if kind == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if kind == "bfs":  # breadth-first (torch's ScheduleLoopedBFS): each chunk's forwards in turn, then backwards in reverse
        return [("F", c, i) for c in range(v) for i in range(m)] + [("B", c, i) for c in reversed(range(v)) for i in range(m)]
    if kind == "1f1b":
        warm = min(m, p - s - 1)
        out = [("F", 0, i) for i in range(warm)]
        f = b = 0
        f = warm
        while f < m:
            out.append(("F", 0, f))
            f += 1
            out.append(("B", 0, b))
            b += 1
        return out + [("B", 0, i) for i in range(b, m)]
    # interleaved (Megatron): forwards by groups of p microbatches per chunk, backwards from the last chunk
    fwd = [("F", (k // p) % v, (k // (p * v)) * p + k % p) for k in range(m * v)]
    bwd = [("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p) for k in range(m * v)]
    warm = min(m * v, (v - 1) * p + 2 * (p - s - 1))
    out = fwd[:warm]
    fi, bi = warm, 0
    while fi < m * v:
        out.append(fwd[fi])
        fi += 1
        out.append(bwd[bi])
        bi += 1
    return out + bwd[bi:]


def _peak_in_flight(actions, last_chunk: int | None) -> tuple[int, int]:
    """(chunk-microbatches, microbatches of chunk ``last_chunk``) alive at the peak of the first."""
    alive: set = set()
    best = (0, 0)
    for op, c, i in actions:
        if op == "F":
            alive.add((c, i))
        else:
            alive.discard((c, i))
        if len(alive) > best[0]:
            best = (len(alive), sum(1 for cc, _ in alive if cc == last_chunk))
    return best


def _hand_stages(kind: str, p: Prepared) -> list[int]:
    """Each stage's peak: the hand bytes times what the schedule's order keeps in flight."""
    layer, outside = _by_hand(p)
    sh, r = p.shape, p.realisation
    stages, v = r.stages, r.chunks
    per_chunk = sh.layers // (stages * v)
    out = []
    for s in range(stages):
        last = s == stages - 1
        chunks, outs = _peak_in_flight(_order(kind, stages, sh.microbatches, s, v), v - 1 if last else None)
        out.append(chunks * per_chunk * layer + outs * outside)
    return out


def _results(values: list[int]) -> list[dict]:
    return [{"coords": {"pp": k}, "saved_activation_peak": v} for k, v in enumerate(values)]


def _row(p: Prepared, pred, results):
    rows = stage_rows(pred, p.realisation, p.shape, results)
    assert len(rows) == 1
    return rows[0]


def _stage_names(stages: int) -> list[str]:
    return ["first"] + [f"stage {s}" for s in range(1, stages - 1)] + ["last"]


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved"])
def test_the_engine_stage_totals_are_the_hand_bytes_times_the_schedule_in_flight(kind, stages):
    """Every stage, the interior ones included, in the order first, stage 1 … stage p − 2, last."""
    p = _prepared(kind, stages)
    want = _hand_stages(kind, p)
    assert [name for name, _, _, _ in p.prediction.stage_activations] == _stage_names(stages)
    assert [total for _, total, _, _ in p.prediction.stage_activations] == want
    row = _row(p, p.prediction, _results(want))
    assert (row.status, row.mechanism) == ("match", "")
    assert "not compared" not in row.note


def test_the_in_flight_counts_differ_by_schedule():
    """The independent order gives GPipe all m, 1F1B p − s, interleaved (v − 1)·p + 2·(p − s − 1) + 1."""
    assert [_peak_in_flight(_order("gpipe", 2, 4, s), 0)[0] for s in (0, 1)] == [4, 4]
    assert [_peak_in_flight(_order("1f1b", 2, 4, s), 0)[0] for s in (0, 1)] == [2, 1]
    assert [_peak_in_flight(_order("1f1b", 4, 8, s), 0)[0] for s in range(4)] == [4, 3, 2, 1]
    assert [_peak_in_flight(_order("interleaved", 2, 4, s, 2), 1) for s in (0, 1)] == [(5, 2), (3, 1)]
    assert [_peak_in_flight(_order("gpipe", 4, 8, s), 0)[0] for s in range(4)] == [8] * 4
    assert [_peak_in_flight(_order("interleaved", 4, 8, s, 2), 0)[0] for s in range(4)] == [11, 9, 7, 5]


def _with_layer_terms(pred, terms):
    """``pred`` with other per-microbatch layer terms, every stage total made consistent with them."""
    layer = sum((v for _, v in terms), Fraction(0))
    outside = sum((v for _, v in pred.activation_outside_terms), Fraction(0))
    stages = tuple((n, layer * lm + outside * om, lm, om) for n, _, lm, om in pred.stage_activations)
    return dataclasses.replace(pred, activation_layer_terms=tuple(terms), stage_activations=stages)


def mutations(pred):
    """(label, perturbed prediction): each layer and outside term removed (totals consistent), each
    stage's in-flight count ± 1 (totals consistent, and the count alone), each total + 1 byte."""
    terms = list(pred.activation_layer_terms)
    for i, (name, _) in enumerate(terms):
        yield f"layer term {name} removed", _with_layer_terms(pred, terms[:i] + terms[i + 1:])
    layer = sum((v for _, v in pred.activation_layer_terms), Fraction(0))
    outside_terms = list(pred.activation_outside_terms)
    for i, (name, v) in enumerate(outside_terms):
        stages = tuple((n, t - v * om, lm, om) for n, t, lm, om in pred.stage_activations)
        yield f"outside term {name} removed", dataclasses.replace(
            pred, activation_outside_terms=tuple(outside_terms[:i] + outside_terms[i + 1:]), stage_activations=stages)
    outside = sum((v for _, v in outside_terms), Fraction(0))
    for j, (n, t, lm, om) in enumerate(pred.stage_activations):
        for d in (-1, 1):
            st = list(pred.stage_activations)
            st[j] = (n, layer * (lm + d) + outside * om, lm + d, om)
            yield f"{n} layer-microbatches {d:+}", dataclasses.replace(pred, stage_activations=tuple(st))
            st[j] = (n, t, lm + d, om)
            yield f"{n} layer-microbatches {d:+}, total kept", dataclasses.replace(pred, stage_activations=tuple(st))
            if om:
                st[j] = (n, layer * lm + outside * (om + d), lm, om + d)
                yield f"{n} output microbatches {d:+}", dataclasses.replace(pred, stage_activations=tuple(st))
        st = list(pred.stage_activations)
        st[j] = (n, t + 1, lm, om)
        yield f"{n} total + 1", dataclasses.replace(pred, stage_activations=tuple(st))


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_every_perturbation_differs(kind, stages):
    """Against what the run measures: a term removed, a count in flight off by one (an interior
    stage's too), a total off by a byte — every one differs, none matches or is explained."""
    p = _prepared(kind, stages)
    real = _results(_hand_stages(kind, p))
    labels = []
    for label, wrong in mutations(p.prediction):
        labels.append(label)
        row = _row(p, wrong, real)
        assert (row.status, row.mechanism) == ("differs", ""), label
    # a term removed even where the measurement coincides with the perturbed totals: still differs
    for label, wrong in mutations(p.prediction):
        if "removed" in label:
            coincide = [int(t) for _, t, _, _ in wrong.stage_activations]
            assert _row(p, wrong, _results(coincide)).status == "differs", label
    # each stage: the layer count ± 1, twice (total consistent, total kept), and its total + 1; the
    # last stage's output count ± 1 besides
    assert len(labels) == len(p.prediction.activation_layer_terms) + len(p.prediction.activation_outside_terms) \
        + stages * 5 + 2


def test_an_interior_stage_counted_as_an_edge_stage_differs():
    """1F1B over four stages: an interior stage predicted with the first stage's count (p) or the
    last's (1) in flight, totals consistent with the count, differs from what the schedule keeps."""
    p = _prepared("1f1b", 4)
    real = _results(_hand_stages("1f1b", p))
    st = p.prediction.stage_activations
    layer = sum((v for _, v in p.prediction.activation_layer_terms), Fraction(0))
    for j in (1, 2):
        for lm in (st[0][2], st[-1][2]):
            wrong = list(st)
            wrong[j] = (st[j][0], layer * lm, lm, Fraction(0))
            row = _row(p, dataclasses.replace(p.prediction, stage_activations=tuple(wrong)), real)
            assert (row.status, row.mechanism) == ("differs", ""), (j, lm)


def test_a_stage_the_prediction_lacks_is_not_compared_and_said_so():
    """Without the interior stages' totals only the first and the last are compared, and the
    note names the ranks left out."""
    p = _prepared("1f1b", 4)
    real = _results(_hand_stages("1f1b", p))
    st = p.prediction.stage_activations
    edges = dataclasses.replace(p.prediction, stage_activations=(st[0], st[-1]))
    row = _row(p, edges, real)
    assert row.status == "match"
    assert "2 interior-stage rank(s) not compared" in row.note


def test_no_row_without_the_convention_or_a_measured_peak():
    p = _prepared("gpipe")
    real = _results(_hand_stages("gpipe", p))
    other = dataclasses.replace(p.prediction, activation_count="shape")
    assert stage_rows(other, p.realisation, p.shape, real) == []
    # a one-step run measures no peak (its schedule also runs torch's shape-inference forward)
    assert stage_rows(p.prediction, p.realisation, p.shape, _results([None, None])) == []


@pytest.mark.torch
@pytest.mark.slow
def test_real_four_stage_pipelines_match_the_hand_count_on_every_stage():
    """GPipe, 1F1B and interleaved 1F1B over four stages (4 ranks on gloo): each rank's peak of kept
    saved activations, the two interior stages' included, is the hand count, and the row matches."""
    pytest.importorskip("torch")
    kinds = ["gpipe", "1f1b", "interleaved"]
    reports = measure_many([(_spec(k, 4), "p") for k in kinds], devices=4, steps=2, with_checker=False)
    seen = set()
    for kind, rep in zip(kinds, reports):
        rows = [r for r in rep.rows if r.quantity == "saved activations per stage at the schedule's peak"]
        assert len(rows) == 1, (kind, [r.quantity for r in rep.rows])
        want = _hand_stages(kind, _prepared(kind, 4))
        assert len(set(want)) > 1 or kind == "gpipe"  # the interior stages differ from the edges
        assert rows[0].status == "match", (kind, rows[0].note)
        assert "not compared" not in rows[0].note, kind
        assert list(rows[0].per_rank) == want, kind
        seen.add(tuple(rows[0].per_rank))
    assert len(seen) == 3  # three runs, not one report thrice


@pytest.mark.torch
@pytest.mark.slow
def test_real_pipeline_runs_match_the_hand_count():
    """GPipe, 1F1B and interleaved 1F1B over two stages on gloo: each stage's peak of kept saved
    activations is the hand count, and the row matches."""
    pytest.importorskip("torch")
    kinds = ["gpipe", "1f1b", "interleaved"]
    reports = measure_many([(_spec(k), "p") for k in kinds], steps=2, with_checker=False)
    for kind, rep in zip(kinds, reports):
        rows = [r for r in rep.rows if r.quantity == "saved activations per stage at the schedule's peak"]
        assert len(rows) == 1, (kind, [r.quantity for r in rep.rows])
        want = _hand_stages(kind, _prepared(kind))
        assert rows[0].status == "match", (kind, rows[0].note)
        assert list(rows[0].per_rank) == want, kind


@pytest.mark.torch
def test_the_peak_counts_kept_saved_tensors_not_surviving_buffers():
    """Two forwards of a small MLP kept at once, then their backwards, then a third forward: the
    peak is the two graphs' distinct saved storages, counted from their saved tensors (an input
    buffer kept alive by its owner after the backward does not count any more)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from placement_logic.measure.ranks.activations import LiveSavedPeak

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    buffers = [torch.randn(3, 8, requires_grad=True) for _ in range(3)]  # outlive every graph
    # by hand: per forward the first linear's input (3·8), GELU's input (3·16), the second linear's
    # input (3·16), in fp32; the inputs are leaves that accumulate a gradient, as the pipeline's
    # received activations, and are saved (not parameters: they belong to no module)
    one = 4 * (3 * 8 + 3 * 16 + 3 * 16)
    peak = LiveSavedPeak()
    with peak.recording([net]):
        a = net(buffers[0]).sum()
        b = net(buffers[1]).sum()
        a.backward()
        b.backward()
        net(buffers[2]).sum().backward()
    assert peak.peak == 2 * one
    assert peak.total == 0 and not peak.live


# ZeroPP: the harness runs torch's breadth-first order; the engine counts the interleaved one

ZEROPP = """from std.zeropp import zeropp_dp
model {
  transformer { hidden = 4096 layers = 32 heads = 32 ffn = 16384 vocab = 50304 }
  seq = 2048
  microbatch = 4
  microbatches = 1
  conventions { activations = pytorch_eager }
}
mesh { stage = 4  intra = 8  inter = 2 }
plan z { [stage, intra, inter]: zeropp_dp(v = 2, U = 4) }
"""


def _zeropp() -> tuple:
    spec = load_string(ZEROPP, file="<zeropp eager>")
    p = prepare(spec, "z")
    assert isinstance(p, Prepared)
    return spec, p


def _bfs_stages(p: Prepared) -> list[int]:
    """Each stage's peak under the breadth-first order, from the hand bytes."""
    layer, outside = _by_hand(p)
    sh, r = p.shape, p.realisation
    per_chunk = sh.layers // (r.stages * r.chunks)
    out = []
    for s in range(r.stages):
        last = s == r.stages - 1
        chunks, outs = _peak_in_flight(_order("bfs", r.stages, sh.microbatches, s, r.chunks),
                                       r.chunks - 1 if last else None)
        out.append(chunks * per_chunk * layer + outs * outside)
    return out


def _stage_results(p: Prepared, values: list[int]) -> list[dict]:
    return [{"coords": {p.realisation.pipeline_axis: k}, "saved_activation_peak": v} for k, v in enumerate(values)]


def test_zeropp_breadth_first_counts_explain_the_peak_with_the_engines_terms():
    """2 stages, 2 chunks, 4 microbatches: breadth-first keeps all 8 chunk-microbatches and, on the
    last stage, all 4 output layers (the independent order), where the engine counts interleaved
    1F1B's 5 and 3 + 1. The hand bytes times those counts are explained, naming the schedule and
    that the engine's ZeroPP counts are not checked; the engine's own totals match outright."""
    _, p = _zeropp()
    r, sh = p.realisation, p.shape
    assert (r.schedule, r.stages, r.chunks, sh.microbatches) == ("zeropp", 2, 2, 4)
    assert [_peak_in_flight(_order("bfs", 2, 4, s, 2), 1) for s in (0, 1)] == [(8, 4), (8, 4)]
    bfs = _bfs_stages(p)
    row = _row(p, p.prediction, _stage_results(p, bfs))
    assert (row.status, row.mechanism) == ("explained", "zeropp-breadth-first"), row.note
    assert "not checked" in row.note
    engine = [int(t) for _, t, _, _ in p.prediction.stage_activations]
    assert engine != bfs
    assert _row(p, p.prediction, _stage_results(p, engine)).status == "match"


def test_zeropp_perturbations_are_not_explained():
    """A measured byte more, a layer or outside term removed or one byte more (the engine's totals
    kept consistent), a breadth-first count off by one: each differs."""
    _, p = _zeropp()
    bfs = _bfs_stages(p)
    real = _stage_results(p, bfs)
    for k in range(2):
        off = list(bfs)
        off[k] += 1
        assert _row(p, p.prediction, _stage_results(p, off)).status == "differs", k
    layer, _ = _by_hand(p)
    fewer = list(bfs)
    fewer[0] -= layer  # one chunk-microbatch less on the first stage
    assert _row(p, p.prediction, _stage_results(p, fewer)).status == "differs"
    for label, wrong in mutations(p.prediction):
        if "removed" in label:
            assert _row(p, wrong, real).status == "differs", label
    terms = list(p.prediction.activation_layer_terms)
    for i, (name, v) in enumerate(terms):
        bumped = terms[:i] + [(name, v + 1)] + terms[i + 1:]
        assert _row(p, _with_layer_terms(p.prediction, bumped), real).status == "differs", name


@pytest.mark.torch
@pytest.mark.slow
def test_real_zeropp_run_is_the_breadth_first_count():
    """ZeroPP on 8 ranks (stage × intra × inter, gloo): every rank's peak is its stage's hand bytes
    times the breadth-first counts, and the row is explained by ``zeropp-breadth-first``."""
    pytest.importorskip("torch")
    spec, p = _zeropp()
    (rep,) = measure_many([(spec, "z")], steps=2, with_checker=False)
    rows = [r for r in rep.rows if r.quantity == "saved activations per stage at the schedule's peak"]
    assert len(rows) == 1, [r.quantity for r in rep.rows]
    assert (rows[0].status, rows[0].mechanism) == ("explained", "zeropp-breadth-first"), rows[0].note
    bfs = _bfs_stages(p)
    stage_axis = p.realisation.pipeline_axis
    per_rank = list(rows[0].per_rank) or [int(rows[0].measured)] * p.realisation.world
    # every rank of a stage measured that stage's count (ranks are row-major over stage, intra, inter)
    inner = p.realisation.world // p.realisation.sizes[stage_axis]
    assert per_rank == [bfs[k // inner] for k in range(p.realisation.world)]


def test_zeropp_with_the_hidden_dropout_names_both_mechanisms():
    """A run that also keeps the hidden dropout's two fp32 h-wide masks per block (hand: 2·N·h·4 B
    per block and microbatch): the breadth-first counts times the terms and the masks explain it,
    naming both; without the masks' bytes it differs."""
    _, p = _zeropp()
    r = dataclasses.replace(p.realisation, dropout="same")
    sh = p.shape
    masks = 2 * sh.seq * sh.microbatch * sh.hidden * 4
    per_chunk = sh.layers // (r.stages * r.chunks)
    with_masks = [b + masks * 8 * per_chunk for b in _bfs_stages(p)]  # 8 chunk-microbatches on each stage
    rows = stage_rows(p.prediction, r, sh, _stage_results(p, with_masks))
    assert (rows[0].status, rows[0].mechanism) == ("explained", "zeropp-breadth-first + harness-hidden-dropout")
    rows = stage_rows(p.prediction, r, sh, _stage_results(p, _bfs_stages(p)))
    assert rows[0].status == "differs"
