"""Offloaded model states (mode ``O``, residency host or NVMe): which states an axis offloads and
the host-device copies of one step (``ir.collectives`` adds them to the schedule)."""

from __future__ import annotations

from .. import ir
from .buffers import ONE, Collective, Kind, Payload, Phase
from .buffers import PayloadTensor as PT
from .nodes import Const, Mode, Op, State, Value
from .overrides import OverrideTarget, OverrideVerb

HOST_LINK = "pcie"


def _twice(m: Value) -> Value:
    """2·m, as ``ir.collectives`` writes a product (a factor 1 dropped)."""
    return ir.const(2) if isinstance(m, Const) and m.value == 1 else Op("*", (ir.const(2), m))


def is_offloaded(plan: ir.Plan, state: State) -> bool:
    p = plan.placement(state)
    return p.offloaded or bool(p.axes_with(Mode.O))


def sharded_axes(plan: ir.Plan, state: State) -> tuple[str, ...]:
    return plan.placement(state).axes_with(Mode.S, Mode.S_STAR, Mode.O)


def offload(plan: ir.Plan) -> list[Collective]:
    """Host-device copies of offloaded states: the parameter shard fetched for forward (and
    backward), the gradient shard sent to the host for the step, the updated shard sent back."""
    out: list[Collective] = []
    m = plan.model.microbatches
    params_off = is_offloaded(plan, State.PARAMS)
    if params_off and not any(o.verb == OverrideVerb.NO_FETCH and o.group in (None, "all")
                                 for o in plan.overrides_for(OverrideTarget.PARAMS)):
        th = plan.placement(State.PARAMS)
        n = _twice(m) if th.reshard_after_forward else m
        out.append(Collective(Kind.HOST_TO_DEVICE, State.PARAMS, (), HOST_LINK, Phase.FORWARD, n,
                              Payload(PT.PARAMS_SHARD, sharded_axes(plan, State.PARAMS), "parameter shard"),
                              "params offloaded: fetched to the device for forward and backward"))
    if is_offloaded(plan, State.GRADS) or is_offloaded(plan, State.OPTIMIZER):
        out.append(Collective(Kind.DEVICE_TO_HOST, State.GRADS, (), HOST_LINK, Phase.OPTIMIZER, ONE,
                              Payload(PT.GRADS_SHARD, sharded_axes(plan, State.GRADS), "reduced gradient shard"),
                              "optimizer or grads on the host: gradients copied to the host for the step"))
    if is_offloaded(plan, State.OPTIMIZER) and not params_off:
        out.append(Collective(Kind.HOST_TO_DEVICE, State.PARAMS, (), HOST_LINK, Phase.OPTIMIZER, ONE,
                              Payload(PT.PARAMS_SHARD, sharded_axes(plan, State.OPTIMIZER), "updated parameter shard"),
                              "optimizer on the host: updated parameters copied back to the device"))
    return out
