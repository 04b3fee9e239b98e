"""Tensor-axis collective rows (``collective_rows``): the documented mechanisms by which a
tensor-axis collective differs from the engine's figures, each checked record by record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from .mechanisms import axes_of_group, explained
from .realise import Realisation
from .report import RowStatus
from .shape import TinyShape


@dataclass
class _Axis:
    """One tensor-axis row's figures: the measured and predicted bytes, the run, and the per-microbatch sizes."""
    kind: str
    p: Fraction
    got: tuple
    r: Realisation
    results: list[dict]
    shape: TinyShape
    boundary: int
    set_apart: str | None

    def __post_init__(self):
        shape, r = self.shape, self.r
        self.vocab = not shape.tied_embeddings
        self.calls = (6 if r.recompute == "full" else 4) * (shape.layers // r.stages) * shape.microbatches
        self.m, self.per_layer = shape.microbatches, self.calls * self.boundary
        self.tokens = shape.seq * shape.microbatch * 4  # one fp32 value per token of a microbatch
        self.norm_grad = shape.hidden * 4
        self.staged = bool(r.pipeline_axis) and r.stages > 1
        self.engine_ends = 1 if self.staged else 2  # the stage ends the engine's per-device figure holds
        self.loss = 3 * self.m * self.tokens  # the engine's vocabulary-parallel cross entropy
        self.regather = 2 * (shape.layers // r.stages) * self.m + self.m  # Megatron-LM's backward re-gathers
        self.tied_note = ("with tied embeddings the run keeps the embedding (the head) whole on "
                          f"'{r.tensor_axis}': no vocabulary-parallel collective, where the engine counts Megatron's")
        self.stage_note = ("the engine's figure is the last stage's (the head's and the loss's); the first stage "
                           "makes the embedding's instead, a stage holding neither only the layers'")

    def records(self, res, phases=None) -> list[int]:
        return sorted(rec["bytes"] for rec in res["collectives"][-1]
                      if rec["kind"] == self.kind and rec.get("phase") not in ("setup", self.set_apart)
                      and (phases is None or rec.get("phase") in phases)
                      and axes_of_group(tuple(rec["ranks"]), res["coords"], self.r.mesh) == (self.r.tensor_axis,))

    def ends(self, res) -> tuple[int, int]:
        """(1 if the rank holds the embedding, 1 if it holds the head)."""
        if not self.r.pipeline_axis:
            return 1, 1
        c = res["coords"][self.r.pipeline_axis]
        return int(c == 0), int(c == self.r.stages - 1)

    def engine(self) -> Counter | None:
        """The engine's calls of this kind: Megatron's per layer and microbatch, the embedding's, head's and loss's."""
        b, m, ends = self.boundary, self.m, self.engine_ends
        return {(False, "all_reduce"): Counter({b: self.calls + ends * m}) + Counter({self.tokens: 3 * m}),
                (True, "all_gather"): Counter({b: self.calls + ends * m + self.regather}),
                (True, "reduce_scatter"): Counter({b: self.calls + ends * m}),
                (True, "all_reduce"): Counter({self.tokens: 3 * m})}.get((self.r.sequence_parallel, self.kind))

    def ends_all_reduce(self) -> bool:
        """Without sequence parallelism, an all-reduce of the engine's layers, stage ends and loss."""
        return not self.r.sequence_parallel and self.kind == "all_reduce" \
            and self.p == self.per_layer + self.engine_ends * self.m * self.boundary + self.loss


def tensor_axis_extras(kind: str, p: Fraction, got: tuple, r: Realisation, results: list[dict], shape: TinyShape,
                       boundary: int, predicted: Counter, set_apart: str | None = None) -> tuple[str, str, str]:
    """Tensor-axis collectives that differ from the engine's figures by a documented mechanism.

    The engine predicts Megatron's per-layer collectives (2 forward + 2 backward per layer and
    microbatch of s·b·h, 2 more with full recomputation) and the vocabulary-parallel
    embedding's, head's and cross entropy's per microbatch; with pipeline stages its figures
    are the last stage's (the head's and the loss's, not the first stage's embedding). Checked
    record by record on every rank: the prediction must be exactly that, and each rank's records
    what its own stage holds. The engine's calls are checked as well as its total: every rule below
    needs the calls Megatron-LM makes, each of its size (``predicted``)."""
    c = _Axis(kind, p, got, r, results, shape, boundary, set_apart)
    engine = c.engine()
    if engine is None or predicted != engine:
        return RowStatus.DIFFERS, "", ""
    for rule in _RULES:
        found = rule(c)
        if found is not None:
            return found
    return RowStatus.DIFFERS, "", ""


def _reduced_again(c: _Axis) -> tuple[str, str, str] | None:
    """group-reduced-over-tensor: an override's reductions of whole copies over the tensor axis."""
    r = c.r
    if not (c.ends_all_reduce() and r.tensor_reduced_again and c.vocab and not c.staged):
        return None
    again = whole_copies(c.shape, r.tensor_reduced_again)
    want = sorted([c.boundary] * (c.calls + 2 * c.m) + [c.tokens] * (3 * c.m) + [c.norm_grad] * again)
    if not all(c.records(res) == want for res in c.results):
        return None
    return explained("group-reduced-over-tensor", (
        f"the plan's override reduces the gradients of {' and '.join(r.tensor_reduced_again)} over "
        f"'{r.tensor_axis}' as well: {again} all-reduces of h·4 = {c.norm_grad} B after backward (their whole "
        f"copies, equal on every tensor rank, summed); the engine's figure is Megatron's per-layer, "
        "embedding, head and cross-entropy collectives, which every rank makes exactly, and leaves the "
        "override's reductions out"))


def _stage_ends(c: _Axis) -> tuple[str, str, str] | None:
    """vocab-parallel-stage-ends (each stage's own embedding, head and loss), or the tied embedding kept whole."""
    if not c.ends_all_reduce():
        return None
    if not c.vocab:
        if all(c.records(res) == [c.boundary] * c.calls for res in c.results):
            return explained("tensor-replicated-params", c.tied_note)
        return None

    def want(res):
        emb, head = c.ends(res)
        return sorted([c.boundary] * (c.calls + c.m * emb + c.m * head) + [c.tokens] * (3 * c.m * head))

    if not all(c.records(res) == want(res) for res in c.results):
        return None
    return explained("vocab-parallel-stage-ends", (
        f"the embedding's output all-reduce (s·b·h = {c.boundary} B per microbatch, forward) on the first "
        f"stage, the head's input-gradient all-reduce ({c.boundary} B, backward) and the cross entropy's "
        f"3 × {c.tokens} B per microbatch on the last; " + c.stage_note))


def _tied_reduce_scatter(c: _Axis) -> tuple[str, str, str] | None:
    """tensor-replicated-params: no reduce-scatter of the sequence-parallel embedding output when tied."""
    if c.r.sequence_parallel and not c.vocab and c.kind == "reduce_scatter" \
            and c.p == c.per_layer + c.engine_ends * c.m * c.boundary \
            and all(c.records(res) == [c.boundary] * c.calls for res in c.results):
        return explained("tensor-replicated-params", c.tied_note + "; the sequence-parallel embedding output is "
                         "split locally, with no reduce-scatter")
    return None


def _sequence_region_ends(c: _Axis) -> tuple[str, str, str] | None:
    """vocab-parallel-stage-ends and sp-input-regather: the sequence-parallel region's gathers and scatters."""
    b, m = c.boundary, c.m
    again = c.regather * b if c.kind == "all_gather" else 0
    if not (c.r.sequence_parallel and c.kind in ("all_gather", "reduce_scatter")
            and c.p == c.per_layer + c.engine_ends * m * b + again
            and all(c.records(res) == [b] * (c.calls + m * sum(c.ends(res))) for res in c.results)):
        return None
    note = (f"one {c.kind.replace('_', '-')} of s·b·h = {b} B per microbatch where the sequence-parallel "
            "region meets the embedding (first stage) and one where it meets the head (last stage); " + c.stage_note)
    if not again:
        return explained("vocab-parallel-stage-ends", note)
    note = (f"the plan counts Megatron-LM's {c.regather} backward re-gathers of the column-parallel inputs "
            f"({b} B each: 2 per layer and microbatch, and the head's), which DTensor does not make "
            "(it keeps the gathered input)")
    if c.staged or not all(c.records(res) == [b] * (c.calls + 2 * m) for res in c.results):
        return RowStatus.EXPLAINED, "sp-input-regather + vocab-parallel-stage-ends", note + "; and " + \
            f"one all-gather of s·b·h = {b} B per microbatch at each end of the sequence-parallel region; " \
            + c.stage_note
    return explained("sp-input-regather", note)


def _split(c: _Axis, res) -> tuple[list[int], list[int]]:
    """(the cross entropy's records, the norm gradients' records) of one rank: by size when
    the two sizes differ, else by phase (the loss runs in forward, the reductions after it)."""
    if c.tokens != c.norm_grad:
        recs = c.records(res)
        return [x for x in recs if x == c.tokens], [x for x in recs if x != c.tokens]
    return c.records(res, ("forward", "schedule")), c.records(res, ("backward", "optimizer", "clip"))


def _norm_records_ok(c: _Axis) -> bool:
    """Every rank's records the cross entropy's (on the head's stage) and norm gradients of h·4."""
    ok = all(_split(c, res)[0] == ([c.tokens] * (3 * c.m * c.ends(res)[1]) if c.vocab else []) for res in c.results) \
        and all((rest := _split(c, res)[1]) and set(rest) == {c.norm_grad} for res in c.results)
    if ok or c.tokens != c.norm_grad or not c.r.pipeline_axis:
        return ok
    # equal sizes, one schedule phase: count them. Each norm weight and bias of the rank's
    # blocks (and the final norm on the last stage) once, the cross entropy 3 per microbatch
    per_norm = 2 if c.shape.norm == "layernorm" else 1

    def count(res) -> int:
        head = c.ends(res)[1]
        return (2 * per_norm * (c.shape.layers // c.r.stages) + per_norm * head
                + (3 * c.m * head if c.vocab else 0))

    return all(set(c.records(res)) == {c.norm_grad} and len(c.records(res)) == count(res) for res in c.results)


def _norm_gradients(c: _Axis) -> tuple[str, str, str] | None:
    """sp-norm-gradients: the norms' gradients, replicated in the sequence-parallel region, reduced over it."""
    if not (c.r.sequence_parallel and c.kind == "all_reduce" and c.p == c.loss) or not _norm_records_ok(c):
        return None
    phases = sorted({rec["phase"] for rec in c.results[0]["collectives"][-1] if rec["kind"] == c.kind
                     and rec["bytes"] == c.norm_grad and rec.get("phase") != "forward"})
    n = len(_split(c, c.results[0])[1])
    note = (f"{n} all-reduces of h·4 = {c.norm_grad} B in {' and '.join(phases)}: gradients of norm weights and "
            f"biases, replicated inside the sequence-parallel region, reduced over '{c.r.tensor_axis}' (the "
            "reduction sequence parallelism requires; the cost model leaves it out"
            + ("; DTensor keeps them partial and the optimizer reduces them again in each op that reads them"
               if "optimizer" in phases else "") + ")")
    mechanisms = ["sp-norm-gradients"]
    if not c.vocab:
        mechanisms.append("tensor-replicated-params")
        note += "; " + c.tied_note
    elif c.staged:
        mechanisms.append("vocab-parallel-stage-ends")
        note += f"; the cross entropy's 3 × {c.tokens} B per microbatch on the last stage only"
    return RowStatus.EXPLAINED, " + ".join(mechanisms), note


# tried in this order; the first that explains the row decides it
_RULES = (_reduced_again, _stage_ends, _tied_reduce_scatter, _sequence_region_ends, _norm_gradients)


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
