"""The vocabulary of the collective schedule (``Collective``: kind, state, group, link, phase,
count, payload) and the reduction of one gradient buffer over a set of axes, shared by
``ir.collectives`` and ``ir.sync``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from .. import ir
from .nodes import Mode, State, Value
from .overrides import OverrideTarget, OverrideVerb

ONE = ir.const(1)


class Kind(str, Enum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    P2P = "p2p"
    HOST_TO_DEVICE = "host_to_device"
    DEVICE_TO_HOST = "device_to_host"


class Phase(str, Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    GRAD_SYNC = "grad_sync"
    OPTIMIZER = "optimizer"
    REFRESH = "refresh"


class PayloadTensor(StrEnum):
    """What a collective moves (``Payload.tensor``); ``costs.comm`` sizes each. One group's own
    gradient sum is ``group_grads(name)``, "grads:<group>", outside this closed set."""

    PARAMS = "params"
    GRADS = "grads"
    DENSE_PARAMS = "dense_params"  # the non-expert parameters' buffer (``ir.sync``)
    EXPERT_PARAMS = "expert_params"
    DENSE_GRADS = "dense_grads"
    EXPERT_GRADS = "expert_grads"
    PARAMS_SHARD = "params_shard"  # offload traffic
    GRADS_SHARD = "grads_shard"
    ACTIVATION = "activation"
    BOUNDARY = "boundary"
    BOUNDARY_CHUNK = "boundary_chunk"
    TOKENS = "tokens"
    EXPERT_TOKENS = "expert_tokens"
    TOKEN_SCALARS = "token_scalars"
    GATHERED_TOKEN_SCALARS = "gathered_token_scalars"  # the whole sequence's per-token loss values (ir.lossgather)
    KV = "kv"
    ROUTER_STATS = "router_stats"  # the MoE aux loss's per-expert routing statistics (``ir.routerstats``)
    ULYSSES = "ulysses"  # Q, K, V before the attention and its output after it (Ulysses' all-to-alls)
    # under a stated head split (override heads: uneven / chunk / floor) the payload is ir.ulysses_split.payload(...)


# the buffers of the non-expert parameters and of the experts (``ir.sync``), by state
DENSE_BUFFERS = (PayloadTensor.DENSE_GRADS, PayloadTensor.DENSE_PARAMS)
EXPERT_BUFFERS = (PayloadTensor.EXPERT_GRADS, PayloadTensor.EXPERT_PARAMS)
GROUP_GRADS = "grads:"  # the payload of one group's own gradient sum: "grads:<group>"


def group_grads(group: str) -> str:
    """The payload tensor of the gradient sum of the group named ``group``."""
    return GROUP_GRADS + group


def grads_group(tensor: str) -> str | None:
    """The group whose own gradient sum the payload ``tensor`` is, or None."""
    return tensor[len(GROUP_GRADS):] if tensor.startswith(GROUP_GRADS) else None


@dataclass(frozen=True)
class Payload:
    """What a collective moves: a tensor, the axes that divide it, and the groups whose buffer it is."""

    tensor: PayloadTensor | str  # a PayloadTensor, or group_grads(name)
    divided_over: tuple[str, ...] = ()
    description: str = ""
    # the parameter groups whose buffer it is (``ir.views``): these only, or (None) every group
    # but ``without`` (groups with placements of their own move in buffers of their own)
    groups: tuple[str, ...] | None = None
    without: tuple[str, ...] = ()


@dataclass(frozen=True)
class Collective:
    """One collective of a step: its kind, state, axes, link, phase, count per step and payload."""

    kind: Kind
    state: State
    axes: tuple[str, ...]
    link: str | None
    phase: Phase
    count: Value
    payload: Payload
    rule: str = ""
    size: Value | None = None  # devices in the group when it is a part of the axes (a K/V copy group)
    # devices in the group when a reduction over the whole axes runs within blocks of their ranks (ir.blocks)
    block: Value | None = None
    # Megatron-LM's asynchronous backward (``conventions { tensor_backward = overlapped }``): the
    # product these calls may run during ("layer": one call behind each of a layer's two
    # column-parallel products, QKV and the MLP's up-projection; "head": behind the output layer),
    # and how many calls run behind each such product; the other calls stay on the critical path
    behind: str = ""
    behind_count: Value | None = None


def uniq(xs) -> tuple[str, ...]:
    return tuple(dict.fromkeys(xs))


def link_of(plan: ir.Plan, axes: tuple[str, ...]) -> str | None:
    links = [plan.mesh.axis(a).link for a in axes]
    known = [x for x in links if x]
    if not known:
        return None
    if len(set(known)) == 1:
        return known[0]
    return "inter_node" if "inter_node" in known else "+".join(sorted(set(known)))


def reduce_buffer(plan: ir.Plan, reduce_axes, g: ir.Placement, opt: ir.Placement, g_sharded: tuple[str, ...],
            per_mb: Value, tensor: PayloadTensor, note: str) -> list[Collective]:
    """Reduce-scatter, reduce-to-owner and all-reduce of one gradient buffer over ``reduce_axes``."""
    what = {PayloadTensor.GRADS: "gradients", PayloadTensor.DENSE_GRADS: "non-expert gradients",
            PayloadTensor.EXPERT_GRADS: "expert gradients"}[tensor]
    scatter = tuple(a for a in reduce_axes if g.mode(a) in (Mode.S, Mode.S_STAR, Mode.M, Mode.O))
    plain = tuple(a for a in reduce_axes if a not in scatter)
    # replicated grads feeding a sharded optimizer only need the owner's piece (ZeRO-1)
    owner = tuple(a for a in plain if opt.mode(a).shards)
    allred = tuple(a for a in plain if a not in owner)
    # `override grads: reduce_every_microbatch`: the whole buffer is reduced after each microbatch's
    # backward (DDP without no_sync), not once per step
    once, when = step_reduction(plan, per_mb)
    held = f"{what} after each microbatch" if once is not ONE else f"accumulated {what}"
    out: list[Collective] = []
    done: tuple[str, ...] = ()
    if scatter:
        out.append(Collective(
            Kind.REDUCE_SCATTER, State.GRADS, scatter, link_of(plan, scatter), Phase.GRAD_SYNC, per_mb,
            Payload(tensor, tuple(a for a in g_sharded if a not in scatter), f"full {what}"),
            "grads S/M over a data axis: reduce-scatter once per microbatch (per scheduling unit)" + note))
        done = scatter
    if owner:
        out.append(Collective(
            Kind.REDUCE_SCATTER, State.GRADS, owner, link_of(plan, owner), Phase.GRAD_SYNC, once,
            Payload(tensor, uniq(a for a in g_sharded + done if a not in owner), held),
            f"grads R with optimizer S: reduce-scatter to the optimizer shards {when}" + note))
        done = done + owner
    if allred:
        out.append(Collective(
            Kind.ALL_REDUCE, State.GRADS, allred, link_of(plan, allred), Phase.GRAD_SYNC, once,
            Payload(tensor, uniq(a for a in g_sharded + done if a not in allred), held),
            f"grads R over a data axis: all-reduce {when}" + note))
    return out


def step_reduction(plan: ir.Plan, per_mb: Value) -> tuple[Value, str]:
    """How often a reduction otherwise made once per step runs, and those words: once per step,
    or after every microbatch under ``override grads: reduce_every_microbatch``."""
    if reduces_every_microbatch(plan):
        return per_mb, "once per microbatch (override grads: reduce_every_microbatch)"
    for verb in (OverrideVerb.REDUCE_ACCUMULATED_EVERY_MICROBATCH, OverrideVerb.REDUCE_SUMMED_EVERY_MICROBATCH):
        if any(o.verb == verb and o.group in (None, "all") for o in plan.overrides_for(OverrideTarget.GRADS)):
            return per_mb, f"once per microbatch (override grads: {verb})"
    return ONE, "once per step"


def reduces_every_microbatch(plan: ir.Plan) -> bool:
    """``override grads: reduce_every_microbatch``: the gradient buffer is reduced after every
    microbatch's backward instead of once per step."""
    return any(o.verb == OverrideVerb.REDUCE_EVERY_MICROBATCH and o.group in (None, "all") for o in plan.overrides_for(OverrideTarget.GRADS))
