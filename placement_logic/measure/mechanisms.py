"""The mechanisms that may explain a difference between prediction and measurement, and the
mesh bookkeeping the comparison shares (groups of ranks as mesh axes, pipeline stages).

Each mechanism is documented in docs/validation.md ("Explained differences") and
exercised by a test; ``explained`` refuses a name not listed in ``MECHANISMS``.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from functools import lru_cache
from itertools import combinations

from .predict import Prediction
from .realise import Realisation, widths_of
from .report import RowStatus
from .shape import TinyShape

STATES = ("params", "grads", "optimizer")
SETUP = "setup"  # the phase of one-time collectives (DDP's bucket rebuild), left out of the compared step

# name -> what accounts for the difference (docs/validation.md, "Explained differences")
MECHANISMS = {
    "optimizer-step-counters": "Adam keeps one 0-d fp32 step count per parameter tensor it updates; the cost "
                               "model counts per-element state only",
    "pipeline-stage-share": "a data-axis gradient collective under a pipeline moves the rank's own stage's "
                            "gradients; the engine sizes it as Ψ/p",
    "pipeline-edge-stages": "the engine counts an interior stage's point-to-point transfers; the first and last "
                            "stage make only one side of them",
    "gradient-reduced-twice": "the plan reduces over one axis twice: two whole-gradient all-reduces, which the "
                              "engine sizes as one",
    "tensor-replicated-params": "with tied embeddings PyTorch keeps the embedding (the head) whole over the tensor "
                                "axis, which the plan shards: more bytes held, and none of the vocabulary-parallel "
                                "collectives",
    "dtensor-embedding-grad-whole": "without a data-parallel wrapper, DTensor's vocabulary-parallel embedding "
                                    "keeps a whole V·h gradient where the plan holds V/t rows",
    "tied-embedding-sync": "with tied embeddings across pipeline stages, the first stage's embedding and the last "
                           "stage's copy all-reduce their gradients; the cost model leaves it out",
    "clip-norm-scalars": "clip_grad_norm_ all-reduces one fp32 partial norm per parameter tensor (the clip over "
                         "pipeline stages one fp32 sum of squares); the cost model leaves scalars out",
    "sp-norm-gradients": "sequence parallelism all-reduces the gradients of the norm weights and biases (h·4 B "
                         "each); the cost model leaves them out",
    "group-reduced-over-tensor": "the plan's override reduces the gradients of a group kept whole on the tensor "
                                 "axis (norms, row-parallel biases) over that axis as well: one all-reduce of h·4 B "
                                 "per tensor, which the cost model leaves out",
    "eager-saved-activations": "a block's saved activations are the activation model's terms less the dropout "
                               "masks (the harness model has none) and the attention core (SDPA's fused kernel), "
                               "plus what eager PyTorch keeps besides: the norms' statistics, SDPA's log-sum-exp, "
                               "RMSNorm's normalised input, SiLU(gate), DTensor's all-gathered inputs",
    "eager-saved-outside": "outside the blocks, the model's output-layer inputs and fp32 logits less the embedding "
                           "mask, plus the final norm's statistics, the cross entropy's fp32 total weight, under "
                           "sequence parallelism DTensor's all-gathered head input, and with tied embeddings under "
                           "tensor parallelism the whole logits",
    "harness-hidden-dropout": "under the pytorch_eager count (dropout off), the bug plans' hidden dropout keeps "
                              "two h-wide masks per block in the activations' dtype",
    "harness-tied-head-whole": "under the pytorch_eager count, with tied embeddings under tensor parallelism the "
                               "harness keeps the head whole: the loss's fp32 log-softmax is V wide, not V/t",
    "zeropp-breadth-first": "under the pytorch_eager count, the harness runs ZeroPP as torch's breadth-first "
                            "schedule (every chunk-microbatch of the step in flight), not the interleaved 1F1B "
                            "order the engine counts; the engine's per-microbatch terms are checked, its counts not",
    "sp-input-regather": "under sequence parallelism Megatron-LM all-gathers the column-parallel inputs again in "
                         "backward for the weight gradients (2 per layer and microbatch, and the head's); DTensor "
                         "keeps the gathered input",
    "pipeline-scatter-gather": "with tensor parallelism and no sequence parallelism Megatron-LM sends 1/t of each "
                               "stage boundary and all-gathers the chunks over the tensor axis after the receive; "
                               "the engine sends whole boundaries",
    "vocab-parallel-stage-ends": "with pipeline stages the embedding's tensor-axis collectives are on the first "
                                 "stage, the head's and the cross entropy's on the last; the engine's figure is "
                                 "the last stage's",
}


def explained(mechanism: str, note: str) -> tuple[str, str, str]:
    assert mechanism in MECHANISMS, mechanism
    return RowStatus.EXPLAINED, mechanism, note


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


def coords_of(rank: int, mesh) -> dict[str, int]:
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


def stage_note(r: Realisation, shape: TinyShape, what: str) -> str:
    per = shape.layers // (r.stages * r.chunks)
    chunks = f"{r.chunks} chunks of {per} block{'s' if per > 1 else ''}" if r.chunks > 1 else \
        f"{per} block{'s' if per > 1 else ''}"
    return (f"{what} follows each rank's pipeline stage exactly: {chunks} per rank, the embedding "
            f"({shape.vocab}·{shape.hidden}) on the first stage, the final norm"
            + ("" if shape.tied_embeddings else f" and the head ({shape.vocab}·{shape.hidden})")
            + " on the last; the plan divides Ψ evenly over the stages, and over the stages the bytes add up to "
            "exactly Ψ's")


def record_key(rec: dict, result: dict, mesh) -> tuple[str, tuple[str, ...]]:
    """The (kind, axes) row a measured record belongs to: a transfer between two ranks by the axes
    along which they differ and its phase, a collective by the mesh axes of its group (or its ranks)."""
    if rec["kind"] in ("send", "recv"):
        src, dst = (coords_of(x, mesh) for x in rec["ranks"])
        axes = tuple(a for a, _ in mesh if src[a] != dst[a])
        return f"p2p {'sent' if rec['kind'] == 'send' else 'received'}, {rec.get('phase') or 'untagged'}", axes
    axes = axes_of_group(tuple(rec["ranks"]), result["coords"], mesh)
    return rec["kind"], axes if axes is not None else tuple(f"rank{r}" for r in rec["ranks"])


def measured_records(result: dict, mesh, key, leave_out: tuple[str, ...] = ()) -> list[int]:
    """The buffer bytes of one rank's records of ``key`` in the last step, in the order they ran
    (one-time setup and the phases in ``leave_out`` left out)."""
    return [rec["bytes"] for rec in result["collectives"][-1]
            if rec.get("phase") != SETUP and rec.get("phase") not in leave_out and record_key(rec, result, mesh) == key]


def measured_collectives(result: dict, mesh, phase: str | None = None) -> dict[tuple[str, tuple[str, ...]], int]:
    """(kind, axes) -> buffer bytes of the last step of one rank (of one phase, if given); one-time
    setup collectives are not part of the compared step."""
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    for rec in result["collectives"][-1]:
        if rec.get("phase") == SETUP or (phase is not None and rec.get("phase") != phase):
            continue
        key = record_key(rec, result, mesh)
        out[key] = out.get(key, 0) + rec["bytes"]
    return out


def carried_in_parts(r: Realisation, key, shape: TinyShape) -> int | None:
    """How many records carry one of the engine's calls of this row, by the harness's design: 1
    (each call one record) but for FSDP's and HSDP's collectives without a pipeline (one per wrapped
    unit, every block and the root: L + 1 records a call, on the data axes and on a context axis
    the parameters are replicated over); None (any number, at least one) for FSDP under a pipeline,
    the data axes under a pipeline (one DDP, ZeRO flat buffer or FSDP unit per model chunk, and the
    embedding's own buffer), ZeroPP's data axes, the hand-written per-tensor all-reduces over an
    expert axis, and the loop's own per-tensor all-reduce of a gradient reduced twice."""
    kind, axes = key
    on_data = bool(axes) and set(axes) <= set(r.data_axes)
    replicated = bool(axes) and set(axes) <= set(r.data_axes) | ({r.context_axis} if r.context_axis else set())
    if r.data in ("fsdp", "hsdp") and replicated and not r.pipeline_axis \
            and kind in ("all_gather", "reduce_scatter", "all_reduce"):
        return shape.layers + 1
    if (on_data and (bool(r.pipeline_axis) or r.data == "zeropp")) \
            or (kind == "all_reduce" and r.expert_axis is not None and tuple(axes) == (r.expert_axis,)) \
            or (kind == "all_reduce" and r.grad_reduce == "twice" and on_data):
        return None
    return 1


def calls_fit(records: list[int], calls: Counter, parts: int | None = None) -> bool:
    """Whether ``records`` (one rank's, in the order they ran) make up exactly the predicted
    ``calls`` (size -> number of calls): cut into consecutive runs of ``parts`` records each (any
    number, at least one, when None; ``carried_in_parts``), each run summing to the size of one
    predicted call and every predicted call used once, never one record shared by two calls."""
    sizes = sorted(calls)
    start = tuple(int(calls[s]) for s in sizes)
    if any(n != calls[s] or n < 0 for n, s in zip(start, sizes)):
        return False  # a fractional or negative number of calls makes up no records
    if parts is not None:
        if len(records) % parts:
            return False
        runs = [sum(records[i:i + parts]) for i in range(0, len(records), parts)]
        return Counter(runs) == Counter({s: n for s, n in zip(sizes, start) if n})

    @lru_cache(maxsize=None)
    def fit(i: int, left: tuple[int, ...]) -> bool:
        if i == len(records):
            return not any(left)
        run = Fraction(0)
        for j in range(i, len(records)):
            run += records[j]
            if run > sizes[-1]:
                return False
            if run in calls and left[sizes.index(run)] > 0:
                k = sizes.index(run)
                if fit(j + 1, left[:k] + (left[k] - 1,) + left[k + 1:]):
                    return True
        return False

    if not sizes:
        return not records
    return fit(0, start)


def equal_calls(records: list[int], n: Fraction, parts: int | None = None) -> bool:
    """Whether ``records`` make up ``n`` calls of one size (their total over ``n``)."""
    if n <= 0 or n.denominator != 1:
        return not records and n == 0
    return calls_fit(records, Counter({Fraction(sum(records), int(n)): int(n)}), parts)


def predicted_calls(pred: Prediction, key) -> Counter:
    """Per-call size -> number of calls the engine predicts for one (kind, axes) row."""
    kind, axes = key
    out: Counter = Counter()
    for c in pred.collectives:
        keys = [(f"p2p {way}, {c.phase}", c.axes) for way in ("sent", "received")] if c.kind == "p2p" \
            else [(c.kind, c.axes)]
        if key in keys and c.calls:
            out[c.buffer_bytes / c.calls] += c.calls
    return out


def tensor_whole_elements(shape: TinyShape) -> int | None:
    """The parameters tensor parallelism keeps whole on the tensor axis by Megatron-LM's convention,
    counted from the shape: every norm's weight (and bias, LayerNorm), two per block and the final
    norm, and the row-parallel output projections' biases (two per block); None for a mixture of
    experts (its router and experts: no rule)."""
    if shape.moe:
        return None
    per_norm = 2 if shape.norm == "layernorm" else 1
    return per_norm * shape.hidden * (2 * shape.layers + 1) + (2 * shape.layers * shape.hidden if shape.bias else 0)


def stage_name(r: Realisation, coord: int) -> str:
    return "first" if coord == 0 else "last" if coord == r.stages - 1 else "interior"


def own_stage_prediction(pred: Prediction, state: str, r: Realisation, results: list[dict]) -> list[Fraction] | None:
    """Per rank, the cost engine's prediction for the pipeline stage the rank holds (first,
    interior or last), or None without a pipeline or without per-stage predictions."""
    by_stage = pred.stages
    if not r.pipeline_axis or not by_stage:
        return None
    names = [stage_name(r, res["coords"][r.pipeline_axis]) for res in results]
    if any(n not in by_stage for n in names):
        return None
    return [by_stage[n][state] for n in names]


def kept_whole_as_documented(r: Realisation, results: list[dict], shape: TinyShape) -> bool:
    """Whether every rank keeps whole on the tensor axis exactly the convention's parameters
    (``tensor_whole_elements``) and the tied embedding (V·h), at the run's parameter width: the
    harness's own count, checked against the shape (never against the engine's figure)."""
    conv = tensor_whole_elements(shape)
    if conv is None:
        return False
    want = (conv + shape.vocab * shape.hidden) * widths_of(r)["params"]
    return all(res["tensor_replicated_param_bytes"] == want for res in results)


# the states a data-parallel strategy shards over its data axes (the ZeRO paper's stages)
ZERO_SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("grads", "optimizer"), "fsdp": STATES}


