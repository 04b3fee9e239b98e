"""Activation memory per device, shape-aware (Korthikanti et al. 2022 as a special case).

Input: a ``Shape`` and the plan's parallel layout (tensor size t, context size c, pipeline
size p, chunks v, scheduling unit U, schedule kind, sequence parallel, recomputation, flash
attention). Output: ``Activations`` with the per-layer per-microbatch bytes, and, for the
first and the last pipeline stage (or the single stage without a pipeline), what the
schedule keeps in flight at the stage's peak, the embedding and output-layer terms and the
stage's total; the peak over stages; and the recomputation working set (transient).

Per layer per microbatch, 16-bit activations (bytes scale with ``bytes.activations / 2``),
with w = 10h kept whole on every tensor rank (norm inputs and outputs, dropout masks) and d
split over them (Q, K, V with GQA's kv/a, the projection input, 4f or, gated, 6f for the MLP;
MoE: per expert visit, plus the router's logits; see ``layer_terms``):
  no parallelism          s·b·(w + d + 5·a·s)
  tensor parallel         s·b·(w + d/t + 5·a·s/t)
  tensor + sequence par.  s·b·((w + d)/t + 5·a·s/t)
  selective recompute     the 5·a·s term is dropped (flash attention drops it too)
  full recompute          2·s·b·h (÷t with sequence parallel): only the layer input is kept
Context parallelism divides s by c. With MHA, an ungated MLP and f = 4h this is Korthikanti
et al.'s Table 2 (34, 10 + 24/t, 34/t per s·b·h). ``conventions { activations = ... }`` selects
Korthikanti's, Megatron-LM's or llm-analysis's estimator count instead (llm-analysis's also
changes the attention core, full recomputation and the terms outside the layers: see
``per_layer``, ``embedding_mask``, ``output_layer``); ``activation_allowance`` scales all.

Outside the layers: the embedding dropout mask, s·b·h/t bytes (1 byte per element, t only
with sequence parallelism), on the first stage per microbatch whose chunk 0 is in flight;
the output layer on the last stage per microbatch whose last chunk is in flight: the final
norm's and the output projection's inputs 2·s·b·h each (16-bit, ÷t with sequence
parallelism) and the fp32 logits (softmax input) 4·s·b·V/t (Megatron's vocab-parallel cross
entropy keeps V/t of them on each tensor rank), Korthikanti's 4·s·b·h/t·(1 + V/h) with
sequence parallelism.

In flight at a stage's peak (p stages, m microbatches, v chunks of L/(p·v) layers), counted
in chunk-microbatches (docs/costs.md derives them from each schedule's order):
  GPipe             first and last m (all forwards before any backward)
  1F1B              first min(m, p), last 1 (stage r runs p − r − 1 warm-up forwards)
  interleaved/ZeroPP first min(m·v, (v + 1)·p − 1), last (v − 1)·p + 1 (Megatron's warm-up
                    2·(p − r − 1) + (v − 1)·p forwards on stage r, then one more before its
                    first backward); the first stage's chunk 0 holds min(m, 2p) microbatches
                    (min(m, 2p − 1) when v = 1), the last stage's last chunk one.
An interior stage s (``interior_stage``, asked for by index) keeps GPipe's m, 1F1B's
min(m, p − s), interleaved 1F1B's min(m·v, (v − 1)·p + 2·(p − s − 1) + 1) chunk-microbatches
and no embedding or output layer; the peak over stages is the first's or the last's.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from . import eager
from .extrema import extremum
from .sizes import FIRST, LAST, Shape, Split, layers_on
from .symbolic import peak


@dataclass(frozen=True)
class Layout:
    """The parallel layout the activations depend on: tensor, context and pipeline sizes, schedule, options."""

    t: sympy.Expr  # tensor-parallel size (1 without a tensor axis)
    c: sympy.Expr  # context-parallel size
    p: sympy.Expr  # pipeline size
    v: sympy.Expr  # model chunks per stage
    U: sympy.Expr  # ZeroPP scheduling unit
    schedule: ir.ScheduleKind | None
    sp: bool
    recompute: ir.Recompute
    flash: bool
    expert_axes: tuple[str, ...] = ()
    split: Split = Split()  # how each mesh axis divides each parameter group


@dataclass(frozen=True)
class InFlight:
    """What one pipeline stage keeps at its peak."""

    chunks: sympy.Expr  # chunk-microbatches with their activations kept
    layers_per_chunk: sympy.Expr  # L/(p·v)
    embedding: sympy.Expr  # microbatches whose embedding dropout mask is kept (first stage)
    output: sympy.Expr  # microbatches whose output-layer activations are kept (last stage)

    @property
    def layer_microbatches(self) -> sympy.Expr:
        return self.chunks * self.layers_per_chunk


@dataclass(frozen=True)
class StageActivations:
    """The kept activation bytes of one pipeline stage."""

    stage: str  # "first" | "last" (or "single" without a pipeline)
    in_flight: InFlight
    layers: sympy.Expr  # bytes of the layers' kept activations
    embedding: sympy.Expr  # bytes of the embedding dropout masks
    output: sympy.Expr  # bytes of the output layer's activations (logits included)

    @property
    def total(self) -> sympy.Expr:
        return self.layers + self.embedding + self.output


@dataclass(frozen=True)
class Activations:
    """A plan's activation memory: per layer, in flight, embedding and output, and the peak over stages."""

    per_layer: sympy.Expr  # kept bytes per layer per microbatch
    per_layer_full: sympy.Expr  # without any recomputation (the recompute working set)
    layer_microbatches: sympy.Expr  # layer-microbatches alive on the first stage
    microbatches_in_flight: sympy.Expr  # the same in microbatches of one stage's layers
    embedding: sympy.Expr  # first stage's embedding-mask bytes
    output: sympy.Expr  # last stage's output-layer bytes
    total: sympy.Expr  # the peak over stages
    transient: sympy.Expr
    stages: tuple[StageActivations, ...] = ()  # first and last stage with a pipeline, else ()
    # eager PyTorch's loss backward: cross entropy's gradient of the log-probabilities and log-softmax's of the
    # logits, each as wide as the logits, held together beside every saved activation (eager counts, one stage)
    loss_backward: sympy.Expr = sympy.Integer(0)


