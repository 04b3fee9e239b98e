"""Collective rows: each measured (kind, mesh axes) buffer beside the predicted one, with the
mechanisms that explain a collective's difference (``mechanisms.MECHANISMS``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from .mechanisms import (
    calls_fit,
    carried_in_parts,
    equal_calls,
    explained,
    kept_whole_as_documented,
    measured_collectives,
    measured_records,
    params_per_tensor_rank,
    predicted_calls,
    stage_note,
    stage_shares,
    stage_tensor_elements,
)
from .predict import Prediction
from .realise import Realisation, widths_of
from .report import Row, RowStatus
from .shape import TinyShape
from .tensor_axis import tensor_axis_extras


def _predicted_collectives(pred: Prediction) -> dict[tuple[str, tuple[str, ...]], Fraction]:
    predicted: dict[tuple[str, tuple[str, ...]], Fraction] = {}
    for c in pred.collectives:
        # a point-to-point transfer is sent by one stage and received by the next: an interior
        # stage both sends and receives the engine's buffer bytes in that phase
        keys = [(f"p2p {way}, {c.phase}", c.axes) for way in ("sent", "received")] if c.kind == "p2p" else [(c.kind, c.axes)]
        for key in keys:
            predicted[key] = predicted.get(key, Fraction(0)) + c.buffer_bytes
    return predicted


# the collectives a data strategy runs per pipeline stage, and the state each carries
_STAGE_KINDS = {"ddp": {"all_reduce": "grads"}, "zero1": {"reduce_scatter": "grads", "all_gather": "params"},
                "zero2": {"reduce_scatter": "grads", "all_gather": "params"},
                "zeropp": {"all_gather": "params", "reduce_scatter": "grads", "all_reduce": "grads"}}


_NOT = (RowStatus.DIFFERS, "", "")  # not explained by a rule


@dataclass
class _Run:
    """What every row of one run is compared with: the prediction, the run's realisation and results,
    the predicted and measured collectives, and the sizes the mechanisms are checked against."""
    pred: Prediction
    r: Realisation
    results: list[dict]
    shape: TinyShape
    predicted: dict
    per_rank: list[dict]
    shares: list
    psi: Fraction
    grads_width: Fraction
    boundary: int


def collective_rows(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> list[Row]:
    predicted = _predicted_collectives(pred)
    per_rank = [measured_collectives(res, r.mesh) for res in results]
    c = _Run(pred, r, results, shape, predicted, per_rank, stage_shares(r, results, shape),
             Fraction(shape.param_count()), widths_of(r)["grads"],
             shape.seq * shape.microbatch * shape.hidden * widths_of(r)["activations"])
    # predicted collectives first, so that a measured stand-in is paired before it is listed alone
    order = lambda k: (k[1], k[0])
    keys = sorted(predicted, key=order) + sorted({k for m in per_rank for k in m} - set(predicted), key=order)
    used: set = set()
    rows = []
    for key in keys:
        if key in used:
            continue
        rows.append(_row(c, key, used))
        used.add(key)
    return rows


def _row(c: _Run, key: tuple[str, tuple[str, ...]], used: set) -> Row:
    """One collective's row: matched call by call, else explained by a mechanism, else a difference."""
    kind, axes = key
    label = f"{kind} over {'×'.join(axes) or 'one rank'}"
    got = tuple(m.get(key, 0) for m in c.per_rank)
    p = c.predicted.get(key, Fraction(0))
    mechanism = ""
    if all(g == p for g in got):
        status, note = _match_calls(c.pred, c.r, c.results, key, c.shape) if p else (RowStatus.MATCH, "")
    else:
        (status, mechanism, note), got, measured = _explain(c, key, p, got, used)
        label += measured
    return Row("collectives", label + ", buffer bytes per step", p, Fraction(max(got)), status, note,
               got if len(set(got)) > 1 else (), mechanism)