def data_shard(r: Realisation, state: str) -> int | None:
    """Over how many ranks of the data axes one copy of ``state`` is sharded (1 without a data axis or
    under DDP); None for a strategy without a documented rule here (HSDP, ZeroPP)."""
    if r.data is None:
        return 1
    if r.data not in ZERO_SHARDED:
        return None
    n = 1
    for a in r.data_axes:
        n *= r.sizes[a]
    return n if state in ZERO_SHARDED[r.data] else 1


def tied_excess(r: Realisation, shape: TinyShape, state: str) -> Fraction | None:
    """Per rank, the bytes of ``state`` the tied embedding (V·h elements) kept whole on the tensor
    axis adds to the plan's 1/t shard of it: (t-1)/t · V·h at the run's width of ``state``, over its
    data shard; None where no rule applies."""
    t = r.sizes[r.tensor_axis]
    shard = data_shard(r, state)
    if shard is None:
        return None
    return Fraction(shape.vocab * shape.hidden) * widths_of(r)[state] * (t - 1) / (t * shard)


def params_per_tensor_rank(shape: TinyShape, t: int, tied_whole: bool) -> Fraction:
    """Parameter elements per tensor rank: the convention's whole parameters, the rest 1/t (the tied
    embedding whole as well when ``tied_whole``)."""
    conv = Fraction(tensor_whole_elements(shape) or 0) + (shape.vocab * shape.hidden if tied_whole else 0)
    return conv + (shape.param_count() - conv) / t


