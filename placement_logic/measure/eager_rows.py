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
from .report import Row, RowStatus
from .shape import TinyShape

EAGER = "pytorch_eager"
EAGER_COUNTS = (EAGER, "pytorch_eager_cuda")  # costs.eager.EAGER_COUNTS


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
        return RowStatus.DIFFERS, "", "the pytorch_eager count " + "; ".join(
            x for x in (f"lacks {', '.join(lacks)}" if lacks else "",
                        f"emits {', '.join(extra)}, which eager PyTorch does not keep here" if extra else "") if x)
    if sum((v for _, v in terms), Fraction(0)) != pred_total:
        return RowStatus.DIFFERS, "", "the pytorch_eager terms do not add up to the predicted figure"
    if all(m == pred_total for m in measured):
        return RowStatus.MATCH, "", ""
    if deviation is not None and all(m == pred_total + deviation[1] for m in measured):
        return explained(mechanism, f"{deviation[0]}: +{deviation[1]} = {pred_total + deviation[1]}")
    return RowStatus.DIFFERS, "", "the pytorch_eager count differs from what autograd saved (docs/costs.md, \"Conventions\")"


def eager_status(pred: Prediction, r: Realisation, shape: TinyShape, blocks: list[int],
                 outside: list[int]) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """(status, mechanism, note) of the per-layer and the outside row under ``pytorch_eager``."""
    layer_req, outside_req = required_terms(r, shape)
    layer = _status(blocks, pred.activations_per_layer, pred.activation_layer_terms, layer_req,
                    layer_deviation(r, shape), "harness-hidden-dropout")
    out = _status(outside, pred.activations_outside, pred.activation_outside_terms, outside_req,
                  outside_deviation(r, shape), "harness-tied-head-whole")
    return layer, out


def _stage_of(r: Realisation, res: dict) -> str:
    """The engine's name of a rank's pipeline stage: ``first``, ``last`` or ``stage k`` between them."""
    k = res["coords"][r.pipeline_axis]
    return "first" if k == 0 else "last" if k == r.stages - 1 else f"stage {k}"


def harness_in_flight(r: Realisation, m: int, rank: int) -> tuple[int, int]:
    """(chunk-microbatches, output-layer microbatches) the harness's schedule keeps at stage
    ``rank``'s peak, from torch's schedule order alone (not the engine): GPipe runs every forward
    first (m); 1F1B runs p − rank − 1 warm-up forwards and one more before its first backward
    (min(m, p − rank)); interleaved 1F1B (v chunks) (v − 1)·p + 2·(p − rank − 1) warm-up forwards
    and one more (at most m·v); ZeroPP, run as torch's breadth-first ``ScheduleLoopedBFS``, every
    chunk's forwards of every microbatch before any backward (m·v). The last stage keeps the output
    layer of every microbatch in flight of its last chunk: m under GPipe and ZeroPP, else one."""
    p, v = r.stages, r.chunks
    last = rank == p - 1
    if r.schedule == "gpipe":
        return m, m if last else 0
    if r.schedule == "1f1b":
        return min(m, p - rank), int(last)
    if r.schedule == "interleaved":
        return min(m * v, (v - 1) * p + 2 * (p - rank - 1) + 1), int(last)
    if r.schedule == "zeropp":
        return m * v, m if last else 0
    return None