def _explain(c: _Run, key: tuple[str, tuple[str, ...]], p: Fraction, got: tuple,
             used: set) -> tuple[tuple[str, str, str], tuple, str]:
    """The first mechanism that explains a differing row (each checks the prediction and every rank's
    records), with the measured bytes it compares and what the label adds; else the difference."""
    kind, axes = key
    for rule in (_stage_share, _edge_stages):
        found = rule(c, key, p, got)
        if found[0] != RowStatus.DIFFERS:
            return found, got, ""
    found = _scatter_gather(RowStatus.DIFFERS, "", "", kind, axes, p, got, c.r, c.results, c.shape, c.boundary,
                            c.pred)
    if found[0] != RowStatus.DIFFERS:
        return found, got, ""
    twice = _reduced_twice(c, key, p, got)
    if twice is not None:
        found, alt, once = twice
        used.add((kind, once))
        return found, alt, f" (measured: {len(axes) // len(once)} all_reduce over {'×'.join(once)})"
    in_clip = tuple(measured_collectives(res, c.r.mesh, "clip").get(key, 0) for res in c.results)
    for rule in (_tied_sync, _tied_whole, _clip_scalars, _tensor_axis):
        found = rule(c, key, p, got, in_clip)
        if found[0] != RowStatus.DIFFERS:
            return found, got, ""
    return _NOT, got, ""


def _stage_share(c: _Run, key, p: Fraction, got: tuple) -> tuple[str, str, str]:
    """pipeline-stage-share: DDP/replicate all-reduces each stage's own gradients; the engine's
    buffer is the uniform Ψ/p of gradient bytes."""
    r, shape, (kind, axes) = c.r, c.shape, key
    stage_kinds = _STAGE_KINDS.get(r.data, {})
    if not (r.pipeline_axis and kind in stage_kinds and bool(axes) and set(axes) <= set(r.data_axes)):
        return _NOT
    state = stage_kinds[kind]
    t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
    # zeropp: the engine's buffer is the stage's whole chunks on the first data axis (gathered,
    # reduce-scattered) and their shard of it on the second, once per predicted call
    calls = sum((x.calls for x in c.pred.collectives if x.kind == kind and tuple(x.axes) == axes), Fraction(0))
    shard = r.sizes[r.data_axes[0]] if r.data == "zeropp" and axes != (r.data_axes[0],) else 1
    documented, measured_ok, excess = _stage_buffers(c, p, got, t, calls, widths_of(r)[state], shard)
    one_size = len(predicted_calls(c.pred, key)) == 1
    in_calls = all(equal_calls(measured_records(res, r.mesh, key), calls, carried_in_parts(r, key, shape))
                   for res in c.results)
    if not (documented and measured_ok and one_size and in_calls):
        return _NOT
    what = "gradients" if state == "grads" else "parameters"
    if calls != 1 or shard != 1:
        what = (f"{calls} × the stage's {what}" + (f" (its 1/{shard} shard over '{r.data_axes[0]}')"
                                                 if shard != 1 else ""))
    else:
        what = f"the stage's {what}"
    status, mechanism, note = explained("pipeline-stage-share", stage_note(r, shape, f"This buffer, {what},"))
    if any(excess):
        mechanism += " + tensor-replicated-params"
        note += (f"; the tied embedding and its copy are kept whole on '{r.tensor_axis}' (the plan shards "
                 f"them 1/{t}), {max(excess)} B more in the first and last stage's buffer")
    return status, mechanism, note


