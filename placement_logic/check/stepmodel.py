"""The step model's records: what one training step does to each value the safety conditions
read, per parameter group (``GroupModel``) and for the plan (``StepModel``). Plain frozen data,
built by ``steps.derive`` and read by the encodings, the replays and the reports (which import
them from ``steps``)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..diagnostics import NO_SPAN, Span
from . import actflow as _actflow
from . import buckets as _buckets
from . import checkpoint as ckpt
from . import identity as _identity
from . import rng as _rng
from .dims import MICROBATCHES, TOKEN, GradDim


@dataclass(frozen=True)
class GroupModel:
    group: str
    dims: tuple[GradDim, ...]
    norm_dims: tuple[str, ...]  # token dims the loss normaliser (token count) is summed over
    divisor_axes: tuple[str, ...]  # divisor = product of these sizes ...
    divisor_value: ir.Value | None  # ... or this value, when an override gives one
    shard_axes: tuple[str, ...]  # mesh axes over which the stored gradient is sharded
    double_count: bool = False  # counted twice in the global grad norm
    span: Span = NO_SPAN  # where the behaviour comes from (override or binding)
    spans: tuple[tuple[str, Span], ...] = ()  # per GI aspect (dimension or NORMALISATION): its source
    clip_axes: tuple[str, ...] | None = None  # axes this group's squared norm is summed over (None: the plan's)
    clip_span: Span = NO_SPAN
    # axes of clip_axes over which the group's copies (it is replicated there) are counted on one rank only:
    # the duplicate filter of a model-parallel norm, derived on every replicated axis of the derived
    # reduction, or stated (`override clip_norm[g]: dedupe over (...)`) beside a stated `reduce over`
    clip_filter: tuple[str, ...] = ()
    clip_filter_stated: bool = False  # the filter is stated by an override (else derived)
    clip_filter_span: Span = NO_SPAN  # the stated filter's override
    objective: str = "mean"  # "mean": the global token mean; "sum": the sum over tokens (loss: sum)
    # a loss term's path (check.losses): "count" divides by its count (over norm_dims, else the local cell's) whatever
    # the objective, "none" takes no count (loss[T]: sum); "": as the objective implies (the main loss)
    path_count: str = ""
    clip_agg: str = "sum"  # how the ranks' squared norms are combined over clip_axes: sum | average | max (clipagg)
    clip_sqrt: bool = False  # each rank's root taken before the reduction (clip_norm: sqrt_before_reduce)
    clip_rank0: tuple[str, ...] = ()  # axes of clip_axes where the group is counted on rank 0 only (perrank)
    clip_rank0_span: Span = NO_SPAN
    # (axis, ranks): axes of clip_axes where the group is counted on the named ranks only (rankcount)
    clip_ranks: tuple = ()
    clip_ranks_span: Span = NO_SPAN
    # axes of its norm reduction over which the group's copied kv heads are each counted (no filter: check.kvnorm)
    clip_copies: tuple[str, ...] = ()
    clip_copies_span: Span = NO_SPAN
    undecided: str = ""  # a fact the step model lacks to decide this group's gradient (its obligations: unknown)
    replicated_params: tuple[str, ...] = ()  # mesh axes over which the group's params are whole copies

    def span_of(self, aspect: str) -> Span:
        return dict(self.spans).get(aspect, NO_SPAN)

    def dim(self, name: str) -> GradDim:
        for d in self.dims:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def token_dims(self) -> tuple[GradDim, ...]:
        return tuple(d for d in self.dims if d.kind == TOKEN)


@dataclass(frozen=True)
class StepModel:
    plan: str
    axes: tuple[str, ...]  # mesh axes in order
    roles: tuple[tuple[str, str], ...]  # (axis, role)
    groups: tuple[GroupModel, ...]
    loss: str  # global_mean | per_device_mean | per_microbatch_mean
    loss_span: Span
    clip_axes: tuple[str, ...]  # axes the squared grad norm is summed over (repetition = twice)
    clip_span: Span
    overflow_axes: tuple[str, ...]
    overflow_span: Span
    seed_vary: tuple[str, ...]  # axes the dropout seed of the residual region varies over
    seed_span: Span
    tensor_axes: tuple[str, ...]
    sequence_parallel: bool
    sp_span: Span
    regather_axes: tuple[str, ...]  # axes the updated params are all-gathered over after the step
    regather_needed: tuple[str, ...]  # axes where params are R but the optimizer is sharded
    regather_span: Span
    gather_axes: tuple[str, ...]  # axes S* params are gathered over before use
    gather_span: Span
    param_modes: tuple[tuple[str, str], ...]  # (axis, mode) of params
    offloaded: bool  # params resident off-device
    fetch: bool  # an offloaded param is fetched before use
    fetch_span: Span
    grads_sharded_data: tuple[str, ...]  # data axes with S/M/O grads
    accumulation_buffer: bool
    accumulation_span: Span
    pipelined: bool
    axis_bindings: tuple[tuple[str, tuple[str, ...]], ...]  # axis -> strategies bound to it
    tied: bool
    pipeline_axes: tuple[str, ...]
    expert_axes: tuple[str, ...]
    data_axes: tuple[str, ...]
    context_axes: tuple[str, ...]
    plan_span: Span = NO_SPAN
    microbatch_symbol: str | None = None  # the let symbol the model's microbatches is, if any
    unusable_axes: tuple[str, ...] = ()  # data/context axes with params S: never reassembled for the forward
    gather_counts: tuple[tuple[str, int], ...] = ()  # (axis, gathers before each use) for every S* axis of params
    optimizer_mismatch: tuple[str, ...] = ()  # axes with grads sharded and the optimizer state replicated
    grads_split_axes: tuple[str, ...] = ()  # axes over which the gradients are sharded or streamed (S, S*, M, O)
    grads_span: Span = NO_SPAN
    optimizer_span: Span = NO_SPAN
    params_span: Span = NO_SPAN
    equal_tokens: bool = False  # `override tokens: equal`: every device and microbatch has the same count
    # `override loss: on_gathered_sequence over (AXES)`: the axes whose ranks count the whole sequence (check.gathered)
    gathered_axes: tuple[str, ...] = ()
    # (aspect, axis, group, span): an obligation a group's own modes cause ("optimizer", "regather",
    # "gather", "usable"), reported at the group's line
    group_sources: tuple[tuple[str, str, str, Span], ...] = ()
    gather_unsharded: tuple[str, ...] = ()  # axes params are gathered over where they are not sharded
    checkpoint: ckpt.CheckpointModel | None = None  # save, load and reshard (``override checkpoint``), if stated
    identity: _identity.IdentityModel = _identity.IdentityModel()  # initial params and the optimizer's tensors
    rng: _rng.RngModel = _rng.RngModel()  # the RNG state per rank and region
    actflow: _actflow.ActModel = _actflow.ActModel()  # activations and their gradients per layer region
    buckets: _buckets.BucketModel = _buckets.BucketModel()  # flat gradient buffers laid out differently per rank

    def size_aliases(self) -> dict[str, str]:
        """Symbols that name a size of the step: the model's microbatches symbol."""
        return {self.microbatch_symbol: MICROBATCHES} if self.microbatch_symbol else {}

    def group(self, name: str) -> GroupModel:
        for g in self.groups:
            if g.group == name:
                return g
        raise KeyError(name)

    def role(self, axis: str) -> str:
        return dict(self.roles).get(axis, "")
