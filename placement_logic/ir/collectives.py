"""Collective schedule of one training step, derived from a plan's placements.

Input: an ``ir.Plan``. Output: a tuple of ``Collective`` records (plain IR-level data, no
sympy): what is communicated, over which mesh axes, in which phase of the step, how many
times per step and what buffer it moves. The cost engine sizes them
(``placement_logic.costs.comm``); the checker reads the same records to know which
reductions and gathers a plan performs.

API (stable):

    schedule(plan) -> tuple[Collective, ...]   (derive(plan), once per plan: ir.views)

    Collective.kind     Kind: all_reduce, reduce_scatter, all_gather, all_to_all, p2p,
                        host_to_device, device_to_host
    Collective.state    ir.State the buffer belongs to (activations for TP/PP/EP/CP traffic)
    Collective.axes     the group: mesh axis names, in mesh order (() for host traffic)
    Collective.link     link class of the group (the axis link; "pcie" for host traffic)
    Collective.phase    Phase: forward, backward, grad_sync, optimizer, refresh
    Collective.count    ir.Value: how many times per step one device takes part
    Collective.payload  Payload: tensor (a PayloadTensor: params, grads, dense_grads, activation, boundary,
                        tokens, kv, params_shard, grads_shard), divided_over (mesh axes whose shards the
                        buffer already excludes), description (human text)
    Collective.rule     which derivation rule produced it (one short sentence)

Counts are built from the model's own values: ``m`` is ``model.microbatches``; the layer
count is ``transformer.layers`` or the free symbol ``L`` when no shape is given; per-layer
counts are per device, so they are divided by the pipeline size. The rules are those of
docs/costs.md ("Collectives").
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from . import actflow, blocks, heads, lossgather, routerstats, stepsync, sync, views
from . import groups as pg
from .buffers import (
    DENSE_BUFFERS,
    EXPERT_BUFFERS,
    ONE,
    Collective,
    Kind,
    Payload,
    Phase,
    link_of,
    reduce_buffer,
    step_reduction,
)
from .buffers import PayloadTensor as PT
from .buffers import uniq as _uniq
from .nodes import Const, Mode, Op, Role, ScheduleKind, State, Sym, Value
from .offload import HOST_LINK, is_offloaded, sharded_axes  # noqa: F401 - read through this module
from .offload import offload as _offload
from .overrides import OverrideTarget, OverrideVerb

LAYERS_SYMBOL = "L"
_ONE = ONE

# Roles whose axes split the batch (or the sequence): gradient contributions vary there.
_REDUCING_ROLES = (Role.DATA, Role.CONTEXT)


# --------------------------------------------------------------------------- value helpers


def _mul(*xs: Value) -> Value:
    xs = tuple(x for x in xs if not (isinstance(x, Const) and x.value == 1))
    if not xs:
        return _ONE
    return xs[0] if len(xs) == 1 else Op("*", xs)


def _div(a: Value, b: Value) -> Value:
    if isinstance(b, Const) and b.value == 1:
        return a
    return Op("/", (a, b))


def layers_value(plan: ir.Plan) -> Value:
    t = plan.model.transformer
    return t.layers if t is not None else Sym(LAYERS_SYMBOL)


def pipeline_axis(plan: ir.Plan) -> str | None:
    if plan.schedule is not None:
        return plan.schedule.axis
    pp = views.view(plan).axes_with_role(Role.PIPELINE)
    return pp[0] if pp else None


def stage_layers(plan: ir.Plan) -> Value:
    """Layers held by one device: L, or L/p on a pipeline axis of size p."""
    pp = pipeline_axis(plan)
    return _div(layers_value(plan), Sym(pp)) if pp else layers_value(plan)


def chunks_value(plan: ir.Plan) -> Value:
    s = plan.schedule
    if s is not None and s.kind in (ScheduleKind.INTERLEAVED, ScheduleKind.ZEROPP):
        return s.chunks
    return _ONE


def gather_unit_value(plan: ir.Plan) -> Value:
    """Microbatches that share one gather of an S* unit: ZeroPP's U, else 1."""
    s = plan.schedule
    return s.unit if s is not None and s.kind is ScheduleKind.ZEROPP else _ONE