def _explained_peak(r: Realisation, shape: TinyShape, compared: list[dict], got: list[int], want: list[Fraction],
                    layer: Fraction, outside: Fraction) -> tuple[str, str, str]:
    """A stage peak that is not the engine's stage total, explained or not. The hidden dropout and
    the tied head kept whole add their shape-derived bytes per microbatch in flight of the
    harness's schedule (``harness_in_flight``) to the engine's total. ZeroPP
    (``zeropp-breadth-first``): the harness runs torch's breadth-first order, not the interleaved
    order the engine counts, so each rank must measure the engine's per-microbatch terms (with
    those deviations) times the breadth-first counts; the engine's own ZeroPP counts are then not
    checked by the run, and the note says so."""
    ld, od = layer_deviation(r, shape), outside_deviation(r, shape)
    per_chunk = shape.layers // (r.stages * r.chunks)
    flights = [harness_in_flight(r, shape.microbatches, res["coords"][r.pipeline_axis]) for res in compared]
    extra_layer, extra_outside = (ld[1] if ld else 0), (od[1] if od else 0)
    devs = "".join(f"; and {d[0]}" for d in (ld, od) if d)
    if r.schedule == "zeropp" and None not in flights:
        expect = [(layer + extra_layer) * f[0] * per_chunk + (outside + extra_outside) * f[1] for f in flights]
        if got == expect:
            also = "".join(f" + {name}" for name, d in (("harness-hidden-dropout", ld), ("harness-tied-head-whole", od))
                           if d)
            status, mechanism, note = explained("zeropp-breadth-first", (
                "the harness runs ZeroPP as torch's breadth-first ScheduleLoopedBFS (every chunk's forwards of the "
                f"step's {shape.microbatches} microbatches before any backward: {r.chunks}·{shape.microbatches} "
                "chunk-microbatches in flight, the last stage every microbatch's output layer), where the engine "
                "counts the interleaved 1F1B order: each rank measured the engine's per-microbatch terms times the "
                "breadth-first counts; the engine's own ZeroPP counts in flight are not checked by this run"
                + devs))
            return status, mechanism + also, note
    elif None not in flights and (ld or od):
        excess = [extra_layer * f[0] * per_chunk + extra_outside * f[1] for f in flights]
        if all(g == w + e for g, w, e in zip(got, want, excess)):
            dev = ld or od
            return explained("harness-hidden-dropout" if ld else "harness-tied-head-whole",
                             f"{dev[0]}, per microbatch in flight of the harness's schedule")
    return RowStatus.DIFFERS, "", "the stage's peak of kept saved activations differs from the engine's stage total"


def stage_rows(pred: Prediction, r: Realisation, shape: TinyShape, results: list[dict]) -> list[Row]:
    """A pipeline's saved activations under ``pytorch_eager``: every rank's peak of the bytes
    autograd keeps at once over the last step's schedule (``saved_activation_peak``) against the
    engine's total for its stage — the first, each interior one, the last — (its per-microbatch
    terms times the microbatches it counts in flight). ``match`` when every compared rank measured
    its stage's total; the hidden dropout and the tied head kept whole are explained per
    microbatch in flight of the harness's schedule (``harness_in_flight``), and ZeroPP's
    breadth-first order as ``_explained_peak`` states; a term missing or extra, or a total that is
    not the terms times the counts in flight, differs. A stage the
    engine gives no total for (none where its layers are of two kinds) is not compared and the
    note says so."""
    if not r.pipeline_axis or pred.activation_count not in EAGER_COUNTS or not pred.stage_activations \
            or any(res.get("saved_activation_peak") is None for res in results):
        return []
    per_stage = {name: (total, lm, om) for name, total, lm, om in pred.stage_activations}
    compared = [res for res in results if _stage_of(r, res) in per_stage]
    want = [per_stage[_stage_of(r, res)][0] for res in compared]
    got = [res["saved_activation_peak"] for res in compared]
    layer_req, outside_req = required_terms(r, shape)
    layer = sum((v for _, v in pred.activation_layer_terms), Fraction(0))
    outside = sum((v for _, v in pred.activation_outside_terms), Fraction(0))
    names = ({n for n, _ in pred.activation_layer_terms}, {n for n, _ in pred.activation_outside_terms})
    status, mechanism, note = RowStatus.MATCH, "", ""
    if names != (layer_req, outside_req):
        lacks = sorted((layer_req - names[0]) | (outside_req - names[1]))
        extra = sorted((names[0] - layer_req) | (names[1] - outside_req))
        status, note = RowStatus.DIFFERS, "the pytorch_eager count " + "; ".join(
            x for x in (f"lacks {', '.join(lacks)}" if lacks else "",
                        f"emits {', '.join(extra)}, which eager PyTorch does not keep here" if extra else "") if x)
    elif any(total != layer * lm + outside * om for total, lm, om in per_stage.values()):
        status, note = RowStatus.DIFFERS, "a stage's total is not its terms times the microbatches the engine counts in flight"
    elif got != want:
        status, mechanism, note = _explained_peak(r, shape, compared, got, want, layer, outside)
    skipped = len(results) - len(compared)
    lead = ("the peak of the bytes autograd keeps at once over the last step's schedule, every microbatch in flight "
            "(saved_tensors_hooks), against the engine's stage total: "
            + ", ".join(f"{name} {int(t):,} = {lm}·{layer} + {om}·{outside}" for name, (t, lm, om) in per_stage.items()))
    if skipped:
        lead += f"; {skipped} interior-stage rank(s) not compared (the engine gives no total for their stage)"
    return [Row("activations", "saved activations per stage at the schedule's peak", max(want), Fraction(max(got)),
                status, f"{note}; {lead}" if note else lead, tuple(got) if len(set(got)) > 1 else (), mechanism,
                tuple(want) if len(set(want)) > 1 else ())]