def layer_terms(sh: Shape, moe: bool | None = None) -> tuple[sympy.Expr, sympy.Expr]:
    """Bytes per token of one layer's kept 16-bit activations, without the attention scores:
    (kept whole on every tensor rank unless sequence parallel, split over the tensor ranks).

    Whole: the two norms' inputs 2h + 2h, the attention input and the MLP input (the norms'
    outputs) 2h + 2h, the two dropout masks h + h (1 byte per element): 10h.
    Split: Q 2·h, K and V 2·h·kv/a each, the output projection's input 2·h; the MLP keeps
    4·f (its first projection's output and the activation's output) or, gated, 6·f (the
    fused gate and up projections' output, 2·2f, and the product fed to the down projection,
    2f). With MHA, an ungated MLP and f = 4h this is Korthikanti et al.'s 10h + 24h.
    Mixture of experts: every token visits top_k·capacity experts, so the MLP terms (of the
    expert width) and a permuted copy of its input (2h) are kept top_k·capacity times, the
    shared experts' MLP terms once (of their widths together), and the router's fp32 logits
    (4·E) once, on every tensor rank unless sequence parallel. ``moe=False``: a dense layer of
    a model that has both kinds (``dense_layers``, ``moe_every``)."""
    h, a, kv, f = sh.h, sh.a, sh.kv, sh.f
    if sh.activation_count == "korthikanti":  # Table 2: MHA, an ungated MLP of width 4h
        return 10 * h, 24 * h
    if sh.activation_count == "megatron":  # Megatron-LM's estimator: 18h + 4f (MHA, ungated)
        return 10 * h, 8 * h + 4 * f
    if sh.activation_count == "llm_analysis":  # fp32 norm inputs 8h, inputs 4h, one dropout mask h
        return 13 * h, 8 * h + 4 * f
    whole = 10 * h
    attn = 2 * h + 4 * h * kv / a + 2 * h
    per_width = 6 if sh.gated else 4
    mlp = per_width * f
    if (sh.experts != 1) if moe is None else moe:
        visits = sh.top_k * sh.capacity
        fe = sh.fe if sh.fe is not None else f
        mlp = (per_width * fe + 2 * h) * visits + per_width * sh.f_shared
        whole = whole + 4 * sh.experts
    return whole, attn + mlp


