"""The cost engine's prediction for the scaled-down run.

Input: an ``ir.Spec``, one of its plans, the mesh axis sizes of the run and the tiny
shape. Output: a ``Prediction`` — persistent bytes per state per rank and the
collectives of one step (kind, axes, total buffer bytes) — obtained by rewriting the
plan's model to the tiny shape at the byte widths the run realises (``widths.Widths``:
the spec's stated widths, or fp32 with the optimizer that runs when it states none) and
asking ``placement_logic.costs`` for it. The comparison
consumes only ``Prediction``, so any other predictor can be plugged in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

import sympy

from .. import ir
from .shape import TinyShape

FP32 = 4
OPTIMIZER_BYTES = {"adam": 8, "sgd_momentum": 4, "sgd": 0}  # fp32 state per parameter
WIDTH_KEYS = ("params", "grads", "optimizer", "activations")


@dataclass(frozen=True)
class PredictedCollective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | p2p
    axes: tuple[str, ...]
    buffer_bytes: Fraction  # total over the step: buffer size m times calls per step
    calls: Fraction
    phase: str
    description: str = ""


@dataclass(frozen=True)
class Prediction:
    source: str
    psi: Fraction  # parameter count
    state_bytes: tuple[tuple[str, Fraction], ...]  # persistent device bytes per rank (max over stages)
    collectives: tuple[PredictedCollective, ...]
    # with a pipeline: per stage ("first", "last" and, with more than two stages, "interior":
    # the first stage without the token embedding), the persistent device bytes per state
    stage_bytes: tuple[tuple[str, tuple[tuple[str, Fraction], ...]], ...] = ()
    # parameter bytes per rank of the groups the engine keeps whole on a tensor axis (norms,
    # row-parallel biases, router): PyTorch keeps them whole too
    tensor_whole_bytes: Fraction = Fraction(0)
    # saved activations per layer per microbatch, and outside the layers (embedding and output layer)
    activations_per_layer: Fraction | None = None
    activations_outside: Fraction | None = None
    # the same two as the activation model's named terms (``costs.activations.named_terms``), each
    # summing to its figure; () where the model gives none
    activation_layer_terms: tuple[tuple[str, Fraction], ...] = ()
    activation_outside_terms: tuple[tuple[str, Fraction], ...] = ()
    # bytes per element the prediction was made with: params, grads, optimizer (per parameter), activations
    byte_widths: tuple[tuple[str, Fraction], ...] = ()
    # the engine's peak device bytes per rank (persistent states, activations and transients;
    # the maximum over stages), None when it is not a number at the run's sizes
    device_peak: Fraction | None = None
    # the plan's flash-attention convention the activation model was asked under (not a figure)
    flash_attention: bool = False
    # the spec's activation count (``conventions { activations = ... }``; not a figure)
    activation_count: str = "shape"
    # with a pipeline, per stage ("first", "stage 1" … "stage p−2" between them, "last"): its saved-activation total at
    # the schedule's peak, the layer-microbatches (chunk-microbatches times layers per chunk) and the
    # microbatches of the output layer it counts in flight; the per-microbatch terms are
    # ``activation_layer_terms`` and ``activation_outside_terms``
    stage_activations: tuple[tuple[str, Fraction, Fraction, Fraction], ...] = ()

    @property
    def widths(self) -> dict[str, Fraction]:
        return dict(self.byte_widths)

    @property
    def states(self) -> dict[str, Fraction]:
        return dict(self.state_bytes)

    @property
    def stages(self) -> dict[str, dict[str, Fraction]]:
        return {stage: dict(states) for stage, states in self.stage_bytes}


def _c(x: int | Fraction) -> ir.Const:
    return ir.Const(Fraction(x))


def fp32_widths(optimizer: str) -> dict[str, Fraction]:
    return {"params": Fraction(FP32), "grads": Fraction(FP32), "optimizer": Fraction(OPTIMIZER_BYTES[optimizer]),
            "activations": Fraction(FP32)}


def scaled_plan(plan: ir.Plan, shape: TinyShape, sizes: Mapping[str, int], optimizer: str,
                widths: Mapping[str, Fraction] | None = None) -> ir.Plan:
    """``plan`` with its model replaced by the tiny shape at ``widths`` (bytes per element of
    params, grads, optimizer, activations; default fp32 with ``optimizer``'s state) and its
    axes by ``sizes``."""
    w = dict(widths) if widths is not None else fp32_widths(optimizer)
    tf = ir.TransformerShape(
        hidden=_c(shape.hidden), layers=_c(shape.layers), heads=_c(shape.heads), kv_heads=_c(shape.kv_heads),
        ffn=_c(shape.ffn), vocab=_c(shape.vocab), tied_embeddings=shape.tied_embeddings,
        gated_mlp=shape.gated_mlp, norm=shape.norm, bias=shape.bias, qkv_bias=shape.qkv_bias,
    )
    if shape.moe:
        tf = dataclasses.replace(
            tf, experts=_c(shape.experts), top_k=_c(shape.top_k), capacity_factor=_c(shape.capacity_factor),
            expert_ffn=_c(shape.expert_ffn),
            shared_experts=_c(shape.shared_experts) if shape.shared_experts else None,
            shared_expert_ffn=_c(shape.shared_expert_ffn) if shape.shared_experts else None,
            shared_expert_gate=shape.shared_expert_gate, router_bias=shape.router_bias)
    model = ir.Model(
        params=None, bytes_params=_c(w["params"]), bytes_grads=_c(w["grads"]), bytes_optimizer=_c(w["optimizer"]),
        bytes_activations=_c(w["activations"]), seq=_c(shape.seq), microbatch=_c(shape.microbatch), microbatches=_c(shape.microbatches),
        transformer=tf,
        # the spec's activation conventions: the prediction counts activations as the spec says
        activation_count=plan.model.activation_count, activation_allowance=plan.model.activation_allowance,
    )
    mesh = ir.Mesh(tuple(dataclasses.replace(a, size=_c(sizes[a.name])) for a in plan.mesh.axes))
    return dataclasses.replace(plan, model=model, mesh=mesh)


class UnboundPrediction(Exception):
    """A predicted quantity that still has free symbols after substituting the run's values."""


def _number(expr, subs: dict) -> Fraction:
    value = expr.xreplace(subs) if isinstance(expr, sympy.Basic) else sympy.Integer(expr)
    if not value.is_Rational:
        value = sympy.expand(value)
    if not value.is_Rational:
        raise UnboundPrediction(f"prediction {value} is not a number (free symbols: {sorted(map(str, value.free_symbols))})")
    return Fraction(int(value.p), int(value.q))


def _interior_stages(pc, subs: dict) -> tuple[tuple[str, Fraction, Fraction, Fraction], ...]:
    """Every interior stage's (``stage s``, total, layer-microbatches, output microbatches) at the
    run's pipeline size (``costs.activations.interior_stage``); () where the engine gives none."""
    from ..costs.activations import interior_stage

    try:
        p = _number(pc.layout.p, subs)
    except UnboundPrediction:
        return ()
    out = []
    for s in range(1, int(p) - 1):
        st = interior_stage(pc.shape, pc.layout, sympy.Integer(s))
        if st is None:
            return ()
        out.append((st.stage, _number(st.total, subs), _number(st.in_flight.layer_microbatches, subs),
                    _number(st.in_flight.output, subs)))
    return tuple(out)


def predict(spec: ir.Spec, plan: ir.Plan, shape: TinyShape, sizes: Mapping[str, int], optimizer: str,
            widths: Mapping[str, Fraction] | None = None) -> Prediction:
    """The engine's prediction at ``widths`` (``realise.widths_of`` of the run's realisation;
    default fp32 with ``optimizer``'s state)."""
    from .. import costs
    from ..costs.activations import named_terms
    from ..costs.symbolic import resolve_bindings

    w = dict(widths) if widths is not None else fp32_widths(optimizer)
    small = scaled_plan(plan, shape, sizes, optimizer, w)
    subs = resolve_bindings(spec.bindings, overrides={k: Fraction(v) for k, v in sizes.items()})
    pc = costs.derive(small, sized=True)
    states = tuple(
        (s.value, _number(pc.memory.device[s], subs)) for s in (ir.State.PARAMS, ir.State.GRADS, ir.State.OPTIMIZER)
    )
    stage_bytes = tuple(
        (st.stage, tuple((s.value, _number(st.device[s], subs))
                         for s in (ir.State.PARAMS, ir.State.GRADS, ir.State.OPTIMIZER)))
        for st in pc.memory.stages
    )
    embedding = pc.memory.groups.get("embedding")
    if stage_bytes and embedding is not None and stage_bytes[0][0] == "first":
        # an interior stage holds the layers only: the engine's first stage less its embedding group
        first = dict(stage_bytes[0][1])
        stage_bytes += (("interior", tuple((s, first[s] - _number(embedding.get(ir.State(s), 0), subs))
                                           for s in first)),)
    colls = []
    for x in pc.communication.collectives:
        if not x.collective.axes:
            continue
        calls = _number(x.count, subs)
        colls.append(PredictedCollective(
            kind=x.collective.kind.value,
            axes=tuple(x.collective.axes),
            buffer_bytes=_number(x.buffer, subs) * calls,
            calls=calls,
            phase=x.collective.phase.value,
            description=x.collective.payload.description,
        ))
    from ..ir import groups as pg

    whole = sum((_number(pc.memory.groups[g.name][ir.State.PARAMS], subs) for g in pc.shape.groups
                 if g.group.tensor == pg.WHOLE and g.name in pc.memory.groups), Fraction(0))
    widths = tuple((k, Fraction(w[k])) for k in WIDTH_KEYS)
    act = pc.activations
    per_layer = outside = None
    layer_terms = outside_terms = ()
    if not act.stages:  # one stage: the activation model's single-stage terms
        per_layer = _number(act.per_layer, subs)
        outside = _number(act.embedding, subs) + _number(act.output, subs)
        named_layer, named_outside = named_terms(pc.shape, pc.layout)
        layer_terms = tuple((name, _number(x, subs)) for name, x in named_layer)
        outside_terms = tuple((name, _number(x, subs)) for name, x in named_outside)
    stage_acts: tuple = ()
    if act.stages and plan.model.activation_count in ("pytorch_eager", "pytorch_eager_cuda"):
        # a pipeline under the eager convention: each stage's total with its in-flight counts, and
        # the per-microbatch terms they multiply (one microbatch of one layer, of the output layer)
        named_layer, named_outside = named_terms(pc.shape, pc.layout)
        layer_terms = tuple((name, _number(x, subs)) for name, x in named_layer)
        outside_terms = tuple((name, _number(x, subs)) for name, x in named_outside)
        stage_acts = tuple((st.stage, _number(st.total, subs), _number(st.in_flight.layer_microbatches, subs),
                            _number(st.in_flight.output, subs)) for st in act.stages)
        stage_acts = stage_acts[:1] + _interior_stages(pc, subs) + stage_acts[1:]
    try:
        device_peak = _number(pc.memory.device_total, subs)
    except UnboundPrediction:
        device_peak = None
    return Prediction("placement_logic.costs", _number(pc.shape.psi, subs), states, tuple(colls), stage_bytes,
                      tensor_whole_bytes=whole, byte_widths=widths, activations_per_layer=per_layer,
                      activations_outside=outside, activation_layer_terms=layer_terms,
                      activation_outside_terms=outside_terms, device_peak=device_peak,
                      flash_attention=bool(plan.flash_attention), activation_count=plan.model.activation_count,
                      stage_activations=stage_acts)