def _stage_buffers(c: _Run, p: Fraction, got: tuple, t: int, calls: Fraction, w, shard: int) -> tuple:
    """(whether the prediction is the documented even split, whether every rank's buffer is its own
    stage's, each rank's bytes beyond it: the tied embedding kept whole)."""
    r, shape = c.r, c.shape
    if t == 1:
        # the even split Ψ/p, at the state's width; each rank's buffer its stage's exact count
        documented = p == calls * w * c.psi / (r.stages * shard)
        return documented, all(g == p * f for g, f in zip(got, c.shares)), [0] * len(got)
    # under tensor parallelism the even split is of the elements each tensor rank holds,
    # counted from the shape (with tied embeddings less the last stage's copy, which Ψ
    # leaves out); each rank's buffer is its own stage's, with the tied embedding and its
    # copy kept whole on the tensor axis: (t-1)/t of V·h more on the first and last stage
    per = [stage_tensor_elements(shape, k, r.stages, t, r.chunks) for k in range(r.stages)]
    copy = Fraction(shape.vocab * shape.hidden, t) if shape.tied_embeddings else 0
    tied = shape.tied_embeddings and r.chunks == 1
    documented = None not in per and p == calls * w * (sum(per) - copy) / r.stages
    excess = [calls * w * shape.vocab * shape.hidden * (t - 1) / t
              if tied and res["coords"][r.pipeline_axis] in (0, r.stages - 1) else 0 for res in c.results]
    measured_ok = documented and all(g == calls * w * per[res["coords"][r.pipeline_axis]] + e
                                     for g, e, res in zip(got, excess, c.results))
    return documented, measured_ok, excess


def _edge_stages(c: _Run, key, p: Fraction, got: tuple) -> tuple[str, str, str]:
    """pipeline-edge-stages: the engine's interior stage sends and receives m·v boundaries of s·b·h;
    under sequence parallelism each tensor rank sends its own sequence shard, s·b·h/t (and without
    it, Megatron-LM's scatter/gather sends s·b·h/t: pipeline-scatter-gather)."""
    r, shape, (kind, axes) = c.r, c.shape, key
    sp_div = r.sizes[r.tensor_axis] if r.tensor_axis and (r.sequence_parallel or r.stages > 1) else 1
    if not (kind.startswith("p2p ") and r.pipeline_axis and axes == (r.pipeline_axis,)
            and p == c.boundary * shape.microbatches * r.chunks / sp_div):
        return _NOT
    want = [p * edge_share(kind, res["coords"][r.pipeline_axis], r.stages, r.chunks) for res in c.results]
    size = c.boundary / sp_div  # every transfer one boundary, as many as the rank makes
    if all(g == w for g, w in zip(got, want)) \
            and predicted_calls(c.pred, key) == Counter({size: shape.microbatches * r.chunks}) \
            and all(calls_fit(measured_records(res, r.mesh, key), Counter({size: g / size}), 1)
                    for g, res in zip(got, c.results)):
        return explained("pipeline-edge-stages", _edge_note(kind, r))
    return _NOT


def _reduced_twice(c: _Run, key, p: Fraction, got: tuple) -> tuple[tuple[str, str, str], tuple, tuple] | None:
    """gradient-reduced-twice: a plan reducing over an axis twice, measured as that many all-reduces over
    it once: (the explanation, the measured bytes over the axis once, the axes once)."""
    r, (kind, axes) = c.r, key
    once = tuple(dict.fromkeys(axes))
    if not (r.grad_reduce == "twice" and kind == "all_reduce" and len(once) < len(axes)
            and all(g == 0 for g in got) and p == c.grads_width * c.psi):
        return None
    alt = tuple(m.get((kind, once), 0) for m in c.per_rank)
    twice = Fraction(len(axes), len(once))
    if not (all(a == p * twice for a in alt) and predicted_calls(c.pred, key) == Counter({p: 1})
            and all(equal_calls(measured_records(res, r.mesh, (kind, once)), twice,
                                carried_in_parts(r, (kind, once), c.shape)) for res in c.results)):
        return None
    return explained("gradient-reduced-twice", (
        f"the plan reduces over ({', '.join(axes)}): DDP's all-reduce and the loop's own, each of the "
        f"whole gradient over {'×'.join(once)}; the cost engine sizes one all-reduce of that buffer")), alt, once


