"""Saved-activation rows under ``conventions { activations = pytorch_eager }``: a match, not an
explanation. The expected bytes are written by hand from the tiny shape (what eager PyTorch saves
for each op, as tests/measure/test_activation_rows.py writes them); the engine's prediction under
the convention must equal them, and every perturbation of it (a term removed, one added, a term or
the total off by a byte) must make the row differ. Real runs: the shipped measure examples' plans
and the library's tensor, sequence-parallel and recomputation plans, run with the convention
stated, measure exactly the prediction (every activation row ``match``).
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

import pytest

from placement_logic.frontend.loader import load_string
from placement_logic.measure.compare import activation_rows
from placement_logic.measure.session import Prepared, measure_many, prepare


def eager_spec(path: str):
    """The spec at ``path`` with the pytorch_eager convention stated in its model block."""
    with open(path) as f:
        text = f.read()
    if "activations = pytorch_eager" not in text:  # the shipped measure examples state it themselves
        text, n = re.subn(r"(\n  microbatch = [^\n]*\n)", r"\1  conventions { activations = pytorch_eager }\n",
                          text, count=1)
        assert n == 1, path
    return load_string(text, file=path)


def _ddp(dropout: bool = False) -> Prepared:
    spec = eager_spec("examples/library/ddp.place")
    p = prepare(spec, "ddp")
    assert isinstance(p, Prepared)
    if dropout:  # as the bug plans with hidden dropout run it
        p = dataclasses.replace(p, realisation=dataclasses.replace(p.realisation, dropout="vary"))
    return p


def _by_hand(p: Prepared) -> tuple[int, int]:
    """One block and the outside of the tiny DDP model (fp32, LayerNorm, ungated MLP, MHA): per token
    two norms with input, mean, rstd and output; Q, K, V; SDPA's fp32 log-sum-exp per head; its output;
    the MLP's first output and GELU's output. Outside: the final norm's input, mean and rstd, the head's
    input, the fp32 log-softmax (V wide) and the cross entropy's 0-d total weight."""
    sh = p.shape
    n, h, a, f, V = sh.seq * sh.microbatch, sh.hidden, sh.heads, sh.ffn, sh.vocab
    return n * (2 * (h + 2 + h) * 4 + 3 * h * 4 + 4 * a + h * 4 + 2 * f * 4), n * ((h + 2) * 4 + h * 4 + V * 4) + 4


def _results(layer: int, outside: int, ranks: int = 2) -> list[dict]:
    return [{"saved_activations": {"0": layer, "1": layer, "outside": outside}} for _ in range(ranks)]


def _status(p: Prepared, pred, results) -> list[tuple[str, str]]:
    return [(row.status, row.mechanism) for row in activation_rows(pred, results, p.realisation, p.shape)]


def test_the_eager_prediction_is_the_hand_count_and_matches():
    p = _ddp()
    layer, outside = _by_hand(p)
    assert (p.prediction.activations_per_layer, p.prediction.activations_outside) == (layer, outside)
    assert _status(p, p.prediction, _results(layer, outside)) == [("match", ""), ("match", "")]


def _replace_terms(pred, field: str, terms) -> object:
    total = "activations_per_layer" if field == "activation_layer_terms" else "activations_outside"
    return dataclasses.replace(pred, **{field: tuple(terms), total: sum((v for _, v in terms), Fraction(0))})


def mutations(pred):
    """(label, perturbed prediction, row): each term removed, one term added, each term + 1 byte or
    doubled, each total + 1 byte."""
    for field, row in (("activation_layer_terms", 0), ("activation_outside_terms", 1)):
        terms = list(getattr(pred, field))
        total = "activations_per_layer" if row == 0 else "activations_outside"
        yield f"{field} total + 1", dataclasses.replace(pred, **{total: getattr(pred, total) + 1}), row
        yield f"{field} + dropout masks", _replace_terms(pred, field, terms + [("dropout masks", Fraction(64))]), row
        for i, (name, v) in enumerate(terms):
            yield f"{name} removed", _replace_terms(pred, field, terms[:i] + terms[i + 1:]), row
            for how, w in (("+ 1", v + 1), ("doubled", 2 * v)):
                yield f"{name} {how}", _replace_terms(pred, field, terms[:i] + [(name, w)] + terms[i + 1:]), row


def test_every_perturbation_differs_even_where_the_totals_agree():
    """Measured as the real run measures, and for a term removed or added even exactly the perturbed
    total: never a match, never explained."""
    p = _ddp()
    real = _results(*_by_hand(p))
    count = 0
    for label, wrong, row in mutations(p.prediction):
        count += 1
        assert _status(p, wrong, real)[row] == ("differs", ""), label
        if not label.endswith(("removed", "dropout masks", "total + 1")):
            continue  # a term off with the total off by as much: only the real run's total decides
        coincide = list(_by_hand(p))
        coincide[row] = int(wrong.activations_per_layer if row == 0 else wrong.activations_outside)
        assert _status(p, wrong, _results(*coincide))[row] == ("differs", ""), label
    assert count == 4 + 3 * (len(p.prediction.activation_layer_terms) + len(p.prediction.activation_outside_terms))


def test_the_harness_dropout_is_explained_from_the_shape_only():
    p = _ddp(dropout=True)
    layer, outside = _by_hand(p)
    masks = 2 * p.shape.seq * p.shape.microbatch * p.shape.hidden * 4
    assert _status(p, p.prediction, _results(layer + masks, outside)) == [("explained", "harness-hidden-dropout"),
                                                                         ("match", "")]
    for off in (-1, 1, masks):
        assert _status(p, p.prediction, _results(layer + masks + off, outside))[0] == ("differs", "")
    # without dropout the same bytes are no explanation
    assert _status(_ddp(), p.prediction, _results(layer + masks, outside))[0] == ("differs", "")


EAGER_RUNS = [("examples/measure/grad_sync_bugs.place", "ddp_ok"), ("examples/measure/grad_sync_bugs.place",
              "zero3_clip_ok"), ("examples/measure/fsdp_tp.place", "fsdp_tp"), ("examples/measure/fsdp_tp.place",
              "fsdp_sp"), ("examples/library/selective_recompute.place", "selective_recompute"),
              ("examples/library/full_recompute.place", "full_recompute"),
              ("examples/library/context_parallel.place", "context_parallel"),
              ("examples/library/expert_parallel.place", "expert_parallel")]


@pytest.mark.torch
@pytest.mark.slow
def test_the_shipped_measure_plans_match_under_the_eager_convention():
    pytest.importorskip("torch")
    reports = measure_many([(eager_spec(path), name) for path, name in EAGER_RUNS], steps=2, with_checker=False)
    for rep in reports:
        rows = [r for r in rep.rows if r.group == "activations"]
        assert len(rows) == 2 and all(r.status == "match" for r in rows), (rep.plan, [(r.status, r.note) for r in rows])