def _overrides(plan: ir.Plan, target: str, verb: str) -> tuple[ir.Override, ...]:
    return tuple(o for o in plan.overrides_for(target) if o.verb == verb and o.group in (None, "all"))


# --------------------------------------------------------------------------- rules


def _grad_sync(plan: ir.Plan) -> list[Collective]:
    """Gradient reduction over the axes that split the batch or the sequence."""
    g = plan.placement(State.GRADS)
    opt = plan.placement(State.OPTIMIZER)
    m = plan.model.microbatches
    per_mb = _div(m, gather_unit_value(plan))
    given = _overrides(plan, OverrideTarget.GRADS, OverrideVerb.REDUCE)
    if given:
        groups = [tuple(o.axes or ()) for o in given]
        reduce_axes = [a for grp in groups for a in grp]
    else:
        reduce_axes = list(views.view(plan).axes_with_role(*_REDUCING_ROLES))
        # expert axes carry data for the dense parameters: reduce every gradient there when grads are
        # R, or when the experts are not split over the axis (params gathered or replicated there)
        reduce_axes += [a for a in views.view(plan).axes_with_role(Role.EXPERT) if g.mode(a) is Mode.R
                        or plan.placement(State.PARAMS).mode(a) not in (Mode.S, Mode.O)]
        reduce_axes = [a for a in plan.mesh.names if a in reduce_axes]
    if not given and sync.applies(plan):
        return sync.grad_sync(plan, per_mb)
    g_sharded = sharded_axes(plan, State.GRADS)
    out = reduce_buffer(plan, reduce_axes, g, opt, g_sharded, per_mb, PT.GRADS, "")
    done = _uniq(a for c in out if c.kind is Kind.REDUCE_SCATTER for a in c.axes)
    if not given:
        experts = views.view(plan).axes_with_role(Role.EXPERT)  # they do not divide the non-expert gradients
        # a distributed optimizer shards the non-expert state over the expert axes too (its
        # replicas there are data-parallel replicas): reduce-scatter to those shards
        shard = views.data_mode(plan, State.OPTIMIZER).shards
        count, when = step_reduction(plan, per_mb)
        for e in plan.groups_with_role(Role.EXPERT):  # a product binding's axes: one group
            if any(a in reduce_axes for a in e):
                continue  # already reduced above with the whole gradient
            out.append(Collective(
                Kind.REDUCE_SCATTER if shard else Kind.ALL_REDUCE, State.GRADS, e, link_of(plan, e),
                Phase.GRAD_SYNC, count,
                Payload(PT.DENSE_GRADS, _uniq(a for a in g_sharded + done if a not in experts),
                        "non-expert gradients (expert parameters are split over the axis)"),
                ("expert axis: non-expert gradients reduce-scattered to the distributed optimizer's shards"
                 if shard else "expert axis: non-expert gradients all-reduced over it")
                + " " + when))
            done = done + (e if shard else ())
    return out


def _param_gathers(plan: ir.Plan) -> list[Collective]:
    th = plan.placement(State.PARAMS)
    m = plan.model.microbatches
    per_unit = _div(m, gather_unit_value(plan))
    given = _overrides(plan, OverrideTarget.PARAMS, OverrideVerb.GATHER)
    star = tuple(given[0].axes or ()) if given else th.axes_with(Mode.S_STAR)
    if not star:
        return []
    link = link_of(plan, star)
    rest = tuple(a for a in sharded_axes(plan, State.PARAMS) if a not in star)
    pay = Payload(PT.PARAMS, rest, f"parameters, one {th.unit} at a time")
    out = [Collective(Kind.ALL_GATHER, State.PARAMS, star, link, Phase.FORWARD, per_unit, pay,
                      "params S*: all-gather before forward")]
    if th.reshard_after_forward:
        out.append(Collective(Kind.ALL_GATHER, State.PARAMS, star, link, Phase.BACKWARD, per_unit, pay,
                              "params S* freed after forward: all-gather again before backward"))
    return out + ([] if given else sync.replica_gathers(plan, star, per_unit))


