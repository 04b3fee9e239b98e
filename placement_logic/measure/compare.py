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
from .eager_rows import EAGER_COUNTS, eager_status, stage_rows
from .mechanisms import (
    MECHANISMS,
    SETUP,
    STATES,
    axes_of_group,
    explained,
    kept_whole_as_documented,
    own_stage_prediction,
    tied_excess,
    tied_stage_excess,
)
from .predict import Prediction
from .realise import Realisation, widths_of
from .report import GRAD_TOLERANCES, TOLERANCES, Equivalence, Row, RowStatus
from .shape import TinyShape

__all__ = ["MECHANISMS", "SETUP", "activation_rows", "harness_layer_bytes", "harness_outside_bytes", "axes_of_group", "compare", "edge_share", "peak_note", "peak_rows"]


def _state_rows(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> list[Row]:
    rows = []
    t = r.sizes.get(r.tensor_axis, 1) if r.tensor_axis else 1
    width = widths_of(r)
    for state in STATES:
        per_rank = tuple(res["held"][state]["storage"] for res in results)
        p = pred.states[state]
        own = own_stage_prediction(pred, state, r, results)
        want = own if own is not None else [p] * len(results)
        status, mechanism, note = RowStatus.MATCH, "", ""
        if own is not None:
            note = ("each rank against its own pipeline stage's prediction: "
                    + ", ".join(f"{stage} stage {int(v[state]):,}" for stage, v in pred.stages.items()))
        if any(m != w for m, w in zip(per_rank, want)):
            status, note = RowStatus.DIFFERS, note
            whole_grad = Fraction(shape.vocab * shape.hidden) * width["grads"] * (t - 1) / t
            embeds = [not r.pipeline_axis or res["coords"][r.pipeline_axis] == 0 for res in results]
            if state == "grads" and r.tensor_axis and r.data is None and not shape.tied_embeddings \
                    and all(m == w + whole_grad * e for m, w, e in zip(per_rank, want, embeds)):
                status, mechanism, note = explained("dtensor-embedding-grad-whole", (
                    f"DTensor's vocabulary-parallel embedding leaves a whole ({shape.vocab}·{shape.hidden}) Replicate "
                    f"gradient on every rank, {whole_grad} B more than its 1/{t} shard (Megatron-LM keeps V/t rows); "
                    "with a data-parallel wrapper the gradient is reduced into the shard's own buffer"))
            elif r.tensor_axis and own is not None and shape.tied_embeddings and r.stages > 1 and r.chunks == 1 \
                    and (excess := tied_stage_excess(pred, state, r, results, shape)) is not None \
                    and all(m == w + e for m, w, e in zip(per_rank, want, excess)):
                status, mechanism, note = explained("tensor-replicated-params", note + (
                    f"; the first stage's tied embedding and the last stage's copy of it ({shape.vocab}·"
                    f"{shape.hidden}) are kept whole on '{r.tensor_axis}', which the plan shards 1/{t}: (t-1)/t of "
                    "their elements more on those ranks, at the run's width of this state over its data shard"))
            elif r.tensor_axis and own is None and shape.tied_embeddings and r.data in (None, "ddp") \
                    and kept_whole_as_documented(r, results, shape) \
                    and all(m == w + tied_excess(r, shape, state) for m, w in zip(per_rank, want)):
                excess = tied_excess(r, shape, state)
                status, mechanism, note = explained("tensor-replicated-params", (
                    f"the tied embedding, which is also the head ({shape.vocab}·{shape.hidden}), is kept whole on "
                    f"'{r.tensor_axis}' (vocabulary-parallel in Megatron-LM), which the plan shards 1/{t}: "
                    f"(t-1)/t of its elements at {width[state]} B each, {excess} B more per rank; the norms and "
                    "row-parallel biases are whole in both"))
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
            status, mechanism, note = RowStatus.DIFFERS, "", "step counters other than one 4-byte count per updated tensor"
        rows.append(Row("memory", "optimizer step counters per rank", Fraction(0), Fraction(max(counters)), status,
                        note, counters if len(set(counters)) > 1 else (), mechanism))
    return rows

def _norm_statistics(shape: TinyShape, tokens: Fraction, width: Fraction) -> list[tuple[str, Fraction]]:
    """What one eager norm of ``tokens`` local tokens keeps beside its input and output: LayerNorm
    its mean and reciprocal standard deviation (one value per token each, in the activations'
    dtype); fp32 RMSNorm (a composite in PyTorch) its reciprocal root mean square (fp32, one per
    token) and the normalised input x·rstd (h wide). None for a 16-bit RMSNorm, which computes in
    fp32 and keeps an fp32 copy of its input: no rule is documented for it."""
    if shape.norm == "layernorm":
        return [("norm statistics (mean, rstd)", 2 * tokens * width)]
    if width == 4:
        return [("norm statistic (rstd)", tokens * 4), ("normalised norm input x·rstd", tokens * shape.hidden * width)]
    return []


# the activation model's per-layer terms the harness's blocks keep (compared through the row's total)
KEPT_LAYER_TERMS = {"norm inputs", "norm outputs", "query", "keys and values", "projection input", "mlp"}


def harness_layer_bytes(pred: Prediction, r: Realisation, shape: TinyShape) -> tuple[Fraction, list[tuple[str, Fraction]]] | None:
    """The bytes PyTorch keeps for one block of the harness's model, recomputed from the activation
    model's named terms (``Prediction.activation_layer_terms``) by the documented rules of the
    mechanism ``eager-saved-activations`` (docs/validation.md), and the adjustments term by term;
    None where no rule applies: no named terms, terms that do not add up to the prediction, a term
    the harness lacks that is not its documented value, a 16-bit RMSNorm."""
    terms = dict(pred.activation_layer_terms)
    if not terms or "layer" in terms or sum(terms.values(), Fraction(0)) != pred.activations_per_layer:
        return None
    width = widths_of(r)["activations"]
    t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    cp = r.sizes[r.context_axis] if r.context_axis else 1
    tokens = Fraction(shape.seq, cp) * shape.microbatch
    if "layer input" in terms:  # full recomputation: the block input only, s·b·h (÷t under sequence parallelism)
        block_input = tokens * shape.hidden * width / (t if r.sequence_parallel else 1)
        return (block_input, []) if set(terms) == {"layer input"} and terms["layer input"] == block_input else None
    whole = tokens / (t if r.sequence_parallel else 1)  # tokens of the norms' (replicated or sequence) region
    # the terms the harness has no counterpart of must be the documented ones: two h-wide dropout
    # masks (1 byte per element at 16 bits), the attention core's 5·a·s per token (scores, their
    # dropout mask and output), the router's fp32 logits
    documented = {"dropout masks": whole * shape.hidden * width,
                  "attention core": tokens * Fraction(5 * shape.heads * shape.seq, cp * t) * width / 2,
                  "router logits": whole * 2 * shape.experts * width}
    if any(name in terms and terms[name] != v for name, v in documented.items()):
        return None
    # every term the model emits is one the harness keeps (compared through the total) or one of the
    # documented terms it lacks; and those the convention emits must be there: a term removed from
    # the model leaves no rule, not a smaller adjustment
    if missing_terms(pred, r, shape)[0] or set(terms) - KEPT_LAYER_TERMS - set(documented):
        return None
    adj: list[tuple[str, Fraction]] = []
    if "dropout masks" in terms:
        # no dropout: no masks; hidden dropout (the bug plans): each mask in the activations' dtype
        # (h wide, 2 masks), twice the model's 1 byte per element at 16 bits
        adj.append(("dropout masks: the harness's hidden dropout keeps them in the activations' dtype", terms["dropout masks"])
                   if r.dropout else ("no dropout masks (the harness model has no dropout)", -terms["dropout masks"]))
    if "attention core" in terms:
        adj.append(("no attention scores, softmax dropout mask or its output (SDPA's fused kernel)",
                    -terms["attention core"]))
    if r.recompute != "selective" and not r.context_axis:
        adj.append(("SDPA's log-sum-exp (fp32, one per head and token)", Fraction(4 * shape.heads, t) * tokens))
    stats = _norm_statistics(shape, whole, width)
    if not stats:
        return None
    adj += [(f"{name}, two norms", 2 * v) for name, v in stats]
    if shape.moe:
        adj += _moe_adjustments(terms, shape, tokens, width)
    elif shape.gated_mlp:
        adj.append(("SiLU(gate) kept for the product with up (f wide)", tokens * Fraction(shape.ffn, t) * width))
    if r.sequence_parallel and t > 1:
        adj.append(("DTensor keeps the all-gathered input of the attention's and the MLP's column-parallel linear "
                    "(Megatron-LM keeps the sequence shard and gathers it again in backward)",
                    2 * tokens * shape.hidden * width * (t - 1) / t))
    return sum(terms.values(), Fraction(0)) + sum(v for _, v in adj), adj


def _moe_adjustments(terms: dict[str, Fraction], shape: TinyShape, tokens: Fraction,
                     width: Fraction) -> list[tuple[str, Fraction]]:
    """A mixture-of-experts layer of the harness (capacity-padded slots, E·C = capacity_factor·top_k
    per token): the router keeps its softmax output (E per token), the top-k gates and their sum
    (k + 1 per token) in the activations' dtype where the model counts fp32 logits; every slot
    keeps, beyond the model's permuted input and expert MLP terms, SiLU(gate) (gated experts, fe
    wide), the expert output and its gate-weighted product (h each) and its gate weight (1); a
    gated shared expert keeps its SiLU(gate) (its width), a sigmoid shared-expert gate its output
    (1) and the shared experts' output it scales (h)."""
    slots = tokens * shape.capacity_factor * shape.top_k
    adj = [("router: softmax output, top-k gates and their sum in the activations' dtype, not fp32 logits",
            tokens * (shape.experts + shape.top_k + 1) * width - terms.get("router logits", Fraction(0))),
           ("per expert slot: its output, its gate-weighted product and its gate weight",
            slots * (2 * shape.hidden + 1) * width)]
    if shape.gated_mlp:
        adj.append(("per expert slot: SiLU(gate) (fe wide)", slots * shape.expert_ffn * width))
        if shape.shared_experts:
            adj.append(("shared experts' SiLU(gate)", tokens * shape.shared_experts * shape.shared_expert_ffn * width))
    if shape.shared_experts and shape.shared_expert_gate:
        adj.append(("shared-expert gate: its sigmoid output and the output it scales", tokens * (shape.hidden + 1) * width))
    return adj


def harness_outside_bytes(pred: Prediction, r: Realisation, shape: TinyShape) -> tuple[Fraction, list[tuple[str, Fraction]]] | None:
    """Outside the blocks, by the rules of ``eager-saved-outside`` (docs/validation.md): the
    model's output-layer inputs and fp32 logits (the loss's log-softmax output is as large), less
    the embedding mask, with the final norm's statistics, the loss's fp32 total weight, under
    sequence parallelism the head's all-gathered input, and with tied embeddings under tensor
    parallelism the whole (not vocabulary-parallel) logits."""
    terms = dict(pred.activation_outside_terms)
    if not terms or "output-layer inputs" not in terms or "logits" not in terms \
            or sum(terms.values(), Fraction(0)) != pred.activations_outside:
        return None
    width = widths_of(r)["activations"]
    t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    cp = r.sizes[r.context_axis] if r.context_axis else 1
    tokens = Fraction(shape.seq, cp) * shape.microbatch
    # the embedding's dropout mask, which the harness has no counterpart of: 1 byte per element, and
    # required (the model always emits it); no term other than these three
    if terms.get("embedding mask") != tokens * shape.hidden / (t if r.sequence_parallel else 1) \
            or set(terms) != {"embedding mask", "output-layer inputs", "logits"}:
        return None
    stats = _norm_statistics(shape, tokens / (t if r.sequence_parallel else 1), width)
    if not stats:
        return None
    adj: list[tuple[str, Fraction]] = []
    if "embedding mask" in terms:
        adj.append(("no embedding dropout mask (the harness model has no dropout)", -terms["embedding mask"]))
    adj += [(f"final {name}", v) for name, v in stats]
    adj.append(("cross entropy's total weight (0-d fp32)", Fraction(4)))
    if shape.tied_embeddings and t > 1:
        adj.append(("the tied head is kept whole on the tensor axis (as tensor-replicated-params): the loss's "
                    "log-softmax is V wide, not V/t", terms["logits"] * (t - 1)))
    if r.sequence_parallel and t > 1:
        adj.append(("DTensor keeps the head's all-gathered input", tokens * shape.hidden * width * (t - 1) / t))
    return sum(terms.values(), Fraction(0)) + sum(v for _, v in adj), adj


def _bytes(v: Fraction) -> str:
    return f"{int(v):,}" if v.denominator == 1 else str(v)


def missing_terms(pred: Prediction, r: Realisation, shape: TinyShape) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The named terms the activation model must emit for this run (its documented terms: those the
    harness keeps and those it lacks) that the prediction lacks, per layer and outside; none where
    the model gives no named terms."""
    layer = set(dict(pred.activation_layer_terms))
    if not layer or "layer" in layer:
        want_layer: set[str] = set()
    elif r.recompute == "full":
        want_layer = {"layer input"}
    else:
        want_layer = KEPT_LAYER_TERMS | {"dropout masks"} | ({"router logits"} if shape.moe else set()) \
            | (set() if pred.flash_attention or r.recompute == "selective" else {"attention core"})
    outside = set(dict(pred.activation_outside_terms))
    want_outside = {"embedding mask", "output-layer inputs", "logits"} if outside else set()
    return tuple(sorted(want_layer - layer)), tuple(sorted(want_outside - outside))


def _activation_status(measured: list[int], predicted: Fraction, harness, mechanism: str,
                       missing: tuple[str, ...] = ()) -> tuple[str, str, str]:
    if missing:  # a term removed from the model: never a match, never explained, whatever the total
        return RowStatus.DIFFERS, "", f"the activation model lacks its term{'s' if len(missing) > 1 else ''} " + \
            ", ".join(missing) + " (docs/validation.md)"
    if all(m == predicted for m in measured):
        return RowStatus.MATCH, "", ""
    if harness is not None and all(m == harness[0] for m in measured):
        return explained(mechanism, "the model's terms less what the harness lacks, plus what eager PyTorch keeps: "
                         + "; ".join(f"{name} {'+' if v >= 0 else '-'}{_bytes(abs(v))}" for name, v in harness[1])
                         + f" = {_bytes(harness[0])}")
    note = "no documented rule applies (docs/validation.md)" if harness is None else \
        f"the documented rules give {_bytes(harness[0])}"
    return RowStatus.DIFFERS, "", note


def activation_rows(pred: Prediction, results: list[dict], r: Realisation | None = None,
                    shape: TinyShape | None = None) -> list[Row]:
    """Saved activations of the last step's forward (distinct storages autograd saves, floating
    point, parameters left out), beside the activation model's prediction for the same scaled
    shape; the per-layer row shows the largest block and compares every block of every rank.
    ``match`` when every rank measured the prediction; ``explained`` when every rank
    measured exactly what the mechanisms ``eager-saved-activations`` / ``eager-saved-outside``
    recompute from the model's named terms; otherwise ``differs``, part of the outcome."""
    if pred.activations_per_layer is None or any("saved_activations" not in res for res in results):
        return []
    layers = [max((v for k, v in res["saved_activations"].items() if k != "outside"), default=0) for res in results]
    outside = [res["saved_activations"].get("outside", 0) for res in results]
    lh = harness_layer_bytes(pred, r, shape) if r is not None and shape is not None else None
    oh = harness_outside_bytes(pred, r, shape) if r is not None and shape is not None else None
    blocks = [v for res in results for k, v in res["saved_activations"].items() if k != "outside"]  # every block
    ml, mo = missing_terms(pred, r, shape) if r is not None and shape is not None else ((), ())
    if pred.activation_count in EAGER_COUNTS and r is not None and shape is not None:
        (ls, lm, ln), (os_, om, on) = eager_status(pred, r, shape, blocks or [0], outside)
    else:
        ls, lm, ln = _activation_status(blocks or [0], pred.activations_per_layer, lh, "eager-saved-activations", ml)
        os_, om, on = _activation_status(outside, pred.activations_outside, oh, "eager-saved-outside", mo)
    lead = "distinct storages autograd saves in one block's forward (saved_tensors_hooks), parameters left out"
    return [
        Row("activations", "saved activations per layer per microbatch", pred.activations_per_layer,
            Fraction(max(layers)), ls, ln or lead, tuple(layers) if len(set(layers)) > 1 else (), lm),
        Row("activations", "saved activations outside the layers", pred.activations_outside, Fraction(max(outside)),
            os_, on or "embedding, final norm, head and loss", tuple(outside) if len(set(outside)) > 1 else (), om),
    ]


def peak_rows(pred: Prediction, results: list[dict]) -> list[Row]:
    """The allocator's peak beside the engine's peak device bytes, where every rank's platform
    reports one (CUDA); reported, not part of the outcome. On CPU no rank reports one and there
    is no row (``peak_note`` says so): an absent peak is never shown as 0."""
    peaks = [res.get("allocator_peak") for res in results]
    if pred.device_peak is None or any(v is None for v in peaks):
        return []
    return [Row("peak", "allocator peak per rank", pred.device_peak, Fraction(max(peaks)), RowStatus.REPORTED,
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
                RowStatus.MATCH if pred.psi == results[0]["param_count"] else RowStatus.DIFFERS)]
    rows += _state_rows(pred, r, results, shape)
    rows += collective_rows(pred, r, results, shape)
    rows += activation_rows(pred, results, r, shape)
    rows += stage_rows(pred, r, shape, results)
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