def per_layer(sh: Shape, lay: Layout, recompute: ir.Recompute, flash: bool, moe: bool | None = None) -> sympy.Expr:
    if sh.activation_count in eager.EAGER_COUNTS:
        return sympy.expand(sum((x for _, x in eager.layer_terms(sh, lay, recompute, moe)), sympy.Integer(0)))
    s = sh.s / lay.c
    b, h, a, t = sh.b, sh.h, sh.a, lay.t
    scale = sh.bytes[ir.State.ACTIVATIONS] / 2
    core = 0 if (flash or recompute is ir.Recompute.SELECTIVE) else 5 * a * s / t
    llm = sh.activation_count == "llm_analysis"
    if llm and recompute is not ir.Recompute.SELECTIVE:  # no softmax dropout mask; flash keeps O and statistics
        core = (4 * h + 8 * a) / t if flash else 4 * a * s / t
    if recompute is ir.Recompute.FULL:
        return 2 * s * b * h / (t if (lay.sp or llm) else 1) * scale
    whole, split = layer_terms(sh, moe)
    if lay.sp:
        per = s * b * ((whole + split) / t + core)
    else:
        per = s * b * (whole + split / t + core)
    return sympy.factor_terms(sympy.expand(per)) * scale


def per_layer_terms(sh: Shape, lay: Layout, recompute: ir.Recompute, flash: bool,
                    moe: bool | None = None) -> tuple[tuple[str, sympy.Expr], ...]:
    """``per_layer`` as named terms whose sum is ``per_layer`` (bytes per layer per microbatch):
    the norms' inputs and outputs, the dropout masks, the router's logits (MoE), the query, the
    keys and values, the output projection's input, the MLP's and the attention core's terms
    (``layer_terms``); under full recomputation the layer input alone. Estimator counts other
    than the default (``conventions { activations = ... }``) are one term, ``layer``."""
    if sh.activation_count in eager.EAGER_COUNTS:
        return eager.layer_terms(sh, lay, recompute, moe)
    total = per_layer(sh, lay, recompute, flash, moe)
    if recompute is ir.Recompute.FULL:
        return (("layer input", total),)
    if sh.activation_count in ("korthikanti", "megatron", "llm_analysis"):
        return (("layer", total),)
    s = sh.s / lay.c
    b, h, a, kv, t = sh.b, sh.h, sh.a, sh.kv, lay.t
    scale = sh.bytes[ir.State.ACTIVATIONS] / 2
    whole_t = t if lay.sp else 1
    whole, split = layer_terms(sh, moe)
    router = whole - 10 * h
    mlp = split - (2 * h + 4 * h * kv / a + 2 * h)
    core = 0 if (flash or recompute is ir.Recompute.SELECTIVE) else 5 * a * s / t
    terms = (("norm inputs", 4 * h / whole_t), ("norm outputs", 4 * h / whole_t), ("dropout masks", 2 * h / whole_t),
             ("router logits", router / whole_t), ("query", 2 * h / t), ("keys and values", 4 * h * kv / a / t),
             ("projection input", 2 * h / t), ("mlp", mlp / t), ("attention core", core))
    return tuple((name, sympy.expand(s * b * x * scale)) for name, x in terms if x != 0)


def outside_terms(sh: Shape, lay: Layout) -> tuple[tuple[str, sympy.Expr], ...]:
    """The embedding mask and the output layer of one microbatch as named terms: ``embedding
    mask``, ``output-layer inputs`` (the final norm's and the output projection's), ``logits``
    (``pytorch_eager``: ``eager.outside_terms``)."""
    if sh.activation_count in eager.EAGER_COUNTS:
        return eager.outside_terms(sh, lay)
    s = sh.s / lay.c
    logits = sh.logits_bytes * s * sh.b * sh.V / lay.t
    out = (("embedding mask", embedding_mask(sh, lay)), ("output-layer inputs", output_layer(sh, lay) - logits),
           ("logits", logits))
    return tuple((name, sympy.expand(x)) for name, x in out if x != 0)