def _param_refresh(plan: ir.Plan) -> list[Collective]:
    th = plan.placement(State.PARAMS)
    opt = plan.placement(State.OPTIMIZER)
    if _overrides(plan, OverrideTarget.PARAMS, OverrideVerb.NO_REGATHER) or is_offloaded(plan, State.PARAMS):
        return []
    if sync.applies(plan):
        return sync.refresh(plan)
    axes = tuple(a for a in plan.mesh.names if th.mode(a) is Mode.R and opt.mode(a).shards)
    if not axes:
        return []
    rest = sharded_axes(plan, State.PARAMS)
    out = []
    experts = views.view(plan).axes_with_role(Role.EXPERT)
    if views.data_mode(plan, State.OPTIMIZER).shards:  # the non-expert shards over the expert axes first
        for e in plan.groups_with_role(Role.EXPERT):  # a product binding's axes: one group
            if any(a in axes or th.mode(a) not in (Mode.S, Mode.O) for a in e):
                continue
            out.append(Collective(Kind.ALL_GATHER, State.PARAMS, e, link_of(plan, e), Phase.REFRESH, _ONE,
                                  Payload(PT.DENSE_PARAMS, _uniq(axes + tuple(a for a in rest if a not in experts)),
                                          "updated non-expert parameters"),
                                  "distributed optimizer over an expert axis: all-gather the updated non-expert "
                                  "parameters after the step"))
    # (a buffer holding a group updated after every micro-step is written back after each update: ir.stepsync)
    return [Collective(Kind.ALL_GATHER, State.PARAMS, axes, link_of(plan, axes), Phase.REFRESH, _ONE,
                       Payload(PT.PARAMS, rest, "updated parameters"),
                       "params R with optimizer S: all-gather the updated parameters after the step")] + out


def _tensor_parallel(plan: ir.Plan) -> list[Collective]:
    out: list[Collective] = []
    m = plan.model.microbatches
    per = _mul(stage_layers(plan), m)
    for t in plan.groups_with_role(Role.TENSOR, Role.SEQUENCE):  # a product binding's axes form one group
        link = link_of(plan, t)
        pay = Payload(PT.ACTIVATION, (), "layer input/output activations (s·b·h)")
        fwd_n = 2 if plan.recompute is not ir.Recompute.FULL else 4  # full recompute reruns forward
        if plan.sequence_parallel:
            for kind in (Kind.ALL_GATHER, Kind.REDUCE_SCATTER):
                out.append(Collective(kind, State.ACTIVATIONS, t, link, Phase.FORWARD, _mul(ir.const(2), per), pay,
                                      "Megatron SP: 2 all-gather + 2 reduce-scatter per layer in forward"))
                # the backward reduce-scatters: the column-parallel inputs' gradients (one per product)
                rs = kind is Kind.REDUCE_SCATTER
                out.append(Collective(kind, State.ACTIVATIONS, t, link, Phase.BACKWARD,
                                      _mul(ir.const(fwd_n), per), pay,
                                      "Megatron SP: 2 all-gather + 2 reduce-scatter per layer in backward"
                                      + (" (+2 recomputed forward)" if fwd_n == 4 else ""),
                                      behind="layer" if rs else "", behind_count=per if rs else None))
            # Megatron-LM's column-parallel linears (QKV, MLP up) keep only their sequence shard
            # of the input and all-gather it again in backward for the weight gradient
            out.append(Collective(Kind.ALL_GATHER, State.ACTIVATIONS, t, link, Phase.BACKWARD,
                                  _mul(ir.const(2), per), pay, "Megatron SP (weight gradient): the 2 column-parallel "
                                  "inputs all-gathered again per layer in backward", behind="layer", behind_count=per))
        else:
            out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, t, link, Phase.FORWARD, _mul(ir.const(2), per),
                                  pay, "Megatron TP: 2 all-reduces per layer per microbatch in forward"))
            out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, t, link, Phase.BACKWARD,
                                  _mul(ir.const(fwd_n), per), pay,
                                  "Megatron TP: 2 all-reduces per layer per microbatch in backward"
                                  + (" (+2 recomputed forward)" if fwd_n == 4 else ""), behind="layer",
                                  behind_count=per))
    return out


