"""Collective rows: each measured (kind, mesh axes) buffer beside the predicted one, with the
mechanisms that explain a collective's difference (``mechanisms.MECHANISMS``)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from .mechanisms import (
    axes_of_group,
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


def collective_rows(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> list[Row]:
    predicted = _predicted_collectives(pred)
    per_rank = [measured_collectives(res, r.mesh) for res in results]
    shares = stage_shares(r, results, shape)
    psi = Fraction(shape.param_count())
    grads_width = widths_of(r)["grads"]
    boundary = shape.seq * shape.microbatch * shape.hidden * widths_of(r)["activations"]
    # predicted collectives first, so that a measured stand-in is paired before it is listed alone
    order = lambda k: (k[1], k[0])
    keys = sorted(predicted, key=order) + sorted({k for m in per_rank for k in m} - set(predicted), key=order)
    used: set = set()
    rows = []
    for key in keys:
        if key in used:
            continue
        kind, axes = key
        label = f"{kind} over {'×'.join(axes) or 'one rank'}"
        got = tuple(m.get(key, 0) for m in per_rank)
        p = predicted.get(key, Fraction(0))
        status, mechanism, note = (RowStatus.MATCH if all(g == p for g in got) else RowStatus.DIFFERS), "", ""
        data_axes = bool(axes) and set(axes) <= set(r.data_axes)
        # pipeline-stage-share: DDP/replicate all-reduces each stage's own gradients; the engine's
        # buffer is the uniform Ψ/p of gradient bytes
        stage_kinds = _STAGE_KINDS.get(r.data, {})
        if status == RowStatus.DIFFERS and r.pipeline_axis and kind in stage_kinds and data_axes:
            state = stage_kinds[kind]
            t = r.sizes[r.tensor_axis] if r.tensor_axis else 1
            # zeropp: the engine's buffer is the stage's whole chunks on the first data axis (gathered,
            # reduce-scattered) and their shard of it on the second, once per predicted call
            excess = [0] * len(got)
            calls = sum((c.calls for c in pred.collectives if c.kind == kind and tuple(c.axes) == axes), Fraction(0))
            shard = r.sizes[r.data_axes[0]] if r.data == "zeropp" and axes != (r.data_axes[0],) else 1
            w = widths_of(r)[state]
            if t == 1:
                # the even split Ψ/p, at the state's width; each rank's buffer its stage's exact count
                documented = p == calls * w * psi / (r.stages * shard)
                measured_ok = all(g == p * f for g, f in zip(got, shares))
            else:
                # under tensor parallelism the even split is of the elements each tensor rank holds,
                # counted from the shape (with tied embeddings less the last stage's copy, which Ψ
                # leaves out); each rank's buffer is its own stage's, with the tied embedding and its
                # copy kept whole on the tensor axis: (t-1)/t of V·h more on the first and last stage
                per = [stage_tensor_elements(shape, k, r.stages, t, r.chunks) for k in range(r.stages)]
                copy = Fraction(shape.vocab * shape.hidden, t) if shape.tied_embeddings else 0
                tied = shape.tied_embeddings and r.chunks == 1
                documented = None not in per and p == calls * w * (sum(per) - copy) / r.stages
                excess = [calls * w * shape.vocab * shape.hidden * (t - 1) / t
                          if tied and res["coords"][r.pipeline_axis] in (0, r.stages - 1) else 0 for res in results]
                measured_ok = documented and all(g == calls * w * per[res["coords"][r.pipeline_axis]] + e
                                                 for g, e, res in zip(got, excess, results))
            one_size = len(predicted_calls(pred, key)) == 1
            in_calls = all(equal_calls(measured_records(res, r.mesh, key), calls, carried_in_parts(r, key, shape))
                           for res in results)
            if documented and measured_ok and one_size and in_calls:
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
        # pipeline-edge-stages: the engine's interior stage sends and receives m·v boundaries of s·b·h
        # under sequence parallelism each tensor rank sends its own sequence shard, s·b·h/t
        # (and without it, Megatron-LM's scatter/gather sends s·b·h/t: pipeline-scatter-gather)
        sp_div = r.sizes[r.tensor_axis] if r.tensor_axis and (r.sequence_parallel or r.stages > 1) else 1
        if status == RowStatus.DIFFERS and kind.startswith("p2p ") and r.pipeline_axis and axes == (r.pipeline_axis,) \
                and p == boundary * shape.microbatches * r.chunks / sp_div:
            want = [p * edge_share(kind, res["coords"][r.pipeline_axis], r.stages, r.chunks) for res in results]
            size = boundary / sp_div  # every transfer one boundary, as many as the rank makes
            if all(g == w for g, w in zip(got, want)) \
                    and predicted_calls(pred, key) == Counter({size: shape.microbatches * r.chunks}) \
                    and all(calls_fit(measured_records(res, r.mesh, key), Counter({size: g / size}), 1)
                            for g, res in zip(got, results)):
                status, mechanism, note = explained("pipeline-edge-stages", _edge_note(kind, r))
        status, mechanism, note = _scatter_gather(status, mechanism, note, kind, axes, p, got, r, results, shape,
                                                  boundary, pred)
        once = tuple(dict.fromkeys(axes))
        if status == RowStatus.DIFFERS and r.grad_reduce == "twice" and kind == "all_reduce" and len(once) < len(axes) \
                and all(g == 0 for g in got) and p == grads_width * psi:
            alt = tuple(m.get((kind, once), 0) for m in per_rank)
            twice = Fraction(len(axes), len(once))
            if all(a == p * twice for a in alt) and predicted_calls(pred, key) == Counter({p: 1}) \
                    and all(equal_calls(measured_records(res, r.mesh, (kind, once)), twice,
                                        carried_in_parts(r, (kind, once), shape)) for res in results):
                got = alt
                used.add((kind, once))
                label += f" (measured: {len(axes) // len(once)} all_reduce over {'×'.join(once)})"
                status, mechanism, note = explained("gradient-reduced-twice", (
                    f"the plan reduces over ({', '.join(axes)}): DDP's all-reduce and the loop's own, each of the "
                    f"whole gradient over {'×'.join(once)}; the cost engine sizes one all-reduce of that buffer"))
        in_clip = tuple(measured_collectives(res, r.mesh, "clip").get(key, 0) for res in results)
        if status == RowStatus.DIFFERS and shape.tied_embeddings and r.pipeline_axis and r.stages > 1 and kind == "all_reduce" \
                and p == 0:
            # under ZeRO-2 the two copies' gradients are summed once reduce-scattered: their 1/dp shards
            tie = shape.vocab * shape.hidden * widths_of(r)["grads"] / (r.data_size if r.data == "zero2" else 1)
            # the clip over the stages' scalar, in its own phase, beside the tied copies' sum
            clip_scalar = bool(r.clip) and all(c == 4 for c in in_clip)
            got_tie = tuple(g - c for g, c in zip(got, in_clip)) if clip_scalar else got

            def member(res, axes=axes) -> bool:
                edge = res["coords"][r.pipeline_axis] in (0, r.stages - 1)
                return edge and (axes == (r.pipeline_axis,) or f"rank{res['rank']}" in axes)

            if all(g == (tie if member(res) else 0) for g, res in zip(got_tie, results)):
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
        t = r.sizes.get(r.tensor_axis, 1) if r.tensor_axis else 1
        if status == RowStatus.DIFFERS and r.tensor_axis and kind in ("all_reduce", "reduce_scatter", "all_gather") \
                and data_axes and p:
            status, mechanism, note = _tied_whole_buffer(pred, r, results, shape, key, got)
        if status == RowStatus.DIFFERS and r.clip == "global" and kind == "all_reduce" and p == 0 and not r.pipeline_axis \
                and all(c == g == 4 * res["param_tensors"] for c, g, res in zip(in_clip, got, results)):
            status, mechanism, note = explained("clip-norm-scalars", (
                f"clip_grad_norm_ all-reduces one partial fp32 norm per parameter tensor "
                f"({results[0]['param_tensors']} × 4 B); the cost model leaves this scalar traffic out"))
        if status == RowStatus.DIFFERS and r.clip in ("global", "stage") and r.pipeline_axis and kind == "all_reduce" \
                and p == 0 and all(c == g == 4 for c, g in zip(in_clip, got)):
            status, mechanism, note = explained("clip-norm-scalars", (
                "the clip over pipeline stages all-reduces one fp32 sum of squares (4 B) over "
                f"{'×'.join(axes)}; the cost model leaves this scalar traffic out"))
        if status == RowStatus.DIFFERS and _tensor_clip_scalars(r, kind, axes, p, got, in_clip, results):
            status, mechanism, note = _tensor_clip_note(r, p, in_clip)
        if status == RowStatus.DIFFERS and r.tensor_axis and axes == (r.tensor_axis,):
            # the clip over pipeline stages' scalar is set apart (its own phase), then the rest compared
            clip_scalar = bool(r.clip) and bool(r.pipeline_axis) and all(c == 4 for c in in_clip)
            status, mechanism, note = _tensor_axis_extras(kind, p, got, r, results, shape, boundary,
                                                          predicted_calls(pred, key),
                                                          "clip" if clip_scalar else None)
            if status == RowStatus.EXPLAINED and clip_scalar:
                mechanism += " + clip-norm-scalars"
                note += (f"; and the clip over each stage's norm all-reduces one fp32 sum of squares (4 B) over "
                         f"'{r.tensor_axis}', scalar traffic the cost model leaves out")
        if status == RowStatus.MATCH and p:
            status, note = _match_calls(pred, r, results, key, shape)
        rows.append(Row("collectives", label + ", buffer bytes per step", p, Fraction(max(got)), status, note,
                        got if len(set(got)) > 1 else (), mechanism))
        used.add(key)
    return rows


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


def _tensor_axis_extras(kind: str, p: Fraction, got: tuple, r: Realisation, results: list[dict], shape: TinyShape,
                        boundary: int, predicted: Counter, set_apart: str | None = None) -> tuple[str, str, str]:
    """Tensor-axis collectives that differ from the engine's figures by a documented mechanism.

    The engine predicts Megatron's per-layer collectives (2 forward + 2 backward per layer and
    microbatch of s·b·h, 2 more with full recomputation) and the vocabulary-parallel
    embedding's, head's and cross entropy's per microbatch; with pipeline stages its figures
    are the last stage's (the head's and the loss's, not the first stage's embedding). Checked
    record by record on every rank: the prediction must be exactly that, and each rank's records
    what its own stage holds. The engine's calls are checked as well as its total: every rule below
    needs the calls Megatron-LM makes, each of its size (``predicted``)."""
    vocab = not shape.tied_embeddings
    calls = (6 if r.recompute == "full" else 4) * (shape.layers // r.stages) * shape.microbatches
    m, per_layer = shape.microbatches, calls * boundary
    tokens = shape.seq * shape.microbatch * 4  # one fp32 value per token of a microbatch
    norm_grad = shape.hidden * 4
    mesh = r.mesh
    staged = bool(r.pipeline_axis) and r.stages > 1
    engine_ends = 1 if staged else 2  # the stage ends the engine's per-device figure holds
    loss = 3 * m * tokens  # the engine's vocabulary-parallel cross entropy

    def records(res, phases=None):
        return sorted(rec["bytes"] for rec in res["collectives"][-1]
                      if rec["kind"] == kind and rec.get("phase") not in ("setup", set_apart)
                      and (phases is None or rec.get("phase") in phases)
                      and axes_of_group(tuple(rec["ranks"]), res["coords"], mesh) == (r.tensor_axis,))

    def ends(res) -> tuple[int, int]:
        """(1 if the rank holds the embedding, 1 if it holds the head)."""
        if not r.pipeline_axis:
            return 1, 1
        c = res["coords"][r.pipeline_axis]
        return int(c == 0), int(c == r.stages - 1)

    regather = 2 * (shape.layers // r.stages) * m + m  # Megatron-LM's backward re-gathers (sp-input-regather)
    engine = {(False, "all_reduce"): Counter({boundary: calls + engine_ends * m}) + Counter({tokens: 3 * m}),
              (True, "all_gather"): Counter({boundary: calls + engine_ends * m + regather}),
              (True, "reduce_scatter"): Counter({boundary: calls + engine_ends * m}),
              (True, "all_reduce"): Counter({tokens: 3 * m})}.get((r.sequence_parallel, kind))
    if engine is None or predicted != engine:
        return RowStatus.DIFFERS, "", ""
    tied_note = ("with tied embeddings the run keeps the embedding (the head) whole on "
                 f"'{r.tensor_axis}': no vocabulary-parallel collective, where the engine counts Megatron's")
    stage_note = ("the engine's figure is the last stage's (the head's and the loss's); the first stage makes "
                  "the embedding's instead, a stage holding neither only the layers'")
    if not r.sequence_parallel and kind == "all_reduce" and p == per_layer + engine_ends * m * boundary + loss \
            and r.tensor_reduced_again and vocab and not staged:
        again = whole_copies(shape, r.tensor_reduced_again)
        want = sorted([boundary] * (calls + 2 * m) + [tokens] * (3 * m) + [norm_grad] * again)
        if all(records(res) == want for res in results):
            return explained("group-reduced-over-tensor", (
                f"the plan's override reduces the gradients of {' and '.join(r.tensor_reduced_again)} over "
                f"'{r.tensor_axis}' as well: {again} all-reduces of h·4 = {norm_grad} B after backward (their whole "
                f"copies, equal on every tensor rank, summed); the engine's figure is Megatron's per-layer, "
                "embedding, head and cross-entropy collectives, which every rank makes exactly, and leaves the "
                "override's reductions out"))
    if not r.sequence_parallel and kind == "all_reduce" and p == per_layer + engine_ends * m * boundary + loss:
        if vocab:
            def want(res):
                emb, head = ends(res)
                return sorted([boundary] * (calls + m * emb + m * head) + [tokens] * (3 * m * head))

            if all(records(res) == want(res) for res in results):
                return explained("vocab-parallel-stage-ends", (
                    f"the embedding's output all-reduce (s·b·h = {boundary} B per microbatch, forward) on the first "
                    f"stage, the head's input-gradient all-reduce ({boundary} B, backward) and the cross entropy's "
                    f"3 × {tokens} B per microbatch on the last; " + stage_note))
        elif all(records(res) == [boundary] * calls for res in results):
            return explained("tensor-replicated-params", tied_note)
    if r.sequence_parallel and not vocab and kind == "reduce_scatter" and p == per_layer + engine_ends * m * boundary \
            and all(records(res) == [boundary] * calls for res in results):
        return explained("tensor-replicated-params", tied_note + "; the sequence-parallel embedding output is "
                         "split locally, with no reduce-scatter")
    again = regather * boundary if kind == "all_gather" else 0
    if r.sequence_parallel and kind in ("all_gather", "reduce_scatter") \
            and p == per_layer + engine_ends * m * boundary + again \
            and all(records(res) == [boundary] * (calls + m * sum(ends(res))) for res in results):
        note = (f"one {kind.replace('_', '-')} of s·b·h = {boundary} B per microbatch where the sequence-parallel "
                "region meets the embedding (first stage) and one where it meets the head (last stage); " + stage_note)
        if not again:
            return explained("vocab-parallel-stage-ends", note)
        note = (f"the plan counts Megatron-LM's {regather} backward re-gathers of the column-parallel inputs "
                f"({boundary} B each: 2 per layer and microbatch, and the head's), which DTensor does not make "
                "(it keeps the gathered input)")
        if staged or not all(records(res) == [boundary] * (calls + 2 * m) for res in results):
            return RowStatus.EXPLAINED, "sp-input-regather + vocab-parallel-stage-ends", note + "; and " + \
                f"one all-gather of s·b·h = {boundary} B per microbatch at each end of the sequence-parallel region; " \
                + stage_note
        return explained("sp-input-regather", note)
    if r.sequence_parallel and kind == "all_reduce" and p == loss:
        def split(res) -> tuple[list[int], list[int]]:
            """(the cross entropy's records, the norm gradients' records) of one rank: by size when
            the two sizes differ, else by phase (the loss runs in forward, the reductions after it)."""
            if tokens != norm_grad:
                recs = records(res)
                return [x for x in recs if x == tokens], [x for x in recs if x != tokens]
            return records(res, ("forward", "schedule")), records(res, ("backward", "optimizer", "clip"))

        ok = all(split(res)[0] == ([tokens] * (3 * m * ends(res)[1]) if vocab else []) for res in results) \
            and all((rest := split(res)[1]) and set(rest) == {norm_grad} for res in results)
        if not ok and tokens == norm_grad and r.pipeline_axis:
            # equal sizes, one schedule phase: count them. Each norm weight and bias of the rank's
            # blocks (and the final norm on the last stage) once, the cross entropy 3 per microbatch
            per_norm = 2 if shape.norm == "layernorm" else 1

            def count(res) -> int:
                head = ends(res)[1]
                return (2 * per_norm * (shape.layers // r.stages) + per_norm * head
                        + (3 * m * head if vocab else 0))

            ok = all(set(records(res)) == {norm_grad} and len(records(res)) == count(res) for res in results)
        if ok:
            phases = sorted({rec["phase"] for rec in results[0]["collectives"][-1] if rec["kind"] == kind
                             and rec["bytes"] == norm_grad and rec.get("phase") != "forward"})
            n = len(split(results[0])[1])
            note = (f"{n} all-reduces of h·4 = {norm_grad} B in {' and '.join(phases)}: gradients of norm weights and "
                    f"biases, replicated inside the sequence-parallel region, reduced over '{r.tensor_axis}' (the "
                    "reduction sequence parallelism requires; the cost model leaves it out"
                    + ("; DTensor keeps them partial and the optimizer reduces them again in each op that reads them"
                       if "optimizer" in phases else "") + ")")
            mechanisms = ["sp-norm-gradients"]
            if not vocab:
                mechanisms.append("tensor-replicated-params")
                note += "; " + tied_note
            elif staged:
                mechanisms.append("vocab-parallel-stage-ends")
                note += f"; the cross entropy's 3 × {tokens} B per microbatch on the last stage only"
            return RowStatus.EXPLAINED, " + ".join(mechanisms), note
    return RowStatus.DIFFERS, "", ""


def whole_copies(shape: TinyShape, groups) -> int:
    """Parameter tensors of ``groups`` that tensor parallelism keeps whole, each h elements: norms
    (every norm's weight, and bias with layernorm; two per block and the final norm), biases (the
    row-parallel output projections' biases, two per block)."""
    per_norm = 2 if shape.norm == "layernorm" else 1
    n = 0
    if "norms" in groups:
        n += per_norm * (2 * shape.layers + 1)
    if "biases" in groups and shape.bias:
        n += 2 * shape.layers
    return n


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