def stage_tensor_elements(shape: TinyShape, rank: int, stages: int, t: int, chunks: int = 1) -> Fraction | None:
    """Parameter elements pipeline rank ``rank`` holds per tensor rank under the plan (Megatron-LM's
    convention, ``tensor_whole_elements``): its blocks' norms and row-parallel biases whole and the
    rest 1/t, the embedding's V/t rows with virtual stage 0, the final norm whole and the head's
    V/t rows (with tied embeddings and more than one stage, its own copy of the embedding) with
    the last; counted like ``TinyShape.stage_param_count``. None for a mixture of experts."""
    if shape.moe:
        return None
    per_norm = 2 if shape.norm == "layernorm" else 1
    whole = per_norm * shape.hidden * 2 + (2 * shape.hidden if shape.bias else 0)
    block = whole + Fraction(shape.block_params() - whole, t)
    virtual = stages * chunks
    rows = Fraction(shape.vocab * shape.hidden, t)
    total = Fraction(0)
    for c in range(chunks):
        v = rank + c * stages
        total += shape.layers // virtual * block
        total += rows if v == 0 else 0
        if v == virtual - 1:
            total += per_norm * shape.hidden + (rows if not shape.tied_embeddings or virtual > 1 else 0)
    return total


def tied_stage_excess(pred: Prediction, state: str, r: Realisation, results: list[dict],
                      shape: TinyShape) -> list[Fraction] | None:
    """Per rank, the bytes of ``state`` beyond its stage's prediction when the tied embedding (first
    stage) and its copy (last stage) are kept whole on the tensor axis (``tied_excess``, from the
    shape and the run's widths alone); None where no rule applies."""
    excess = tied_excess(r, shape, state)
    if excess is None:
        return None
    return [excess if res["coords"][r.pipeline_axis] in (0, r.stages - 1) else Fraction(0) for res in results]