_CE_TEXT = {"label_smoothing": ", the sum of the logits (label smoothing)",
            "logit_z_loss": ", the z-loss's sum of exponentials"}


def _vocab_parallel(plan: ir.Plan) -> list[Collective]:
    """Megatron-LM's vocabulary-parallel embedding and head over each tensor axis that splits them.

    Without sequence parallelism the embedding all-reduces its partial output (forward) and the
    head all-reduces its input's partial gradient (backward); with it, the embedding's output is
    reduce-scattered into the sequence shards (its gradient all-gathered in backward) and the
    head's input all-gathered from them (its gradient reduce-scattered). The vocabulary-parallel
    cross entropy all-reduces three fp32 values per token (the max logit, the target's logit,
    the sum of exponentials). Per microbatch, on the stage that holds the embedding (the first)
    and the one that holds the head (the last): with a pipeline axis the figures are the last
    stage's, whose head and loss traffic is the larger.
    """
    shape = plan.model.transformer
    if shape is None:
        return []
    groups = {g.name: g for g in pg.param_groups(plan.model)}
    params = plan.placement(State.PARAMS)
    m = plan.model.microbatches
    pp = pipeline_axis(plan)
    pp_size = plan.mesh.axis(pp).size if pp is not None else None
    first_too = pp is None or (isinstance(pp_size, Const) and pp_size.value == 1)

    def split(name: str, t: tuple[str, ...]) -> bool:
        g = groups.get(name)
        return g is not None and g.tensor == pg.SPLIT and pg.effective(params, g).mode(t[0]) in (Mode.S, Mode.S_STAR)

    out: list[Collective] = []
    pay = Payload(PT.ACTIVATION, (), "embedding output / head input (s·b·h)")
    for t in plan.groups_with_role(Role.TENSOR, Role.SEQUENCE):
        link = link_of(plan, t)
        emb, head = split("embedding", t) and first_too, split("head", t)
        if plan.sequence_parallel:
            # the sequence-parallel region meets the embedding and the head whether or not they are split
            ends = [("embedding", Kind.REDUCE_SCATTER, Kind.ALL_GATHER)] if first_too else []
            ends.append(("head", Kind.ALL_GATHER, Kind.REDUCE_SCATTER))
            for what, fwd, bwd in ends:
                out.append(Collective(fwd, State.ACTIVATIONS, t, link, Phase.FORWARD, m, pay,
                                      f"Megatron SP: the {what}'s {'output' if what == 'embedding' else 'input'} "
                                      f"{fwd.value.replace('_', '-')} per microbatch in forward"))
                on_head = what == "head" and head  # behind the vocabulary-parallel output layer
                out.append(Collective(bwd, State.ACTIVATIONS, t, link, Phase.BACKWARD, m, pay,
                                      f"Megatron SP: the {what}'s gradient {bwd.value.replace('_', '-')} per "
                                      "microbatch in backward", behind="head" if on_head else "",
                                      behind_count=m if on_head else None))
            out.append(Collective(Kind.ALL_GATHER, State.ACTIVATIONS, t, link, Phase.BACKWARD, m, pay,
                                  "Megatron SP (weight gradient): the head's input all-gathered again per "
                                  "microbatch in backward", behind="head", behind_count=m))
        else:
            if emb:
                out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, t, link, Phase.FORWARD, m, pay,
                                      "vocabulary-parallel embedding: all-reduce of its partial output per "
                                      "microbatch in forward"))
            if head:
                out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, t, link, Phase.BACKWARD, m, pay,
                                      "vocabulary-parallel head: all-reduce of its input's partial gradient per "
                                      "microbatch in backward", behind="head", behind_count=m))
        if head:
            # the extra terms the model states (ir.losses.CE_TERMS): one more fp32 value per token each
            extra = "".join(_CE_TEXT[k] for k, _ in plan.model.ce_terms)
            out.append(Collective(Kind.ALL_REDUCE, State.ACTIVATIONS, t, link, Phase.FORWARD,
                                  _mul(ir.const(3 + len(plan.model.ce_terms)), m),
                                  Payload(PT.TOKEN_SCALARS, (), "one fp32 value per token (s·b·4)"),
                                  "vocabulary-parallel cross entropy: all-reduce of the max logit, the target's "
                                  f"logit and the sum of exponentials{extra} per microbatch"))
    return out


