"""The mechanisms that may explain a difference between prediction and measurement, and the
mesh bookkeeping the comparison shares (groups of ranks as mesh axes, pipeline stages).

Each mechanism is documented in docs/validation.md ("Explained differences") and
exercised by a test; ``explained`` refuses a name not listed in ``MECHANISMS``.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

from .predict import Prediction
from .realise import Realisation
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
    "vocab-parallel-stage-ends": "with pipeline stages the embedding's tensor-axis collectives are on the first "
                                 "stage, the head's and the cross entropy's on the last; the engine's figure is "
                                 "the last stage's",
}


def explained(mechanism: str, note: str) -> tuple[str, str, str]:
    assert mechanism in MECHANISMS, mechanism
    return "explained", mechanism, note


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


def measured_collectives(result: dict, mesh, phase: str | None = None) -> dict[tuple[str, tuple[str, ...]], int]:
    """(kind, axes) -> buffer bytes of the last step of one rank (of one phase, if given); one-time
    setup collectives are not part of the compared step."""
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    for rec in result["collectives"][-1]:
        if rec.get("phase") == SETUP or (phase is not None and rec.get("phase") != phase):
            continue
        if rec["kind"] in ("send", "recv"):
            # a transfer between two ranks: keyed by the axes along which they differ and its phase
            src, dst = (coords_of(x, mesh) for x in rec["ranks"])
            axes = tuple(a for a, _ in mesh if src[a] != dst[a])
            out_key = (f"p2p {'sent' if rec['kind'] == 'send' else 'received'}, {rec.get('phase') or 'untagged'}", axes)
            out[out_key] = out.get(out_key, 0) + rec["bytes"]
            continue
        axes = axes_of_group(tuple(rec["ranks"]), result["coords"], mesh)
        label = axes if axes is not None else tuple(f"rank{r}" for r in rec["ranks"])
        key = (rec["kind"], label)
        out[key] = out.get(key, 0) + rec["bytes"]
    return out


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


def tied_stage_excess(pred: Prediction, state: str, r: Realisation, results: list[dict],
                      shape: TinyShape) -> list[Fraction]:
    """Per rank, the bytes of ``state`` beyond its stage's prediction when the tied embedding (first
    stage) and its copy (last stage) are kept whole on the tensor axis: (t-1)/t of V·h parameter
    bytes, scaled by the stage's predicted ``state`` bytes per parameter byte (every group of a
    stage is placed alike)."""
    t = r.sizes[r.tensor_axis]
    own_state = own_stage_prediction(pred, state, r, results)
    own_params = own_stage_prediction(pred, "params", r, results)
    whole = Fraction(shape.vocab * shape.hidden) * pred.widths["params"] * (t - 1) / t
    return [whole * s / q if res["coords"][r.pipeline_axis] in (0, r.stages - 1) and q else Fraction(0)
            for s, q, res in zip(own_state, own_params, results)]
