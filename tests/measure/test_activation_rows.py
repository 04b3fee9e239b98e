"""Saved activations compared with the activation model: a row that can fail.

The per-layer and the outside row are ``match`` when every rank measured the prediction,
``explained`` only when every rank measured exactly what the documented mechanisms
(``eager-saved-activations``, ``eager-saved-outside``) recompute from the model's named
terms, and ``differs`` otherwise, which makes the plan a mismatch. The expected bytes here
are written by hand from the tiny shape (what eager PyTorch saves for each op), not from
the comparison's rules.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from placement_logic.frontend.loader import load_spec
from placement_logic.measure.compare import activation_rows
from placement_logic.measure.session import Prepared, prepare

DDP = ("examples/library/ddp.place", "ddp")


def _ddp() -> Prepared:
    p = prepare(load_spec(DDP[0]), DDP[1])
    assert isinstance(p, Prepared)
    return p


def _ddp_saved(p: Prepared) -> tuple[int, int]:
    """One block and the outside of the tiny DDP model (fp32, LayerNorm, ungated MLP, MHA), by hand:
    per token, two norms each with its input, mean, rstd and output; Q, K, V; SDPA's fp32
    log-sum-exp per head; its output (the projection's input); the MLP's first output and GELU's
    output. Outside: the final norm's input, mean, rstd; the head's input; the log-softmax (V
    wide, fp32); the cross entropy's 0-d total weight."""
    sh = p.shape
    n, h, a, f, V = sh.seq * sh.microbatch, sh.hidden, sh.heads, sh.ffn, sh.vocab
    layer = n * (2 * (h + 2 + h) * 4 + 3 * h * 4 + 4 * a + h * 4 + 2 * f * 4)
    outside = n * ((h + 2) * 4 + h * 4 + V * 4) + 4
    return layer, outside


def _results(layer: int, outside: int, ranks: int = 2) -> list[dict]:
    return [{"saved_activations": {"0": layer, "1": layer, "outside": outside}} for _ in range(ranks)]


def _status(p: Prepared, pred, results) -> list[tuple[str, str]]:
    return [(row.status, row.mechanism) for row in activation_rows(pred, results, p.realisation, p.shape)]


def test_the_measured_bytes_are_the_model_terms_by_the_documented_rules():
    p = _ddp()
    layer, outside = _ddp_saved(p)
    assert (layer, outside) == (16768, 6276)  # h = 16, a = 2, f = 64, V = 64, s·b = 16
    pred = p.prediction
    assert dict(pred.activation_layer_terms)["dropout masks"] > 0
    assert sum(dict(pred.activation_layer_terms).values()) == pred.activations_per_layer
    assert sum(dict(pred.activation_outside_terms).values()) == pred.activations_outside
    rows = activation_rows(pred, _results(layer, outside), p.realisation, p.shape)
    assert [(r.status, r.mechanism) for r in rows] == [("explained", "eager-saved-activations"),
                                                       ("explained", "eager-saved-outside")]
    assert "no dropout masks" in rows[0].note and rows[0].note.endswith("= 16,768")
    # measured exactly the prediction: match
    assert _status(p, pred, _results(int(pred.activations_per_layer), int(pred.activations_outside))) == [
        ("match", ""), ("match", "")]


@pytest.mark.parametrize("row", [0, 1])
@pytest.mark.parametrize("delta", [1, -1, 4])
def test_a_measurement_off_by_bytes_differs(row, delta):
    p = _ddp()
    layer, outside = _ddp_saved(p)
    results = _results(layer + delta * (row == 0), outside + delta * (row == 1))
    assert _status(p, p.prediction, results)[row] == ("differs", "")
    # one rank off is enough
    results = _results(layer, outside)
    results[1]["saved_activations"]["1" if row == 0 else "outside"] += delta
    assert _status(p, p.prediction, results)[row][0] == "differs"


def _perturbed(pred, field: str, name: str | None, change) -> object:
    """``pred`` with one named term (or, name None, only the total) changed, the total kept the
    terms' sum unless only the total is changed."""
    total_field = "activations_per_layer" if field == "activation_layer_terms" else "activations_outside"
    terms = getattr(pred, field)
    if name is None:
        return dataclasses.replace(pred, **{total_field: change(getattr(pred, total_field))})
    new = tuple((k, change(v) if k == name else v) for k, v in terms)
    return dataclasses.replace(pred, **{field: new, total_field: sum((v for _, v in new), Fraction(0))})


def activation_mutations(pred):
    """(label, perturbed prediction): the total or each named term + 1 byte, and each term doubled."""
    for field, what in (("activation_layer_terms", "per layer"), ("activation_outside_terms", "outside")):
        yield f"{what} total + 1 B", _perturbed(pred, field, None, lambda v: v + 1)
        for name, _ in getattr(pred, field):
            yield f"{what} {name} + 1 B", _perturbed(pred, field, name, lambda v: v + 1)
            yield f"{what} {name} doubled", _perturbed(pred, field, name, lambda v: 2 * v)


def test_every_perturbed_activation_prediction_differs():
    p = _ddp()
    results = _results(*_ddp_saved(p))
    seen = 0
    for label, wrong in activation_mutations(p.prediction):
        seen += 1
        assert "differs" in [s for s, _ in _status(p, wrong, results)], label
    terms = len(p.prediction.activation_layer_terms) + len(p.prediction.activation_outside_terms)
    assert terms >= 10 and seen == 2 + 2 * terms  # the totals, and every term of both rows twice


def test_a_removed_term_differs_even_where_the_totals_agree():
    """Each named term removed from the model (the total less it): the row differs. Measured
    exactly the new total as well, it is still not a match: the term is required."""
    p = _ddp()
    layer, outside = _ddp_saved(p)
    for field, row in (("activation_layer_terms", 0), ("activation_outside_terms", 1)):
        total_field = "activations_per_layer" if row == 0 else "activations_outside"
        for name, _ in getattr(p.prediction, field):
            rest = tuple((k, v) for k, v in getattr(p.prediction, field) if k != name)
            wrong = dataclasses.replace(p.prediction, **{field: rest, total_field: sum((v for _, v in rest), Fraction(0))})
            assert _status(p, wrong, _results(layer, outside))[row] == ("differs", ""), name
            coincide = [layer, outside]
            coincide[row] = int(getattr(wrong, total_field))
            rows = activation_rows(wrong, _results(*coincide), p.realisation, p.shape)
            assert rows[row].status == "differs" and name in rows[row].note, name


def test_without_named_terms_a_difference_differs():
    p = _ddp()
    pred = dataclasses.replace(p.prediction, activation_layer_terms=(), activation_outside_terms=())
    assert _status(p, pred, _results(*_ddp_saved(p))) == [("differs", ""), ("differs", "")]


# Real runs: every activation row of these plans is explained by its mechanism, to the byte.

torch_runs = pytest.mark.torch


@pytest.fixture(scope="module")
def reports():
    pytest.importorskip("torch")
    from placement_logic.measure.session import measure_many

    plans = [DDP, ("examples/library/megatron_sp.place", "megatron_sp"),
             ("examples/library/expert_parallel.place", "expert_parallel")]
    reps = measure_many([(load_spec(f), name) for f, name in plans], steps=1)
    return {rep.plan: rep for rep in reps}


def _rows(rep) -> dict[str, object]:
    return {r.quantity: r for r in rep.rows if r.group == "activations"}


@torch_runs
def test_a_real_ddp_run_is_explained_to_the_byte(reports):
    rep = reports["ddp"]
    p = _ddp()
    layer, outside = _ddp_saved(p)
    rows = _rows(rep)
    per_layer = rows["saved activations per layer per microbatch"]
    out = rows["saved activations outside the layers"]
    assert (per_layer.status, per_layer.mechanism, per_layer.measured) == ("explained", "eager-saved-activations", layer)
    assert (out.status, out.mechanism, out.measured) == ("explained", "eager-saved-outside", outside)
    assert rep.outcome.value == "matched"


@torch_runs
def test_sequence_parallel_keeps_the_gathered_inputs(reports):
    """megatron_sp (t = 2): the norms' inputs and statistics are sequence shards, Q, K, V, the
    log-sum-exp, the projection input and the MLP are split over t, and DTensor keeps the
    all-gathered (whole) input of the attention's and the MLP's first linear, and the head's."""
    rep = reports["megatron_sp"]
    p = prepare(load_spec("examples/library/megatron_sp.place"), "megatron_sp")
    sh, t = p.shape, 2
    n, h, a, f, V = sh.seq * sh.microbatch, sh.hidden, sh.heads, sh.ffn, sh.vocab
    layer = 2 * (n // t * (h + 2) * 4 + n * h * 4) + n * (3 * h // t * 4 + 4 * a // t + h // t * 4 + 2 * f // t * 4)
    outside = n // t * (h + 2) * 4 + n * h * 4 + n * V // t * 4 + 4
    rows = _rows(rep)
    assert [(r.status, r.mechanism, r.measured) for r in rows.values()] == [
        ("explained", "eager-saved-activations", layer), ("explained", "eager-saved-outside", outside)]


@torch_runs
def test_experts_keep_capacity_sized_slots(reports):
    rep = reports["expert_parallel"]
    rows = _rows(rep)
    assert [(r.status, r.mechanism) for r in rows.values()] == [
        ("explained", "eager-saved-activations"), ("explained", "eager-saved-outside")]
    assert not rows["saved activations per layer per microbatch"].per_rank  # every rank alike, whatever the routing
    assert rep.outcome.value == "matched"