def _pipeline(plan: ir.Plan) -> list[Collective]:
    pp = pipeline_axis(plan)
    if pp is None:
        return []
    cnt = _mul(plan.model.microbatches, chunks_value(plan))
    pay = Payload(PT.BOUNDARY, (), "stage-boundary activations (s·b·h)")
    link = link_of(plan, (pp,))
    # Megatron-LM's scatter/gather (Narayanan et al. 2021, §4.1; --scatter-gather-tensors-in-pipeline,
    # on by default): without sequence parallelism each tensor rank sends 1/t of the boundary and
    # the receiving stage all-gathers it over the tensor group
    size = plan.mesh.axis(pp).size
    one = isinstance(size, Const) and size.value == 1
    tp = () if plan.sequence_parallel or one else \
        tuple(a for g in plan.groups_with_role(Role.TENSOR, Role.SEQUENCE) for a in g)
    if tp:
        pay = Payload(PT.BOUNDARY_CHUNK, tp, "1/t of the stage-boundary activations (s·b·h/t)")
    out = [
        Collective(Kind.P2P, State.ACTIVATIONS, (pp,), link, Phase.FORWARD, cnt, pay,
                   "pipeline: send activations to the next stage per microbatch per chunk"),
        Collective(Kind.P2P, State.ACTIVATIONS, (pp,), link, Phase.BACKWARD, cnt, pay,
                   "pipeline: send activation gradients to the previous stage per microbatch per chunk"),
    ]
    if tp:
        whole = Payload(PT.ACTIVATION, (), "stage-boundary activations (s·b·h)")
        out += [Collective(Kind.ALL_GATHER, State.ACTIVATIONS, tp, link_of(plan, tp), ph, cnt, whole,
                           f"pipeline scatter/gather: the received 1/t chunks all-gathered over the tensor group "
                           f"per microbatch per chunk in {ph.value}") for ph in (Phase.FORWARD, Phase.BACKWARD)]
    return out


def _experts(plan: ir.Plan) -> list[Collective]:
    out: list[Collective] = []
    per = _mul(ir.const(2), stage_layers(plan), plan.model.microbatches)
    pay = Payload(PT.TOKENS, (), "routed tokens (s·b·h·top_k·capacity_factor)")
    fold = views.expert_group(plan)
    if fold is not None:  # parallel folding: one all-to-all over the expert group's own expert axes
        axes = views.group_axes(plan, fold, Role.EXPERT)
        out = [Collective(Kind.ALL_TO_ALL, State.ACTIVATIONS, axes, link_of(plan, axes), ph, per, pay,
                          f"expert parallel (folded): all-to-all before and after each MoE layer in {ph.value}")
               for ph in (Phase.FORWARD, Phase.BACKWARD)] if axes else []
        # an expert tensor group of its own (axes the dense layers do not split): Megatron-LM's
        # dispatcher all-gathers the routed tokens over it before the experts and reduce-scatters
        # their partial outputs after them; backward mirrors both
        etp = tuple(a for a in views.group_axes(plan, fold, Role.TENSOR)
                    if views.view(plan).role(a) not in (Role.TENSOR, Role.SEQUENCE))
        if etp:
            once = _mul(stage_layers(plan), plan.model.microbatches)
            gathered = Payload(PT.EXPERT_TOKENS, etp, "routed tokens gathered over the expert tensor group "
                               "(s·b·h·top_k·capacity_factor × its size)")
            for ph in (Phase.FORWARD, Phase.BACKWARD):
                for kind in (Kind.ALL_GATHER, Kind.REDUCE_SCATTER):
                    out.append(Collective(kind, State.ACTIVATIONS, etp, link_of(plan, etp), ph, once, gathered,
                                          f"expert tensor parallel (folded): {kind.value.replace('_', '-')} of the "
                                          f"routed tokens over the expert tensor group per MoE layer in {ph.value}"))
        return out
    for e in plan.groups_with_role(Role.EXPERT):
        link = link_of(plan, e)
        out.append(Collective(Kind.ALL_TO_ALL, State.ACTIVATIONS, e, link, Phase.FORWARD, per, pay,
                              "expert parallel: all-to-all before and after each MoE layer in forward"))
        out.append(Collective(Kind.ALL_TO_ALL, State.ACTIVATIONS, e, link, Phase.BACKWARD, per, pay,
                              "expert parallel: all-to-all before and after each MoE layer in backward"))
    return out