def _tied_sync(c: _Run, key, p: Fraction, got: tuple, in_clip: tuple) -> tuple[str, str, str]:
    """tied-embedding-sync: Megatron-LM's embedding group sums the first stage's embedding gradients
    with the last stage's copy's (and the clip's scalar beside it)."""
    r, shape, (kind, axes) = c.r, c.shape, key
    if not (shape.tied_embeddings and r.pipeline_axis and r.stages > 1 and kind == "all_reduce" and p == 0):
        return _NOT
    # under ZeRO-2 the two copies' gradients are summed once reduce-scattered: their 1/dp shards
    tie = shape.vocab * shape.hidden * widths_of(r)["grads"] / (r.data_size if r.data == "zero2" else 1)
    # the clip over the stages' scalar, in its own phase, beside the tied copies' sum
    clip_scalar = bool(r.clip) and all(x == 4 for x in in_clip)
    got_tie = tuple(g - x for g, x in zip(got, in_clip)) if clip_scalar else got

    def member(res) -> bool:
        edge = res["coords"][r.pipeline_axis] in (0, r.stages - 1)
        return edge and (axes == (r.pipeline_axis,) or f"rank{res['rank']}" in axes)

    if not all(g == (tie if member(res) else 0) for g, res in zip(got_tie, c.results)):
        return _NOT
    status, mechanism, note = explained("tied-embedding-sync", (
        "Megatron-LM's embedding group: the first stage's word embedding and the last stage's copy of it "
        "sum their gradients, one all-reduce of "
        + (f"V·h·4 = {tie} B" if r.data != "zero2" else
           f"their reduce-scattered shards, V·h·4/{r.data_size} = {tie} B (ZeRO-2 keeps no whole gradient)")
        + " between the two; the cost model leaves it out"))
    if clip_scalar:
        mechanism = "tied-embedding-sync + clip-norm-scalars"
        note += ("; and the clip over pipeline stages all-reduces one fp32 sum of squares (4 B), scalar "
                 "traffic the cost model leaves out")
    return status, mechanism, note


def _tied_whole(c: _Run, key, p: Fraction, got: tuple, in_clip: tuple) -> tuple[str, str, str]:
    r, (kind, axes) = c.r, key
    if r.tensor_axis and kind in ("all_reduce", "reduce_scatter", "all_gather") and bool(axes) \
            and set(axes) <= set(r.data_axes) and p:
        return _tied_whole_buffer(c.pred, r, c.results, c.shape, key, got)
    return _NOT


def _clip_scalars(c: _Run, key, p: Fraction, got: tuple, in_clip: tuple) -> tuple[str, str, str]:
    """clip-norm-scalars: the clip's fp32 partial norms, per parameter tensor or per stage, or over the tensor axis."""
    r, (kind, axes) = c.r, key
    if r.clip == "global" and kind == "all_reduce" and p == 0 and not r.pipeline_axis \
            and all(x == g == 4 * res["param_tensors"] for x, g, res in zip(in_clip, got, c.results)):
        return explained("clip-norm-scalars", (
            f"clip_grad_norm_ all-reduces one partial fp32 norm per parameter tensor "
            f"({c.results[0]['param_tensors']} × 4 B); the cost model leaves this scalar traffic out"))
    if r.clip in ("global", "stage") and r.pipeline_axis and kind == "all_reduce" \
            and p == 0 and all(x == g == 4 for x, g in zip(in_clip, got)):
        return explained("clip-norm-scalars", (
            "the clip over pipeline stages all-reduces one fp32 sum of squares (4 B) over "
            f"{'×'.join(axes)}; the cost model leaves this scalar traffic out"))
    if _tensor_clip_scalars(r, kind, axes, p, got, in_clip, c.results):
        return _tensor_clip_note(r, p, in_clip)
    return _NOT


