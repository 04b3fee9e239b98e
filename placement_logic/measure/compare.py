"""Prediction against measurement: rows with absolute and relative differences.

Input: a ``Prediction`` (cost engine, fp32, tiny shape), the ``Realisation`` that ran
and the per-rank results of the run. Output: the ``Row``s and the ``Equivalence`` of a
``MeasureReport``. A difference is "explained" only when a named mechanism accounts for
it exactly (the realisation's documented approximations, ZeroRedundancyOptimizer's
per-tensor partition, parameters PyTorch keeps replicated under tensor parallelism,
Adam's step counters, DDP's all-reduce in place of ZeRO-1's reduce-scatter); every
other difference is reported as "differs".
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

from .predict import OPTIMIZER_BYTES, Prediction
from .realise import Realisation
from .report import Equivalence, Row
from .shape import TinyShape

STATES = ("params", "grads", "optimizer")


def _rank_of(coords: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    r = 0
    for c, n in zip(coords, sizes):
        r = r * n + c
    return r


def axes_of_group(ranks: tuple[int, ...], coords: dict[str, int], mesh: tuple[tuple[str, int], ...]) -> tuple[str, ...] | None:
    """The mesh axes whose line through this rank is exactly ``ranks`` (row-major layout)."""
    names = [a for a, _ in mesh]
    sizes = tuple(s for _, s in mesh)
    target = set(ranks)
    for k in range(0, len(names) + 1):
        for axes in combinations(names, k):
            group = [()]
            for a, n in mesh:
                choices = range(n) if a in axes else (coords[a],)
                group = [g + (c,) for g in group for c in choices]
            if {_rank_of(g, sizes) for g in group} == target:
                return axes
    return None


def _coords_of(rank: int, mesh) -> dict[str, int]:
    """Mesh coordinates of ``rank`` (row-major layout)."""
    out = {}
    for a, n in reversed(mesh):
        out[a] = rank % n
        rank //= n
    return out


def stage_shares(r: Realisation, results: list[dict], shape: TinyShape) -> list[Fraction]:
    """Per rank: its pipeline stage's exact parameter count over the plan's uniform Ψ/p (1 without a pipeline)."""
    if r.pipeline_axis is None:
        return [Fraction(1)] * len(results)
    p = r.stages
    uniform = Fraction(shape.param_count(), p)
    return [shape.stage_param_count(res["coords"][r.pipeline_axis], p, r.chunks) / uniform for res in results]


def _stage_note(r: Realisation, shape: TinyShape, what: str) -> str:
    per = shape.layers // (r.stages * r.chunks)
    chunks = f"{r.chunks} chunks of {per} block{'s' if per > 1 else ''}" if r.chunks > 1 else \
        f"{per} block{'s' if per > 1 else ''}"
    return (f"{what} follows each rank's pipeline stage exactly: {chunks} per rank, the embedding "
            f"({shape.vocab}·{shape.hidden}) on the first stage, the final norm"
            + ("" if shape.tied_embeddings else f" and the head ({shape.vocab}·{shape.hidden})")
            + " on the last; the plan divides Ψ evenly over the stages, and over the stages the bytes add up to "
            "exactly Ψ's")


def measured_collectives(result: dict, mesh, phase: str | None = None) -> dict[tuple[str, tuple[str, ...]], int]:
    """(kind, axes) -> buffer bytes of the last step of one rank (of one phase, if given)."""
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    for rec in result["collectives"][-1]:
        if phase is not None and rec.get("phase") != phase:
            continue
        if rec["kind"] in ("send", "recv"):
            # a transfer between two ranks: keyed by the axes along which they differ and its phase
            src, dst = (_coords_of(x, mesh) for x in rec["ranks"])
            axes = tuple(a for a, _ in mesh if src[a] != dst[a])
            out_key = (f"p2p {'sent' if rec['kind'] == 'send' else 'received'}, {rec.get('phase') or 'untagged'}", axes)
            out[out_key] = out.get(out_key, 0) + rec["bytes"]
            continue
        axes = axes_of_group(tuple(rec["ranks"]), result["coords"], mesh)
        label = axes if axes is not None else tuple(f"rank{r}" for r in rec["ranks"])
        key = (rec["kind"], label)
        out[key] = out.get(key, 0) + rec["bytes"]
    return out


def _sums_per_stage(per_rank, stage_want, r: Realisation, results: list[dict]) -> bool:
    """Per pipeline stage, the ranks' values add up to the stage's expectation times the data-parallel size."""
    stages: dict[int, list] = {}
    for m, w, res in zip(per_rank, stage_want, results):
        stages.setdefault(res["coords"][r.pipeline_axis], []).append((m, w))
    return all(sum(m for m, _ in v) == v[0][1] * len(v) for v in stages.values())


def _state_rows(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> list[Row]:
    rows = []
    shares = stage_shares(r, results, shape)
    want = pred.states
    t = r.sizes.get(r.tensor_axis, 1) if r.tensor_axis else 1
    width = {"params": 4, "grads": 4, "optimizer": OPTIMIZER_BYTES[r.optimizer]}
    by_stage = pred.stages
    for state in STATES:
        per_rank = tuple(res["held"][state]["storage"] for res in results)
        p = want[state]
        measured = Fraction(max(per_rank))
        status, note = "match", ""
        own = _own_stage_prediction(by_stage, state, r, results)
        stage_want = own if own is not None else [p * f for f in shares]
        if own is not None and all(m == w for m, w in zip(per_rank, own)):
            note = ("each rank holds exactly its pipeline stage's prediction: "
                    + ", ".join(f"{stage} stage {int(by_stage[stage][state]):,}" for stage in by_stage))
        elif any(m != p for m in per_rank):
            status, note = "differs", ""
            if r.pipeline_axis and all(m == w for m, w in zip(per_rank, stage_want)):
                status, note = "explained", _stage_note(r, shape, f"{state} held")
            elif r.pipeline_axis and r.data == "zero1" and state == "optimizer" and _sums_per_stage(per_rank, stage_want, r, results):
                status, note = "explained", (
                    "ZeroRedundancyOptimizer gives each rank whole parameter tensors of its stage, so rank shares "
                    "differ; per stage they add up to the stage's bytes times the data-parallel ranks. "
                    + _stage_note(r, shape, "The stage's bytes"))
            n_data = 1
            for a in r.data_axes:
                n_data *= r.sizes[a]
            # bytes PyTorch keeps whole on the tensor axis that the plan splits: the embedding and the
            # head (the norms, row-parallel biases and router the plan keeps whole too)
            replicated = [(Fraction(res["tensor_replicated_param_bytes"]) - pred.tensor_whole_bytes) * width[state] / 4
                          for res in results]
            if status == "explained":
                pass
            elif r.data == "fsdp" and state == "params" and r.approximations and all(m == p / n_data for m in per_rank):
                status, note = "explained", "FSDP2 SHARD_GRAD_OP keeps parameters sharded between steps (ZeRO-2 keeps them replicated)"
            elif r.data == "zero1" and state == "optimizer" and sum(per_rank) == p * len(per_rank):
                status, note = "explained", (
                    "ZeroRedundancyOptimizer gives each rank whole parameter tensors, so rank shares differ; "
                    "their sum is exactly the prediction times the ranks")
            elif r.tensor_axis and all(m == p + rep * (t - 1) / t for m, rep in zip(per_rank, replicated)):
                status, note = "explained", (
                    f"{replicated[0]} B per rank belong to parameters PyTorch keeps replicated over "
                    f"'{r.tensor_axis}' (the embedding and the head, vocabulary-parallel in Megatron-LM); the plan "
                    f"shards them 1/{t}")
        rows.append(Row("memory", f"{state} held per rank", p, measured, status, note,
                        per_rank if len(set(per_rank)) > 1 else ()))
    counters = tuple(res["held"]["optimizer_step_counters"]["storage"] for res in results)
    if any(counters):
        rows.append(Row("memory", "optimizer step counters per rank", Fraction(0), Fraction(max(counters)), "explained",
                        "one 0-d fp32 step count per parameter tensor (Adam/SGD bookkeeping, not a per-element state)",
                        counters if len(set(counters)) > 1 else ()))
    return rows


def _own_stage_prediction(by_stage, state: str, r: Realisation, results: list[dict]) -> list[Fraction] | None:
    """Per rank, the cost engine's prediction for the pipeline stage the rank holds.

    The engine predicts the first and the last stage; with more stages an interior rank has
    no stage prediction of its own and None is returned."""
    if not r.pipeline_axis or not by_stage or r.stages != 2:
        return None
    names = {0: "first", r.stages - 1: "last"}
    return [by_stage[names[res["coords"][r.pipeline_axis]]][state] for res in results]


def _collective_rows(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> list[Row]:
    predicted: dict[tuple[str, tuple[str, ...]], Fraction] = {}
    for c in pred.collectives:
        # a point-to-point transfer is sent by one stage and received by the next: an interior
        # stage both sends and receives the engine's buffer bytes in that phase
        keys = [(f"p2p {way}, {c.phase}", c.axes) for way in ("sent", "received")] if c.kind == "p2p" else [(c.kind, c.axes)]
        for key in keys:
            predicted[key] = predicted.get(key, Fraction(0)) + c.buffer_bytes
    per_rank = [measured_collectives(res, r.mesh) for res in results]
    shares = stage_shares(r, results, shape)
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
        status, note = ("match" if all(g == p for g in got) else "differs"), ""
        if status == "differs" and r.data == "zero1":
            if kind == "all_gather" and all(g == 0 for g in got):
                alt = tuple(m.get(("broadcast", axes), 0) for m in per_rank)
                if all(a == p * f for a, f in zip(alt, shares)):
                    got, status = alt, "explained"
                    used.add(("broadcast", axes))
                    label += " (measured: broadcast)"
                    note = "ZeroRedundancyOptimizer broadcasts each rank's updated parameters; the buffers add up to the all-gather's"
            elif kind == "reduce_scatter" and all(g == 0 for g in got):
                alt = tuple(m.get(("all_reduce", axes), 0) for m in per_rank)
                if all(a == p * f for a, f in zip(alt, shares)):
                    got, status = alt, "explained"
                    used.add(("all_reduce", axes))
                    label += " (measured: all_reduce)"
                    note = ("DDP all-reduces the whole gradient and ZeroRedundancyOptimizer reads its part; the plan's "
                            "reduce-scatter moves the same buffer at half the ring bytes")
        if status == "explained" and r.pipeline_axis and any(f != 1 for f in shares):
            note += ". " + _stage_note(r, shape, "The buffer, made of the stage's parameters or gradients,")
        if status == "differs" and r.pipeline_axis and kind in ("all_reduce", "reduce_scatter", "all_gather") \
                and axes and set(axes) <= set(r.data_axes) and all(g == p * f for g, f in zip(got, shares)):
            status, note = "explained", _stage_note(r, shape, "This buffer, made of the stage's parameters or gradients,")
        if status == "differs" and kind.startswith("p2p ") and r.pipeline_axis and axes == (r.pipeline_axis,):
            want = [p * _edge_share(kind, res["coords"][r.pipeline_axis], r.stages, r.chunks) for res in results]
            if all(g == w for g, w in zip(got, want)):
                status, note = "explained", _edge_note(kind, r)
        once = tuple(dict.fromkeys(axes))
        if status == "differs" and r.grad_reduce == "twice" and kind == "all_reduce" and len(once) < len(axes) \
                and all(g == 0 for g in got):
            alt = tuple(m.get((kind, once), 0) for m in per_rank)
            if all(a == p * len(axes) / len(once) for a in alt):
                got, status = alt, "explained"
                used.add((kind, once))
                label += f" (measured: {len(axes) // len(once)} all_reduce over {'×'.join(once)})"
                note = (f"the plan reduces over ({', '.join(axes)}): DDP's all-reduce and the loop's own, each of the "
                        f"whole gradient over {'×'.join(once)}; the cost engine sizes one all-reduce of that buffer")
        t = r.sizes.get(r.tensor_axis, 1) if r.tensor_axis else 1
        replicated = [Fraction(res["tensor_replicated_param_bytes"]) for res in results]
        if status == "differs" and r.tensor_axis and kind in ("all_reduce", "reduce_scatter", "all_gather") \
                and axes and set(axes) <= set(r.data_axes) and p \
                and all(g * pred.states["params"] == p * res["held"]["params"]["storage"] for g, res in zip(got, results)):
            status = "explained"
            note = (f"the same excess as the parameters held: {replicated[0]} B per rank belong to parameters PyTorch "
                    f"keeps replicated over '{r.tensor_axis}', which the plan shards 1/{t}, and this buffer is made of "
                    "parameters or their gradients")
        in_clip = tuple(measured_collectives(res, r.mesh, "clip").get(key, 0) for res in results)
        if status == "differs" and r.clip == "global" and kind == "all_reduce" and p == 0 \
                and all(c == g == 4 * res["param_tensors"] for c, g, res in zip(in_clip, got, results)):
            status = "explained"
            note = (f"clip_grad_norm_ all-reduces one partial fp32 norm per parameter tensor "
                    f"({results[0]['param_tensors']} × 4 B); the cost model leaves this scalar traffic out")
        if status == "differs" and r.sequence_parallel and kind == "all_reduce" and axes == (r.tensor_axis,) and p == 0:
            recs = [rec for rec in results[0]["collectives"][-1]
                    if rec["kind"] == "all_reduce" and axes_of_group(tuple(rec["ranks"]), results[0]["coords"], r.mesh) == axes]
            if recs and all(rec["bytes"] == shape.hidden * 4 for rec in recs):
                phases = sorted({rec["phase"] for rec in recs})
                status = "explained"
                note = (f"{len(recs)} all-reduces of h·4 = {shape.hidden * 4} B in {' and '.join(phases)}: gradients of "
                        "norm weights and biases, replicated inside the sequence-parallel region, reduced over "
                        f"'{r.tensor_axis}' (the reduction sequence parallelism requires; the cost model leaves it out"
                        + ("; DTensor keeps them partial and the optimizer reduces them again in each op that reads them"
                           if "optimizer" in phases else "") + ")")
        boundary = shape.seq * shape.microbatch * shape.hidden * 4
        if status == "differs" and r.sequence_parallel and kind == "all_gather" and axes == (r.tensor_axis,) \
                and all(g == p + 2 * boundary for g in got):
            status = "explained"
            note = (f"two more all-gathers of s·b·h = {boundary} B where the sequence-parallel region meets the "
                    "replicated head (forward) and the replicated embedding (its gradient, backward)")
        rows.append(Row("collectives", label + ", buffer bytes per step", p, Fraction(max(got)), status, note,
                        got if len(set(got)) > 1 else ()))
        used.add(key)
    return rows


def _edge_share(kind: str, rank: int, p: int, v: int) -> Fraction:
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


def compare(pred: Prediction, r: Realisation, results: list[dict], shape: TinyShape) -> tuple[list[Row], Equivalence]:
    rows = [Row("parameters", "parameter count Ψ of the tiny model", pred.psi, Fraction(results[0]["param_count"]),
                "match" if pred.psi == results[0]["param_count"] else "differs")]
    rows += _state_rows(pred, r, results, shape)
    rows += _collective_rows(pred, r, results, shape)
    eq = Equivalence(
        steps=len(results[0]["losses"]),
        param_abs=max(res["param_abs_diff"] for res in results),
        param_rel=max(res["param_rel_diff"] for res in results),
        param_worst=max(results, key=lambda res: res["param_rel_diff"])["param_worst"],
        loss_abs=max(res["loss_abs_diff"] for res in results),
        loss_rel=max(res["loss_rel_diff"] for res in results),
        replicas_agree=len({res["fingerprint"] for res in results}) == 1,
    )
    return rows, eq
