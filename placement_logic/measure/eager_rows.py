"""The saved-activation rows under the ``pytorch_eager`` convention (``costs.eager``): the
activation model counts what eager PyTorch keeps, so the measured bytes must equal the
prediction on every rank (``match``). Two things the harness runs beyond the plan are
explained, each computed from the tiny shape, never from the engine's figure: the bug
plans' hidden dropout (two masks per block in the activations' dtype) and, with tied
embeddings under tensor parallelism, the head kept whole (its log-softmax V wide, not V/t).
The terms the convention emits for the run are required: one missing, or one the convention
does not name, makes the row differ whatever the total.
"""

from __future__ import annotations

from fractions import Fraction

from .mechanisms import explained
from .predict import Prediction
from .realise import Realisation, widths_of
from .shape import TinyShape

EAGER = "pytorch_eager"


def required_terms(r: Realisation, shape: TinyShape) -> tuple[set[str], set[str]]:
    """The named terms ``costs.eager`` emits for this run, per layer and outside (docs/costs.md)."""
    t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    sp = r.sequence_parallel and t > 1
    if r.recompute == "full":
        layer = {"layer input"}
    else:
        layer = {"norm inputs", "norm statistics", "norm outputs", "query", "keys and values", "projection input"}
        layer |= {"normalised norm inputs"} if shape.norm == "rmsnorm" else set()
        layer |= {"attention log-sum-exp"} if r.recompute != "selective" and not r.context_axis else set()
        layer |= {"router", "experts"} if shape.moe else {"mlp"}
        layer |= {"gathered inputs"} if sp else set()
    outside = {"output-layer inputs", "final norm statistics", "logits", "loss total weight"}
    outside |= {"gathered head input"} if sp else set()
    return layer, outside


def _tokens(r: Realisation, shape: TinyShape) -> tuple[int, Fraction, Fraction]:
    t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    cp = r.sizes[r.context_axis] if r.context_axis else 1
    tokens = Fraction(shape.seq, cp) * shape.microbatch
    return t, tokens, tokens / (t if r.sequence_parallel else 1)


def layer_deviation(r: Realisation, shape: TinyShape) -> tuple[str, Fraction] | None:
    """What the harness keeps per block beyond eager PyTorch's count for the plan: the hidden
    dropout's two masks (Tw·h each, in the activations' dtype) in the bug plans that run it."""
    if not r.dropout:
        return None
    _, _, whole = _tokens(r, shape)
    return ("the harness's hidden dropout keeps two h-wide masks per block in the activations' dtype",
            2 * whole * shape.hidden * widths_of(r)["activations"])


def outside_deviation(r: Realisation, shape: TinyShape) -> tuple[str, Fraction] | None:
    """With tied embeddings under tensor parallelism the harness keeps the head whole (as
    ``tensor-replicated-params``): the loss's fp32 log-softmax is V wide, (t-1)/t of it more."""
    t, tokens, _ = _tokens(r, shape)
    if not (shape.tied_embeddings and t > 1):
        return None
    return ("the tied head is kept whole on the tensor axis: the loss's fp32 log-softmax is V wide, not V/t",
            4 * tokens * shape.vocab * Fraction(t - 1, t))


def _status(measured: list[int], pred_total: Fraction, terms: tuple, required: set[str],
            deviation: tuple[str, Fraction] | None, mechanism: str) -> tuple[str, str, str]:
    names = {n for n, _ in terms}
    if names != required:
        lacks, extra = sorted(required - names), sorted(names - required)
        return "differs", "", "the pytorch_eager count " + "; ".join(
            x for x in (f"lacks {', '.join(lacks)}" if lacks else "",
                        f"emits {', '.join(extra)}, which eager PyTorch does not keep here" if extra else "") if x)
    if sum((v for _, v in terms), Fraction(0)) != pred_total:
        return "differs", "", "the pytorch_eager terms do not add up to the predicted figure"
    if all(m == pred_total for m in measured):
        return "match", "", ""
    if deviation is not None and all(m == pred_total + deviation[1] for m in measured):
        return explained(mechanism, f"{deviation[0]}: +{deviation[1]} = {pred_total + deviation[1]}")
    return "differs", "", "the pytorch_eager count differs from what autograd saved (docs/costs.md, \"Conventions\")"


def eager_status(pred: Prediction, r: Realisation, shape: TinyShape, blocks: list[int],
                 outside: list[int]) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """(status, mechanism, note) of the per-layer and the outside row under ``pytorch_eager``."""
    layer_req, outside_req = required_terms(r, shape)
    layer = _status(blocks, pred.activations_per_layer, pred.activation_layer_terms, layer_req,
                    layer_deviation(r, shape), "harness-hidden-dropout")
    out = _status(outside, pred.activations_outside, pred.activation_outside_terms, outside_req,
                  outside_deviation(r, shape), "harness-tied-head-whole")
    return layer, out