def _tensor_axis(c: _Run, key, p: Fraction, got: tuple, in_clip: tuple) -> tuple[str, str, str]:
    """The tensor axis's own collectives (``tensor_axis``), the clip's scalar over it set apart."""
    r, (kind, axes) = c.r, key
    if not (r.tensor_axis and axes == (r.tensor_axis,)):
        return _NOT
    # the clip over pipeline stages' scalar is set apart (its own phase), then the rest compared
    clip_scalar = bool(r.clip) and bool(r.pipeline_axis) and all(x == 4 for x in in_clip)
    status, mechanism, note = tensor_axis_extras(kind, p, got, r, c.results, c.shape, c.boundary,
                                                 predicted_calls(c.pred, key), "clip" if clip_scalar else None)
    if status == RowStatus.EXPLAINED and clip_scalar:
        mechanism += " + clip-norm-scalars"
        note += (f"; and the clip over each stage's norm all-reduces one fp32 sum of squares (4 B) over "
                 f"'{r.tensor_axis}', scalar traffic the cost model leaves out")
    return status, mechanism, note


def _tensor_clip_scalars(r: Realisation, kind: str, axes: tuple, p, got: tuple, in_clip: tuple,
                         results: list[dict]) -> bool:
    """The global clip's partial norms over the tensor axis (parameters on the data × tensor mesh beside
    data-mesh ones): every rank's tensor-axis all-reduce the predicted bytes plus k ≤ its parameter
    tensors fp32 scalars, all in the clip's phase."""
    return (r.clip == "global" and bool(r.tensor_axis) and axes == (r.tensor_axis,) and kind == "all_reduce"
            and not r.pipeline_axis and len(set(in_clip)) == 1
            and all(0 < c <= 4 * res["param_tensors"] and c % 4 == 0 and g - c == p
                    for c, g, res in zip(in_clip, got, results)))


def _tensor_clip_note(r: Realisation, p, in_clip: tuple) -> tuple[str, str, str]:
    return explained("clip-norm-scalars", (
        f"the clip's norm of the parameters sharded over '{r.tensor_axis}' all-reduces one fp32 partial norm "
        f"per such tensor over it ({in_clip[0] // 4} × 4 B) beside the {p} B the cost engine predicts; the cost "
        "model leaves this scalar traffic out"))


def _tied_whole_buffer(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape, key,
                       got: tuple) -> tuple[str, str, str]:
    """``tensor-replicated-params`` for a data-axis buffer of parameters or their gradients under
    DDP: the elements each tensor rank holds with the tied embedding whole (the run) over those with
    the plan's 1/t shard of it, both counted from the shape, times the engine's buffer, in the
    engine's number of calls."""
    t = r.sizes[r.tensor_axis]
    if not (shape.tied_embeddings and not r.pipeline_axis and r.data == "ddp"
            and kept_whole_as_documented(r, results, shape)):
        return RowStatus.DIFFERS, "", ""
    p = sum((size * n for size, n in predicted_calls(pred, key).items()), Fraction(0))
    run, plan = params_per_tensor_rank(shape, t, True), params_per_tensor_rank(shape, t, False)
    n = sum(predicted_calls(pred, key).values(), Fraction(0))
    if not all(g == p * run / plan for g in got) or not all(
            equal_calls(measured_records(res, r.mesh, key), n, carried_in_parts(r, key, shape)) for res in results):
        return RowStatus.DIFFERS, "", ""
    return explained("tensor-replicated-params", (
        f"the tied embedding ({shape.vocab}·{shape.hidden}) is kept whole on '{r.tensor_axis}', which the plan "
        f"shards 1/{t}: this buffer of parameters or their gradients is the elements each tensor rank holds, {run} "
        f"where the plan holds {plan} (counted from the shape), in {n} calls"))


