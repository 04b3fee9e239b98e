"""Prediction against measurement: rows with absolute and relative differences.

Input: a ``Prediction`` (cost engine, tiny shape), the ``Realisation`` that ran and the
per-rank results of the run. Output: the ``Row``s and the ``Equivalence`` of a
``MeasureReport``.

The rules are strict. A row is ``match`` only when every rank measured exactly what was
predicted for it (its own pipeline stage's prediction where the engine gives one). A
collective is keyed by its kind and its mesh axes, so a collective of another kind is a
row of its own and never stands in for the predicted one. A difference is ``explained``
only by one of the mechanisms in ``MECHANISMS`` (documented in docs/validation.md, each
tested), and each mechanism checks two things: that the prediction is the one the
documentation states for that mechanism (computed here from the tiny shape, not read
from the engine), and that the measured value is the documented function of the
prediction on every rank. Any other difference is ``differs``.
"""

from __future__ import annotations

from fractions import Fraction

from .collective_rows import collective_rows, edge_share
from .mechanisms import MECHANISMS, SETUP, STATES, axes_of_group, explained, own_stage_prediction, tied_stage_excess
from .predict import Prediction
from .realise import Realisation
from .report import GRAD_TOLERANCES, TOLERANCES, Equivalence, Row
from .shape import TinyShape

__all__ = ["MECHANISMS", "SETUP", "activation_rows", "axes_of_group", "compare", "edge_share", "peak_note", "peak_rows"]


