"""Per-device memory of one plan: persistent and transient terms, device and host.

Input: an ``ir.Plan``, its ``Shape`` and ``Activations``. Output: ``Memory`` with, per
state, the persistent bytes on the device and on the host, the named transient terms
(gathered reconstruction units × prefetch, gradient bucket, recomputation working set,
host staging buffer) and the totals; every value an exact sympy expression.

Persistent bytes of a state = full size × Π over axes of 1/n where the state is S, S* or
O, held on the host when the placement is offloaded (residency host/nvme, or O on an
axis). A state that is M on some axis has no persistent copy. Activations come from the
activation model (already per device). Peak device memory = persistent + all transients.

With a pipeline axis and a transformer shape, the first and the last stage are accounted
separately (``Memory.stages``): the first holds L/p layers and the token embedding, the
last L/p layers, the final norm and the output projection (a copy of the embedding when
tied); their activations follow the schedule's in-flight counts. The plan's per-state
terms are then the maximum over the stages and the peak is the maximum of the stage
totals. Without a shape every stage holds Ψ/p, as a note says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from .. import ir
from ..ir import Mode, Role, State, views
from ..ir import groups as pg
from ..ir.collectives import is_offloaded, pipeline_axis, sharded_axes
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import buckets
from .activations import Activations
from .sizes import Shape, SizedGroup, Split, divided, layer_divided, per_group
from .symbolic import peak, symbol, to_sympy

ZERO = sympy.Integer(0)


def host_peak(states: sympy.Expr, rule: tuple) -> sympy.Expr:
    """Host bytes per device under ``conventions { host_construction, host_buffer_factor }``: the
    larger of what building the model takes and the offloaded states, times the buffer factor
    (DeepSpeed's estimators: 1.5); the offloaded states alone by default."""
    construction, factor = rule
    held = states if construction is None else peak(construction, states)
    return held if factor == 1 else factor * held


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's device: persistent terms per state and the (shared) transients."""

    stage: str  # "first" | "last"
    device: dict  # State -> persistent bytes on the device
    host: dict  # State -> persistent bytes on the host
    transient: dict  # term name -> bytes on the device
    host_rule: tuple = (None, sympy.Integer(1))  # (construction bytes or None, buffer factor): see host_peak

    @property
    def transient_total(self) -> sympy.Expr:
        return sympy.Add(*self.transient.values())

    @property
    def device_total(self) -> sympy.Expr:
        return sympy.Add(*self.device.values()) + self.transient_total

    @property
    def host_total(self) -> sympy.Expr:
        return host_peak(sympy.Add(*self.host.values()), self.host_rule)

    @property
    def model_state(self) -> sympy.Expr:
        return sum((self.device[s] for s in (State.PARAMS, State.OPTIMIZER, State.GRADS)), ZERO)


@dataclass(frozen=True)
class Memory:
    """Per-state terms (the maximum over ``stages`` when there are stages) and the totals.

    Without stages the peak is the sum of the terms; with stages it is the maximum of the
    stage totals, so the per-state maxima need not add up to it.
    """

    device: dict  # State -> persistent bytes on the device
    host: dict  # State -> persistent bytes on the host
    transient: dict  # term name -> bytes on the device
    notes: tuple[str, ...] = field(default=())
    stages: tuple[StageMemory, ...] = ()
    groups: dict = field(default_factory=dict)  # parameter group -> state -> persistent bytes (device + host)
    # on a stage that holds the group (the first stage for groups in the layers)
    host_rule: tuple = (None, sympy.Integer(1))  # (construction bytes or None, buffer factor): see host_peak

    @property
    def transient_total(self) -> sympy.Expr:
        return sympy.Add(*self.transient.values())

    @property
    def device_total(self) -> sympy.Expr:
        if self.stages:
            return peak(*(st.device_total for st in self.stages))
        return sympy.Add(*self.device.values()) + self.transient_total

    @property
    def host_total(self) -> sympy.Expr:
        if self.stages:
            return peak(*(st.host_total for st in self.stages))
        return host_peak(sympy.Add(*self.host.values()), self.host_rule)

    @property
    def model_state(self) -> sympy.Expr:
        if self.stages:
            return peak(*(st.model_state for st in self.stages))
        return sum((self.device[s] for s in (State.PARAMS, State.OPTIMIZER, State.GRADS)), ZERO)


def shard_factor(plan: ir.Plan, state: State, skip: tuple[str, ...] = ()) -> sympy.Expr:
    """Π 1/n over the axes on which the state is divided (S, S*, O), except ``skip``."""
    pl = plan.placement(state)
    f = sympy.Integer(1)
    for axis, mode in pl.modes:
        if mode.shards and axis not in skip:
            f = f / symbol(axis)
    return f


def group_axes(plan: ir.Plan, st: State, skip: tuple[str, ...] = ()):
    """Per group: the axes over which the group's copy of state ``st`` is divided (S, S*, O),
    the group's own modes in place of the plan's, except ``skip``."""
    pl = plan.placement(st)

    def axes_of(g: SizedGroup) -> tuple[str, ...]:
        eff = views.effective(plan, pl, g.group, dense_as_data=True)
        return tuple(a for a, m in eff.modes if m.shards and a not in skip)
    return axes_of


def _unit_params(plan: ir.Plan, sh: Shape, pl: ir.Placement, split: Split, axes: tuple[str, ...],
                 notes: list[str]) -> sympy.Expr | None:
    """Parameters per device in one reconstruction unit once divided over ``axes`` (None when
    the shape does not say)."""
    if pl.unit == "model":
        return divided(sh, axes, split)
    if pl.unit == "chunk":
        pp = plan.schedule.axis if plan.schedule is not None else None
        v = plan.schedule.chunks if plan.schedule is not None else ir.const(1)
        return divided(sh, axes, split) / ((symbol(pp) if pp else 1) * to_sympy(v))
    if sh.layer_params is None:
        notes.append(f"{pl.state.value}: no transformer shape, so the per-{pl.unit} working set is not modelled")
        return None
    return layer_divided(sh, axes, split)


def _persistent(plan: ir.Plan, sh: Shape, st: State, stage: str | None, split: Split
                ) -> tuple[dict, dict]:
    """Per group, (device, host) persistent bytes of a model state, on one stage or (None) the
    uniform split."""
    pl = plan.placement(st)
    pipe = pipeline_axis(plan)
    split = replace(split, dense_data=True)
    # M (streamed, held only transiently) on some axis, by the plan or by a group's own modes
    transient = {g.name for g in sh.groups if pg.effective(pl, g.group).axes_with(Mode.M)}
    if len(transient) == len(sh.groups):
        by_group = {g.name: ZERO for g in sh.groups}
    elif stage is not None and pipe is not None:
        p = sympy.Integer(1) if _one(plan, pipe) else symbol(pipe)  # one stage: it holds both ends
        by_group = per_group(sh, (), split, stage=stage, p=p, axes_of=group_axes(plan, st, skip=(pipe,)))
    else:
        by_group = per_group(sh, (), split, axes_of=group_axes(plan, st))
    if st is State.GRADS and _keeps_whole(plan):  # the whole buffer beside its reduced shard
        skip = views.view(plan).axes_with_role(Role.DATA, Role.CONTEXT)
        if stage is not None and pipe is not None:
            whole = per_group(sh, (), split, stage=stage, p=sympy.Integer(1) if _one(plan, pipe) else symbol(pipe),
                              axes_of=group_axes(plan, st, skip=skip + (pipe,)))
        else:
            whole = per_group(sh, (), split, axes_of=group_axes(plan, st, skip=skip))
        by_group = {k: v + whole[k] if whole[k] != v else v for k, v in by_group.items()}
    if st is State.OPTIMIZER and plan.optimizers:  # each group's own algorithm (costs.optimizer)
        from .optimizer import state_bytes

        by_group = {k: ZERO if k in transient else state_bytes(plan, sh, k, v) for k, v in by_group.items()}
    else:
        by_group = {k: ZERO if k in transient else sh.bytes[st] * v for k, v in by_group.items()}
    zero = {k: ZERO for k in by_group}
    return (zero, by_group) if is_offloaded(plan, st) else (by_group, zero)


def _keeps_whole(plan: ir.Plan) -> bool:
    """``override grads: reduce_accumulated_every_microbatch``: the local buffer is never cleared within
    the step, so a rank whose gradient is sharded over a data axis holds the whole buffer beside the
    shard its reductions are added into."""
    return any(o.verb == OverrideVerb.REDUCE_ACCUMULATED_EVERY_MICROBATCH and o.group in (None, "all")
               for o in plan.overrides_for(OverrideTarget.GRADS))


def _one(plan: ir.Plan, axis: str) -> bool:
    """An axis whose size is the number 1: nothing is gathered or scattered over it."""
    size = plan.mesh.axis(axis).size
    return isinstance(size, ir.Const) and size.value == 1


def _sum(d: dict) -> sympy.Expr:
    return sum(d.values(), ZERO)


def _persistent_terms(plan: ir.Plan, sh: Shape, act: Activations, split: Split) -> tuple[dict, dict, list, dict]:
    """The persistent bytes on the device and on the host per state (the larger stage), the stages'
    own terms, and each group's device bytes per state."""
    device: dict = {}
    host: dict = {}
    stage_terms = []
    groups: dict = {}  # group -> state -> device bytes (the larger stage)
    stage_groups = []
    for sa in act.stages:
        d, h, gd = {}, {}, {}
        for st in (State.PARAMS, State.OPTIMIZER, State.GRADS):
            dg, hg = _persistent(plan, sh, st, sa.stage, split)
            d[st], h[st] = _sum(dg), _sum(hg)
            gd[st] = dg
        d[State.ACTIVATIONS], h[State.ACTIVATIONS] = sa.total, ZERO
        stage_terms.append((sa.stage, d, h))
        stage_groups.append(gd)
    for st in (State.PARAMS, State.OPTIMIZER, State.GRADS):
        if stage_terms:
            device[st] = peak(*(d[st] for _, d, _ in stage_terms))
            host[st] = peak(*(h[st] for _, _, h in stage_terms))
            for gd in stage_groups:  # a group on one stage only appears there; layers are alike on all
                for name, v in gd[st].items():
                    groups.setdefault(name, {}).setdefault(st, v)
        else:
            dg, hg = _persistent(plan, sh, st, None, split)
            device[st], host[st] = _sum(dg), _sum(hg)
            for name in dict.fromkeys([*dg, *hg]):
                groups.setdefault(name, {})[st] = dg.get(name, ZERO) + hg.get(name, ZERO)
    return device, host, stage_terms, groups


def _notes(plan: ir.Plan, sh: Shape, split: Split) -> list[str]:
    """The notes on parameter groups of their own modes, on optimizers, and on a model without a shape."""
    notes: list[str] = []
    own = [g.name for g in sh.groups if g.group.modes]
    if own:
        notes.append(f"parameter group{'s' if len(own) > 1 else ''} {', '.join(own)}: the memory and the "
                     f"collectives of {'their' if len(own) > 1 else 'its'} buffers follow "
                     f"{'their' if len(own) > 1 else 'its'} own modes")
    if plan.optimizers:
        from .optimizer import notes as optimizer_notes

        notes += optimizer_notes(plan, sh, split)
    if not sh.has_shape:
        notes.append("activations: no transformer shape, so activation memory is not modelled")
        if pipeline_axis(plan) is not None:
            notes.append("pipeline: no transformer shape, so every stage is taken to hold Ψ/p of the parameters "
                         "(no embedding or output layer on the first or last stage)")
    return notes


def _gathered_params(plan: ir.Plan, sh: Shape, split: Split, star: tuple, pipe: tuple, transient: dict,
                     notes: list[str]) -> None:
    """The parameters gathered (or fetched) for compute: a unit × prefetch, DeepSpeed's window, or
    the whole gathered model kept from forward to backward."""
    th = plan.placement(State.PARAMS)
    # the gathered (or fetched) unit is full size on the gathered axes only; a layer or
    # chunk is not divided by the pipeline axis (stages split the model by layers)
    gathered = star if star else th.axes_with(Mode.O)
    if star and not th.reshard_after_forward and not is_offloaded(plan, State.PARAMS):
        rest = tuple(a for a in sharded_axes(plan, State.PARAMS) if a not in gathered)
        transient["gathered params (kept from forward to backward)"] = (
            sh.bytes[State.PARAMS] * divided(sh, rest, split)
        )
        return
    skip = gathered + (pipe if th.unit != "model" else ())
    rest = tuple(a for a in sharded_axes(plan, State.PARAMS) if a not in skip)
    unit = _unit_params(plan, sh, th, split, rest, notes)
    ds = buckets.settings(plan.model, True) if star else None
    if unit is not None and ds is not None and th.unit in ("layer", "block"):
        whole = tuple(a for a in sharded_axes(plan, State.PARAMS) if a not in gathered)
        window = buckets.gathered_window(ds, unit, divided(sh, whole, split))
        transient["gathered params (DeepSpeed's window: unit, reused and prefetched)"] = (
            window * sh.bytes[State.PARAMS])
        kept, names = buckets.persisted(ds, sh, split, whole, gathered, notes)
        if names:
            transient[f"persisted params ({', '.join(names)}: whole, param_persistence_threshold)"] = (
                kept * sh.bytes[State.PARAMS])
    elif unit is not None:
        label = "fetched" if is_offloaded(plan, State.PARAMS) and not star else "gathered"
        transient[f"{label} params ({th.unit} × prefetch {th.prefetch})"] = (
            unit * sh.bytes[State.PARAMS] * th.prefetch
        )


def _gradient_bucket(plan: ir.Plan, sh: Shape, split: Split, sized: bool, star: tuple, pipe: tuple,
                     transient: dict, notes: list[str]) -> None:
    """The buffer gradients are reduced in: DeepSpeed's ZeRO buckets, or one layer before a reduce-scatter."""
    g = plan.placement(State.GRADS)
    reducing = views.view(plan).axes_with_role(Role.DATA, Role.CONTEXT)
    scattered = tuple(a for a in reducing if g.mode(a) in (Mode.S, Mode.S_STAR, Mode.M, Mode.O)
                      and not (sized and _one(plan, a)))
    zero = [a for a in views.view(plan).axes_with_role(Role.DATA) if not (sized and _one(plan, a)) and any(
        plan.placement(st).mode(a) is not Mode.R for st in (State.OPTIMIZER, State.GRADS))]
    ds = buckets.settings(plan.model, bool(star)) if zero else None
    if ds is not None:  # DeepSpeed's ZeRO optimizer (stages 1-3) reduces in buckets of its own
        count = buckets.reduce_buffers(ds, bool(star))
        transient[f"gradient reduction bucket (reduce_bucket_size{' × 2, overlap_comm' if count == 2 else ''})"] = (
            count * ds["reduce_bucket_size"] * sh.bytes[State.PARAMS])
    elif scattered:
        rest = tuple(a for a in sharded_axes(plan, State.GRADS) if a not in scattered + pipe)
        unit = _unit_params(plan, sh, ir.Placement(State.GRADS, g.modes, unit="layer"), split, rest, notes)
        if unit is not None:
            transient["gradient bucket (one layer, before reduce-scatter)"] = unit * sh.bytes[State.GRADS]


def _allowances(plan: ir.Plan, sh: Shape, act: Activations, device: dict, stage_terms: list,
                transient: dict) -> None:
    """Recomputation, the loss's backward, optimizer updates, and the conventions' allowances."""
    if act.transient != 0:
        transient["recomputation working set (one layer)"] = act.transient
    if act.loss_backward != 0:
        transient["loss backward (the gradients of the log-probabilities and of the logits)"] = act.loss_backward
    if plan.optimizers:  # a whole-matrix update assembles each gathered matrix (costs.optimizer)
        from .optimizer import transient as optimizer_transient

        transient.update(optimizer_transient(plan, sh))
    # accounting conventions (conventions { reserve, reserve_fraction }): what the runtime and the
    # allocator take beside the training state; 0 unless the spec states them
    frac = to_sympy(plan.model.reserve_fraction)
    if frac != 0:
        rest = peak(*(sympy.Add(*d.values()) for _, d, _ in stage_terms)) if stage_terms else \
            sympy.Add(*device.values())
        transient["allocator allowance (reserve_fraction × the rest)"] = frac * (rest + sympy.Add(*transient.values()))
    reserve = to_sympy(plan.model.reserve)
    if reserve != 0:
        transient["runtime reserve (CUDA context and the like)"] = reserve


def memory(plan: ir.Plan, sh: Shape, act: Activations, split: Split | None = None, sized: bool = False) -> Memory:
    split = split or Split()
    device, host, stage_terms, groups = _persistent_terms(plan, sh, act, split)
    transient: dict = {}
    notes = _notes(plan, sh, split)
    device[State.ACTIVATIONS] = act.total
    host[State.ACTIVATIONS] = ZERO
    th = plan.placement(State.PARAMS)
    pipe = views.view(plan).axes_with_role(Role.PIPELINE)
    star = tuple(a for a in th.axes_with(Mode.S_STAR) if not (sized and _one(plan, a)))
    if star or is_offloaded(plan, State.PARAMS):
        _gathered_params(plan, sh, split, star, pipe, transient, notes)
    _gradient_bucket(plan, sh, split, sized, star, pipe, transient, notes)
    _allowances(plan, sh, act, device, stage_terms, transient)
    model = plan.model
    construction = 4 * sh.psi if model.host_construction_model else \
        to_sympy(model.host_construction) if model.host_construction is not None else None
    rule = (construction, to_sympy(model.host_buffer_factor))
    stages = tuple(StageMemory(name, d, h, transient, rule) for name, d, h in stage_terms)
    return Memory(device, host, transient, tuple(dict.fromkeys(notes)), stages, groups, rule)