def _match_calls(pred: Prediction, r: Realisation, results: list[dict], key, shape: TinyShape) -> tuple[str, str]:
    """A row whose totals match is ``match`` only when every rank's records, in the order they ran,
    make up the engine's calls (``calls_fit``): as many calls, each of its predicted size."""
    want = predicted_calls(pred, key)
    for res in results:
        recs = measured_records(res, r.mesh, key)
        if not calls_fit(recs, want, carried_in_parts(r, key, shape)):
            calls = ", ".join(f"{n} × {size} B" for size, n in sorted(want.items()))
            return RowStatus.DIFFERS, (f"the totals agree, the calls do not: the engine predicts {calls}; rank {res['rank']} "
                               f"made {len(recs)} call{'s' if len(recs) != 1 else ''} ({_sizes(recs)}), which do not "
                               "make up those calls")
    return RowStatus.MATCH, ""


def _scatter_gather(status, mechanism, note, kind, axes, p, got, r, results, shape, boundary, pred):
    """pipeline-scatter-gather: the plan's stage sends are Megatron-LM's 1/t chunks, all-gathered over
    the tensor axis after each receive (both directions); the engine sends whole boundaries. Checked
    call by call: the plan's m·v transfers of s·b·h/t (gathers of s·b·h), the engine's of s·b·h."""
    t = r.sizes[r.tensor_axis] if r.tensor_axis and not r.sequence_parallel and r.stages > 1 else 1
    if status != RowStatus.DIFFERS or t == 1:
        return status, mechanism, note
    mv = shape.microbatches * r.chunks
    sends = boundary * mv
    key = (kind, axes)
    if kind.startswith("p2p ") and axes == (r.pipeline_axis,) and p == sends / t \
            and predicted_calls(pred, key) == Counter({Fraction(boundary, t): mv}) \
            and all(g == sends * edge_share(kind, res["coords"][r.pipeline_axis], r.stages, r.chunks)
                    and calls_fit(measured_records(res, r.mesh, key), Counter({boundary: g / boundary}), 1)
                    for g, res in zip(got, results)):
        return explained("pipeline-scatter-gather", (
            f"the plan sends 1/{t} of each s·b·h = {boundary} B boundary from each tensor rank (Megatron-LM's "
            f"scatter/gather); the engine sends it whole, as many transfers as its stage makes"))
    if kind == "all_gather" and axes == (r.tensor_axis,) and p == 2 * sends and all(g == 0 for g in got) \
            and predicted_calls(pred, key) == Counter({boundary: 2 * mv}):
        return explained("pipeline-scatter-gather", (
            f"Megatron-LM all-gathers the received 1/{t} chunks over '{r.tensor_axis}' (s·b·h = {boundary} B per "
            "microbatch and chunk, forward and backward); the engine receives whole boundaries and gathers nothing"))
    return status, mechanism, note


def _sizes(recs: list[int]) -> str:
    counts = Counter(recs)
    return ", ".join(f"{n} × {size} B" for size, n in sorted(counts.items())) or "none"


def edge_share(kind: str, rank: int, p: int, v: int) -> Fraction:
    """Of an interior stage's transfers in this direction and phase, the share pipeline rank ``rank`` makes.

    Rank d holds virtual stages d, d + p, ...; the last virtual stage (on rank p - 1) has
    no successor, the first (on rank 0) no predecessor. Forward activations are sent to
    the successor and received from the predecessor; backward gradients the other way.
    """
    sends_forward = kind.endswith("forward") == kind.startswith("p2p sent")
    edge = p - 1 if sends_forward else 0  # the rank whose edge chunk has no partner this way
    return Fraction(v - (1 if rank == edge else 0), v)


def _edge_note(kind: str, r: Realisation) -> str:
    v = r.chunks
    return ("the cost engine counts an interior stage, which sends and receives every microbatch's boundary "
            f"{'in each of its ' + str(v) + ' chunks ' if v > 1 else ''}in both phases; the first stage receives no "
            "activations and sends no gradients, the last sends no activations and receives no gradients"
            + (f", so each edge rank makes {v - 1} of {v} chunks' transfers that way" if v > 1 else
               ", so each edge rank makes all or none of them"))