def _moe_layers(sh: Shape):
    """For a model with dense and MoE layers: stage (FIRST, LAST, or None for all the layers) ->
    how many MoE layers it holds (of p stages); None for a model of one kind of layer."""
    ranged = next((g for g in sh.groups if g.group.expert and g.group.layers is not None and g.per_layer is not None
                   and g.per_layer != 0), None)
    if ranged is None:
        return None

    def count(stage: str | None, p: sympy.Expr | None = None) -> sympy.Expr:
        return ranged.count / ranged.per_layer if stage is None else layers_on(sh, ranged.group.layers, stage, p)

    return count


def has_pipeline(lay: Layout) -> bool:
    return lay.schedule is not None and lay.p != 1


def in_flight(sh: Shape, lay: Layout) -> dict[str, InFlight]:
    """What the first and the last stage keep at their peak (m ≥ p; see the module text)."""
    L, p, v, m = sh.L, lay.p, lay.v, sh.m
    one, zero = sympy.Integer(1), sympy.Integer(0)
    k = lay.schedule
    if not has_pipeline(lay):
        return {"single": InFlight(one, L, one, one)}
    if k is ir.ScheduleKind.GPIPE:
        return {FIRST: InFlight(m, L / p, m, zero), LAST: InFlight(m, L / p, zero, m)}
    if k is ir.ScheduleKind.ONE_F_ONE_B:
        first = extremum(sympy.Min, m, p)
        return {FIRST: InFlight(first, L / p, first, zero), LAST: InFlight(one, L / p, zero, one)}
    # interleaved 1F1B; ZeroPP keeps the same chunks in flight (its unit U changes only gathers)
    first = extremum(sympy.Min, m * v, (v + 1) * p - 1)
    last = (v - 1) * p + 1
    chunk0 = extremum(sympy.Min, m, 2 * p - 1) if v == 1 else extremum(sympy.Min, m, 2 * p)
    return {FIRST: InFlight(first, L / (p * v), chunk0, zero), LAST: InFlight(last, L / (p * v), zero, one)}


def interior_in_flight(sh: Shape, lay: Layout, s: sympy.Expr) -> InFlight:
    """What interior stage ``s`` (0 < s < p − 1) keeps at its peak, from the same schedule orders as
    ``in_flight`` (m ≥ p): GPipe m; 1F1B min(m, p − s) (p − s − 1 warm-up forwards and one more
    before its first backward); interleaved 1F1B and ZeroPP min(m·v, (v − 1)·p + 2·(p − s − 1) + 1).
    An interior stage holds neither the embedding nor the output layer. At s = 0 and s = p − 1 the
    chunk counts are ``in_flight``'s first and last stage's."""
    L, p, v, m = sh.L, lay.p, lay.v, sh.m
    zero = sympy.Integer(0)
    k = lay.schedule
    if k is ir.ScheduleKind.GPIPE:
        return InFlight(m, L / p, zero, zero)
    if k is ir.ScheduleKind.ONE_F_ONE_B:
        return InFlight(extremum(sympy.Min, m, p - s), L / p, zero, zero)
    return InFlight(extremum(sympy.Min, m * v, (v - 1) * p + 2 * (p - s - 1) + 1), L / (p * v), zero, zero)


def interior_stage(sh: Shape, lay: Layout, s: sympy.Expr) -> StageActivations | None:
    """Interior stage ``s``'s kept activations: its layer-microbatches in flight
    (``interior_in_flight``) times the per-layer bytes; None without a pipeline, without a shape
    or where the layers are of two kinds (dense and MoE: which of them a stage holds is counted
    for the first and the last stage only)."""
    if not sh.has_shape or not has_pipeline(lay) or _moe_layers(sh) is not None:
        return None
    f = interior_in_flight(sh, lay, s)
    zero = sympy.Integer(0)
    per = per_layer(sh, lay, lay.recompute, lay.flash) * sh.allowance
    return StageActivations(f"stage {s}", f, f.layer_microbatches * per, zero, zero)


def embedding_mask(sh: Shape, lay: Layout) -> sympy.Expr:
    """Embedding dropout mask of one microbatch: 1 byte per element, ÷t with sequence parallelism
    (none in llm-analysis's count, nor in eager PyTorch's with dropout off)."""
    if sh.activation_count in ("llm_analysis",) + eager.EAGER_COUNTS:
        return sympy.Integer(0)
    return (sh.s / lay.c) * sh.b * sh.h / (lay.t if lay.sp else 1)