def _state_rows(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> list[Row]:
    rows = []
    t = r.sizes.get(r.tensor_axis, 1) if r.tensor_axis else 1
    width = pred.widths
    for state in STATES:
        per_rank = tuple(res["held"][state]["storage"] for res in results)
        p = pred.states[state]
        own = own_stage_prediction(pred, state, r, results)
        want = own if own is not None else [p] * len(results)
        status, mechanism, note = "match", "", ""
        if own is not None:
            note = ("each rank against its own pipeline stage's prediction: "
                    + ", ".join(f"{stage} stage {int(v[state]):,}" for stage, v in pred.stages.items()))
        if any(m != w for m, w in zip(per_rank, want)):
            status, note = "differs", note
            # bytes PyTorch keeps whole on the tensor axis that the plan splits: the embedding and the
            # head (the norms, row-parallel biases and router the plan keeps whole too)
            replicated = [(Fraction(res["tensor_replicated_param_bytes"]) - pred.tensor_whole_bytes) * width[state]
                          / width["params"] for res in results]
            whole_grad = Fraction(shape.vocab * shape.hidden) * width["grads"] * (t - 1) / t
            embeds = [not r.pipeline_axis or res["coords"][r.pipeline_axis] == 0 for res in results]
            if state == "grads" and r.tensor_axis and r.data is None and not shape.tied_embeddings \
                    and all(m == w + whole_grad * e for m, w, e in zip(per_rank, want, embeds)):
                status, mechanism, note = explained("dtensor-embedding-grad-whole", (
                    f"DTensor's vocabulary-parallel embedding leaves a whole ({shape.vocab}·{shape.hidden}) Replicate "
                    f"gradient on every rank, {whole_grad} B more than its 1/{t} shard (Megatron-LM keeps V/t rows); "
                    "with a data-parallel wrapper the gradient is reduced into the shard's own buffer"))
            elif r.tensor_axis and own is not None and shape.tied_embeddings and r.stages > 1 and r.chunks == 1 \
                    and all(m == w + e for m, w, e in zip(per_rank, want, tied_stage_excess(
                        pred, state, r, results, shape))):
                status, mechanism, note = explained("tensor-replicated-params", note + (
                    f"; the first stage's tied embedding and the last stage's copy of it ({shape.vocab}·"
                    f"{shape.hidden}) are kept whole on '{r.tensor_axis}', which the plan shards 1/{t}: (t-1)/t of "
                    "their bytes more on those ranks, in this state's proportion to the parameters"))
            elif r.tensor_axis and own is None and all(rep > 0 for rep in replicated) \
                    and all(m == w + rep * (t - 1) / t for m, w, rep in zip(per_rank, want, replicated)):
                status, mechanism, note = explained("tensor-replicated-params", (
                    f"{replicated[0]} B per rank belong to parameters the harness keeps whole on "
                    f"'{r.tensor_axis}' (the tied embedding, which is also the head; vocabulary-parallel in "
                    f"Megatron-LM); the plan shards them 1/{t}"))
        rows.append(Row("memory", f"{state} held per rank", max(want), Fraction(max(per_rank)), status, note,
                        per_rank if len(set(per_rank)) > 1 or len(set(want)) > 1 else (), mechanism,
                        tuple(want) if len(set(want)) > 1 else ()))
    counters = tuple(res["held"]["optimizer_step_counters"]["storage"] for res in results)
    if any(counters):
        # Adam: one 0-d fp32 count per tensor it updates (torch.optim.Adam's state["step"]); SGD none
        documented = tuple(4 * res.get("optimizer_param_tensors", -1) if r.optimizer == "adam" else 0 for res in results)
        if counters == documented:
            status, mechanism, note = explained("optimizer-step-counters", (
                f"one 0-d fp32 step count per parameter tensor Adam updates ({results[0].get('optimizer_param_tensors')} "
                "× 4 B); the cost model counts per-element state only"))
        else:
            status, mechanism, note = "differs", "", "step counters other than one 4-byte count per updated tensor"
        rows.append(Row("memory", "optimizer step counters per rank", Fraction(0), Fraction(max(counters)), status,
                        note, counters if len(set(counters)) > 1 else (), mechanism))
    return rows

def activation_rows(pred: Prediction, results: list[dict]) -> list[Row]:
    """Saved activations of the last step's forward, beside the activation model's prediction for
    the same scaled shape. Reported, not part of the outcome: the activation model is Megatron-LM's
    (dropout masks, 16-bit terms scaled to the run's width), the tiny model has no dropout."""
    if pred.activations_per_layer is None or any("saved_activations" not in res for res in results):
        return []
    layers = [max((v for k, v in res["saved_activations"].items() if k != "outside"), default=0) for res in results]
    outside = [res["saved_activations"].get("outside", 0) for res in results]
    return [
        Row("activations", "saved activations per layer per microbatch", pred.activations_per_layer,
            Fraction(max(layers)), "reported",
            "distinct storages autograd saves in one block's forward (saved_tensors_hooks), parameters left out",
            tuple(layers) if len(set(layers)) > 1 else ()),
        Row("activations", "saved activations outside the layers", pred.activations_outside, Fraction(max(outside)),
            "reported", "embedding, final norm, head and loss; the model counts the embedding mask, the output "
            "layer's inputs and the fp32 logits", tuple(outside) if len(set(outside)) > 1 else ()),
    ]


def peak_rows(pred: Prediction, results: list[dict]) -> list[Row]:
    """The allocator's peak beside the engine's peak device bytes, where every rank's platform
    reports one (CUDA); reported, not part of the outcome. On CPU no rank reports one and there
    is no row (``peak_note`` says so): an absent peak is never shown as 0."""
    peaks = [res.get("allocator_peak") for res in results]
    if pred.device_peak is None or any(v is None for v in peaks):
        return []
    return [Row("peak", "allocator peak per rank", pred.device_peak, Fraction(max(peaks)), "reported",
                "torch.cuda.max_memory_allocated over the whole job (reference run excluded); the engine's peak is "
                "persistent states + activations + transients", tuple(peaks) if len(set(peaks)) > 1 else ())]


def peak_note(results: list[dict]) -> tuple[str, ...]:
    """Why no allocator peak is compared, when some rank's platform keeps no allocator statistics."""
    if all(res.get("allocator_peak") is not None for res in results):
        return ()
    return ("allocator peak: not available (CPU tensors: PyTorch keeps no allocator statistics), so no peak is "
            "compared",)


def compare(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> tuple[list[Row], Equivalence]:
    rows = [Row("parameters", "parameter count Ψ of the tiny model", pred.psi, Fraction(results[0]["param_count"]),
                "match" if pred.psi == results[0]["param_count"] else "differs")]
    rows += _state_rows(pred, r, results, shape)
    rows += collective_rows(pred, r, results, shape)
    rows += activation_rows(pred, results)
    rows += peak_rows(pred, results)
    eq = Equivalence(
        steps=len(results[0]["losses"]),
        param_abs=max(res["param_abs_diff"] for res in results),
        param_rel=max(res["param_rel_diff"] for res in results),
        param_worst=max(results, key=lambda res: res["param_rel_diff"])["param_worst"],
        loss_abs=max(res["loss_abs_diff"] for res in results),
        loss_rel=max(res["loss_rel_diff"] for res in results),
        replicas_agree=len({res["fingerprint"] for res in results}) == 1,
        tolerance=TOLERANCES[r.param_bytes],
        grad_tolerance=GRAD_TOLERANCES[r.param_bytes],
        **_gradients(results),
    )
    return rows, eq


def _gradients(results: list[dict]) -> dict:
    """The ranks' worst first-step gradient difference, or why some rank compared none."""
    missing = [res.get("grad_unavailable", "not recorded") for res in results if "grad_rel_diff" not in res]
    if missing:
        return {"grad_unavailable": missing[0]}
    worst = max(results, key=lambda res: res["grad_rel_diff"])
    return {"grad_abs": max(res["grad_abs_diff"] for res in results), "grad_rel": worst["grad_rel_diff"],
            "grad_worst": worst["grad_worst"]}