def _context(plan: ir.Plan) -> list[Collective]:
    out: list[Collective] = []
    per = _mul(stage_layers(plan), plan.model.microbatches)
    for c in plan.groups_with_role(Role.CONTEXT):
        link = link_of(plan, c)
        ring = Op("-", (_mul(*(Sym(a) for a in c)), _ONE))
        pay = Payload(PT.KV, (), "one key/value block (2·s/cp·b·h·kv_heads/heads)")
        out.append(Collective(Kind.P2P, State.ACTIVATIONS, c, link, Phase.FORWARD, _mul(ring, per), pay,
                              "context parallel: ring-pass K,V blocks (cp-1 steps) per layer in forward"))
        out.append(Collective(Kind.P2P, State.ACTIVATIONS, c, link, Phase.BACKWARD,
                              _mul(ir.const(2), ring, per), pay,
                              "context parallel: ring-pass K,V and their gradients per layer in backward"))
    return out


def _per_buffer(rule, parts: tuple[views.Part, ...]) -> list[Collective]:
    """A rule over the model states, applied to each part of the parameter groups (``ir.views``)
    with the part's own placements; each collective names the groups whose buffer it moves."""
    if len(parts) == 1:
        return rule(parts[0].plan)
    expert = {g.name: g.expert for g in pg.param_groups(parts[0].plan.model)}
    out = []
    for part in parts:
        for c in rule(part.plan):
            if c.state is State.ACTIVATIONS:
                continue
            kinds = {expert.get(n, False) for n in part.groups or ()}
            if part.groups is not None and c.payload.tensor in DENSE_BUFFERS + EXPERT_BUFFERS \
                    and (c.payload.tensor in EXPERT_BUFFERS) not in kinds:
                continue  # the non-expert (expert) part of a buffer of expert (non-expert) groups only
            desc = c.payload.description + (f" (group {', '.join(part.groups)})" if part.groups is not None else "")
            out.append(replace(c, payload=replace(c.payload, groups=part.groups, without=part.without,
                                                  description=desc)))
    return out


def schedule(plan: ir.Plan) -> tuple[Collective, ...]:
    """``derive(plan)``, derived once per plan and then read from its view (``ir.views``)."""
    return views.view(plan).once(derive)


def derive(plan: ir.Plan) -> tuple[Collective, ...]:
    """Every collective one device takes part in during one training step; the model states'
    collectives once per buffer of parameter groups placed alike (``ir.views.buffers``).
    Readers take it from ``schedule(plan)``: one derivation per plan."""
    parts = views.buffers(plan)
    return stepsync.per_update(plan, blocks.apply(plan, actflow.adjust(plan, tuple(
        _per_buffer(_param_gathers, parts)
        + _tensor_parallel(plan)
        + _vocab_parallel(plan)
        + _context(plan)
        + _experts(plan)
        + _pipeline(plan)
        + _per_buffer(_grad_sync, parts)
        + heads.grad_sums(plan)
        + routerstats.collectives(plan, _mul(stage_layers(plan), plan.model.microbatches))
        + lossgather.collectives(plan, plan.model.microbatches)
        + _per_buffer(_offload, parts)
        + _per_buffer(_param_refresh, parts)
    ), _mul(stage_layers(plan), plan.model.microbatches), plan.model.microbatches)))