def output_layer(sh: Shape, lay: Layout) -> sympy.Expr:
    """Output layer of one microbatch: norm and projection inputs (16-bit) and fp32 logits ÷ t
    (``bytes.logits``). llm-analysis's count keeps the final norm's fp32 input instead of the two
    inputs (the same 4·s·b·h), and nothing of it under full recomputation; ``pytorch_eager`` its
    own terms (``eager.outside_terms``)."""
    if sh.activation_count in eager.EAGER_COUNTS:
        return sympy.expand(sum((x for _, x in eager.outside_terms(sh, lay)), sympy.Integer(0)))
    s = sh.s / lay.c
    scale = sh.bytes[ir.State.ACTIVATIONS] / 2
    inputs = 4 * s * sh.b * sh.h / (lay.t if lay.sp else 1) * scale
    if sh.activation_count == "llm_analysis" and lay.recompute is ir.Recompute.FULL:
        inputs = 0
    return inputs + sh.logits_bytes * s * sh.b * sh.V / lay.t


def activations(sh: Shape, lay: Layout) -> Activations:
    zero = sympy.Integer(0)
    if not sh.has_shape:
        return Activations(zero, zero, zero, zero, zero, zero, zero, zero)
    k = sh.allowance  # an estimator's allowance (conventions { activation_allowance = ... }), 1 by default
    per = per_layer(sh, lay, lay.recompute, lay.flash) * k
    full = per_layer(sh, lay, ir.Recompute.NONE, lay.flash) * k
    mask, out = embedding_mask(sh, lay) * k, output_layer(sh, lay) * k
    mixed = _moe_layers(sh)
    if mixed is not None:  # a dense layer keeps its own; the recompute working set is the larger layer
        dense = per_layer(sh, lay, lay.recompute, lay.flash, moe=False) * k
        full = peak(full, per_layer(sh, lay, ir.Recompute.NONE, lay.flash, moe=False) * k)

    def layers(name: str, f: InFlight) -> sympy.Expr:
        if mixed is None or lay.recompute is ir.Recompute.FULL:
            return f.layer_microbatches * per
        if lay.v != 1 and has_pipeline(lay):  # interleaved: chunks from all over the model, the larger kind
            return f.layer_microbatches * peak(per, dense)
        on = sh.L / lay.p if has_pipeline(lay) else sh.L
        moe = mixed(name, lay.p) if has_pipeline(lay) else mixed(None)
        return f.chunks * (moe * per + (on - moe) * dense)

    stages = tuple(
        StageActivations(name, f, layers(name, f), f.embedding * mask, f.output * out)
        for name, f in in_flight(sh, lay).items()
    )
    first, last = stages[0], stages[-1]
    lm = first.in_flight.layer_microbatches
    total = peak(*(st.total for st in stages))
    transient = full if lay.recompute is ir.Recompute.FULL else zero
    loss_backward = zero
    if sh.activation_count in eager.EAGER_COUNTS and not has_pipeline(lay):
        loss_backward = 2 * sh.logits_bytes * sh.s / lay.c * sh.b * sh.V / lay.t
    return Activations(per, full, lm, lm / (sh.L / lay.p), first.embedding, last.output, total, transient,
                       stages if has_pipeline(lay) else (), loss_backward)


def named_terms(sh: Shape, lay: Layout) -> tuple[tuple[tuple[str, sympy.Expr], ...], tuple[tuple[str, sympy.Expr], ...]]:
    """``Activations.per_layer`` and, for one microbatch, ``embedding`` + ``output`` (one stage) as
    named terms (``per_layer_terms``, ``outside_terms``, with the estimator's allowance); the layer
    terms are () where the layers are of two kinds (dense and MoE). Computed on demand, not by
    ``activations``: only a comparison with a measurement reads them."""
    if not sh.has_shape:
        return (), ()
    k = sh.allowance
    layer = () if _moe_layers(sh) is not None else tuple(
        (name, x * k) for name, x in per_layer_terms(sh, lay, lay.recompute, lay.flash))
    return layer, tuple((name, x * k) for name, x in outside_terms(sh, lay))
