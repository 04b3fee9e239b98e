"""Checkpoint save, load and reshard as transitions of the step: which rank writes which state.

Input: a plan, its parameter groups (``steps.GroupModel``), the collective schedule and the
axes where params are replicated over a sharded optimizer. Output: a ``CheckpointModel``
(plain frozen data): for every group, state (params, optimizer) and mesh axis whether the
state is sharded there and which ranks of the axis write it; the groups whose optimizer
state is not written; whether the params are re-gathered from the loaded master shards;
the axes the checkpoint is resumed over with a new size and the groups whose shards are
then read by rank index; the states laid out in blocks along an axis (a fused tensor's components
over a tensor axis, an interleaved pipeline's virtual stages over the pipeline axis) and those
keyed by a flat offset; whether the per-rank RNG state is saved per rank. The *derived*
model writes a sharded state from every rank (each its shard) and a replicated one from
rank 0 of the axis (its replica id 0), re-gathers after a load, remaps every shard by its
global offset on a new mesh (block by block where a state is laid out in blocks), and saves
the RNG state of every rank whose seed differs (``rng_not_restored``: none put back after the load).
``override checkpoint[GROUP]: VERB`` statements replace parts of it (docs/semantics.md,
'Checkpoints').
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import ir
from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir import groups as pg
from ..ir import views
from ..ir.overrides import OverrideVerb
from ..ir.values import Const
from .dims import SHARDED, TENSOR_ROLES

TARGET = "checkpoint"
STATES = ("params", "optimizer")
SAVE_VERBS = ("save_from", "save_rank0")  # every rank of the axes writes; rank 0 of the axes only writes
PLAN_WIDE = ("resume", "reshard", "no_regather_after_load", "rng_shared", "rng_not_restored",
             "rng_by_coordinates")  # verbs that take no [group]


@dataclass(frozen=True)
class Layout:
    group: str
    state: str  # params | optimizer
    axis: str
    sharded: bool  # each rank of the axis holds its own part (else every rank a replica)
    writes_all: bool  # every rank of the axis writes it (else rank 0, replica id 0, only)
    span: Span = NO_SPAN  # the override that states the writers, or none

    @property
    def fault(self) -> str:
        """'lost' (shards of ranks other than 0 never written), 'duplicated' (every replica
        written) or '' (each element written once)."""
        if self.sharded and not self.writes_all:
            return "lost"
        if self.writes_all and not self.sharded:
            return "duplicated"
        return ""


@dataclass(frozen=True)
class CheckpointModel:
    span: Span  # the first checkpoint statement of the plan
    layouts: tuple[Layout, ...]
    skipped: tuple[tuple[str, Span], ...] = ()  # groups whose optimizer state is not written
    regather_needed: tuple[str, ...] = ()  # axes with params replicated over a sharded optimizer (master copy)
    regather_after_load: bool = True
    regather_span: Span = NO_SPAN
    reshard_axes: tuple[str, ...] = ()  # axes the checkpoint is loaded on with a new size
    reshard_span: Span = NO_SPAN
    by_rank: tuple[tuple[str, str, Span], ...] = ()  # (group, axis, span): shards read by rank index, not remapped
    rng_vary: tuple[str, ...] = ()  # axes the per-rank RNG state (dropout seed) differs over
    rng_shared: bool = False  # one RNG state saved (rank 0's) and restored on every rank
    rng_not_restored: bool = False  # no generator restored: every rank's stream restarts at its seed, offset 0
    rng_by_coordinates: bool = False  # on a new size, new rank r' reads the stream of the old rank of its coordinates
    rng_span: Span = NO_SPAN
    # a fact the transition lacks to decide who writes (its save and reshard obligations: unknown)
    undecided: str = ""
    # (group, axis, C, span): the state along the axis is C blocks, each split over the axis (rank r holds its
    # piece of every block): a fused tensor's components, an interleaved pipeline's virtual stages
    blocks: tuple[tuple[str, str, int, Span], ...] = ()
    flat: tuple[tuple[str, str, Span], ...] = ()  # (group, axis, span): keyed by the rank's flat offset
    virtual_axis: str = ""  # the pipeline axis whose blocks are an interleaved schedule's virtual stages
    keys_undecided: str = ""  # a fact the keys of a block layout lack (its reshard obligation: unknown)

    def block_count(self, group: str, axis: str) -> int:
        return next((c for g, a, c, _ in reversed(self.blocks) if g == group and a == axis), 1)

    def flat_faults(self) -> tuple[tuple[Layout, int], ...]:
        """Sharded states over a resharded axis, in C >= 2 blocks there, keyed by a flat offset."""
        keyed = {(g, a) for g, a, _ in self.flat}
        return tuple((lay, self.block_count(lay.group, lay.axis)) for lay in self.layouts
                     if lay.sharded and lay.axis in self.reshard_axes and (lay.group, lay.axis) in keyed
                     and self.block_count(lay.group, lay.axis) >= 2)

    def rng_resharded(self) -> tuple[str, ...]:
        """The resharded axes the dropout seed varies over (where reading streams by coordinates matters)."""
        return tuple(a for a in self.reshard_axes if a in self.rng_vary)

    def flat_span(self, group: str, axis: str) -> Span:
        return next((sp for g, a, sp in self.flat if g == group and a == axis), NO_SPAN)

    def save_faults(self) -> tuple[Layout, ...]:
        return tuple(lay for lay in self.layouts if lay.fault)

    def reshard_faults(self) -> tuple[Layout, ...]:
        """Sharded states over a resharded axis that are read by rank index."""
        bad = {(g, a) for g, a, _ in self.by_rank}
        return tuple(lay for lay in self.layouts if lay.sharded and lay.axis in self.reshard_axes
                     and (lay.group, lay.axis) in bad)

    def by_rank_span(self, group: str, axis: str) -> Span:
        return next((sp for g, a, sp in self.by_rank if g == group and a == axis), NO_SPAN)


def _err(code: str, msg: str, span: Span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span)])


def _applies(o: ir.Override, group: str) -> bool:
    return o.group in (None, "all", group)


def sharded(plan: ir.Plan, g, mode: ir.Mode, axis: str) -> bool:
    """Whether a group's state with ``mode`` over ``axis`` is split there: on a tensor axis the
    group's own dimension says (a norm or bias is a replica on every tensor rank), elsewhere the mode."""
    if views.view(plan).role(axis) in TENSOR_ROLES:
        return any(d.axis == axis and d.kind == SHARDED and not d.part for d in g.dims)
    return mode.shards


def derive(plan: ir.Plan, groups, colls, regather_needed: tuple[str, ...],
           seed_vary: tuple[str, ...]) -> CheckpointModel | None:
    """The checkpoint transition of ``plan``, or None when no statement asks for one."""
    ovs = [o for o in plan.overrides if o.target == TARGET]
    if not ovs:
        return None
    for o in ovs:
        if o.verb in PLAN_WIDE and o.group is not None:
            raise _err(Code.CHECKPOINT_PLAN_WIDE, f"override checkpoint[{o.group}]: {o.verb} is plan-wide: it takes no [group]", o.span)
    layouts = []
    for g in groups:
        cls = pg.class_of(plan.model, g.group)
        cv = views.class_view(plan, cls, colls)
        for state, pl in (("params", cv.params), ("optimizer", cv.optimizer)):
            for a, m in pl.modes:
                sh = sharded(plan, g, m, a)
                save = next((o for o in reversed(ovs) if o.verb in SAVE_VERBS and _applies(o, g.group)
                             and a in (o.axes or ())), None)
                writes = sh if save is None else save.verb == OverrideVerb.SAVE_FROM
                layouts.append(Layout(g.group, state, a, sh, writes, save.span if save else NO_SPAN))
    undecided = _copied_heads(groups, ovs)
    skipped = tuple((g.group, o.span) for g in groups for o in ovs
                    if o.verb == OverrideVerb.SKIP_OPTIMIZER and _applies(o, g.group))
    last = {o.verb: o for o in ovs}
    reshard = last.get("reshard")
    by_rank = tuple((g.group, a, o.span) for o in ovs if o.verb == OverrideVerb.LOAD_BY_RANK for g in groups
                    if _applies(o, g.group) for a in o.axes or ())
    model = CheckpointModel(
        span=ovs[0].span, layouts=tuple(layouts), skipped=tuple(dict.fromkeys(skipped)),
        regather_needed=regather_needed,
        regather_after_load="no_regather_after_load" not in last,
        regather_span=last["no_regather_after_load"].span if "no_regather_after_load" in last else NO_SPAN,
        reshard_axes=tuple(dict.fromkeys(reshard.axes or ())) if reshard else (),
        reshard_span=reshard.span if reshard else NO_SPAN,
        by_rank=by_rank, rng_vary=seed_vary, rng_shared="rng_shared" in last,
        rng_not_restored="rng_not_restored" in last, rng_by_coordinates="rng_by_coordinates" in last,
        rng_span=_rng_span(last), undecided=undecided)
    blocks, flat, why = _blocks(plan, groups, ovs, layouts)
    if blocks or flat:
        model = replace(model, blocks=blocks, flat=flat, virtual_axis=plan.schedule.axis if plan.schedule else "",
                        keys_undecided=why or _copied_heads(groups, ovs, (OverrideVerb.FUSED, OverrideVerb.FLAT_OFFSET)))
    _no_effect(model, ovs)  # (a group the plan does not have: PL506, wellformed.no_effect)
    return model


def _rng_span(last: dict) -> Span:
    """The statement of how the RNG states are put back (a generator not restored first: it decides)."""
    o = last.get("rng_not_restored") or last.get("rng_by_coordinates") or last.get("rng_shared")
    return o.span if o else NO_SPAN


def _count(v) -> int | None:
    """A whole number of blocks (at least 2) written as a constant, else None."""
    if isinstance(v, Const) and v.value.denominator == 1 and v.value >= 2:
        return int(v.value)
    return None


def _blocks(plan: ir.Plan, groups, ovs: list[ir.Override], layouts: list[Layout]):
    """The block layouts (fused statements; an interleaved schedule's v chunks on the pipeline axis),
    the flat-offset keys, and a fact the transition lacks (a symbolic v under a flat offset)."""
    blocks, why = [], ""
    sched = plan.schedule
    if sched is not None and any(lay.sharded and lay.axis == sched.axis for lay in layouts):
        v = _count(sched.chunks)
        if v is not None:
            blocks += [(g.group, sched.axis, v, sched.span) for g in groups]
        elif not (isinstance(sched.chunks, Const) and sched.chunks.value == 1):
            why = (f"the virtual stages per rank of {sched.axis} are a symbol; whether the layers a flat offset "
                   "keys are interleaved is not in the checkpoint model; the missing fact: v")
    for o in ovs:
        if o.verb != OverrideVerb.FUSED:
            continue
        head = f"override checkpoint{f'[{o.group}]' if o.group else ''}: fused"
        c = _count(o.by)
        if c is None:
            raise _err(Code.CHECKPOINT_FUSED_COUNT, f"{head} needs `by C`, C a whole number of components of at "
                       "least 2 (Q, K, V: 3; gate, up: 2)", o.span)
        off = next((a for a in o.axes or () if views.view(plan).role(a) not in TENSOR_ROLES), None)
        if off is not None or not o.axes:
            raise _err(Code.CHECKPOINT_FUSED_AXIS, f"{head} over ({off or ''}): fused components are columns a "
                       "tensor axis splits; name the tensor axes (a pipeline's virtual stages come from its schedule)",
                       o.span)
        blocks += [(g.group, a, c, o.span) for g in groups if _applies(o, g.group) for a in o.axes]
    flat = tuple((g.group, a, o.span) for o in ovs if o.verb == OverrideVerb.FLAT_OFFSET for g in groups
                 if _applies(o, g.group) for a in o.axes or ())
    flat_axes = {a for _, a, _ in flat}
    return tuple(blocks), flat, why if sched is not None and sched.axis in flat_axes else ""


def _copied_heads(groups, ovs: list[ir.Override], verbs: tuple[str, ...] = SAVE_VERBS + ("load_by_rank",)) -> str:
    """A statement about the writers or readers of a group whose kv heads are copied on several
    ranks of a named tensor axis: each head is one element per copy group, neither sharded nor
    replicated over the axis, which the transition does not model."""
    for o in ovs:
        if o.verb not in verbs:
            continue
        what = "how each copy is keyed" if o.verb in (OverrideVerb.FUSED, OverrideVerb.FLAT_OFFSET) else "who writes which copy"
        fact = "the copy groups' keys" if what.startswith("how") else "the copy groups' writers"
        for g in groups:
            d = next((d for d in g.dims if d.part and _applies(o, g.group)
                      and any(a in (o.axes or ()) for a in (d.axis, *dict(d.joint)))), None)
            if d is not None and d.joint:  # copy groups crossing the tensor axes (check.kvjoint)
                names = "×".join(a for a, _ in d.joint)
                return (f"the {d.heads} kv heads of {g.group} are copied on runs of the joint index of {names}; "
                        f"{what} under `checkpoint: {o.verb} over ({', '.join(o.axes or ())})` is not in the "
                        f"checkpoint model; the missing fact: {fact}")
            if d is not None:
                return (f"the {d.heads} kv heads of {g.group} are copied on {d.axis}/{d.heads} ranks each; {what} "
                        f"under `checkpoint: {o.verb} over ({d.axis})` is not in the checkpoint model; the "
                        f"missing fact: {fact}")
    return ""


def _no_effect(model: CheckpointModel, ovs: list[ir.Override]) -> None:
    """A checkpoint statement the transition cannot read is an error, not a silent no-op (PL506)."""
    for o in ovs:
        head = f"override checkpoint{f'[{o.group}]' if o.group else ''}: {o.verb}"
        why = ""
        if o.verb == OverrideVerb.NO_REGATHER_AFTER_LOAD and not model.regather_needed:
            why = "no axis holds replicated params over a sharded optimizer, so a load has nothing to re-gather"
        elif o.verb == OverrideVerb.RNG_SHARED and not model.rng_vary:
            why = "the dropout seed varies over no axis, so every rank's RNG state is the same"
        elif o.verb == OverrideVerb.RNG_BY_COORDINATES and not model.rng_resharded():
            why = _coordinates_no_effect(model)
        elif o.verb == OverrideVerb.LOAD_BY_RANK:
            off = [a for a in o.axes or () if a not in model.reshard_axes]
            whole = [a for a in o.axes or () if not any(lay.sharded and lay.axis == a and (lay.group, a, o.span)
                                                        in model.by_rank for lay in model.layouts)]
            if off:
                why = (f"the checkpoint is resumed on a new size of ({', '.join(model.reshard_axes)}) only, not of "
                       f"{off[0]}: on the same size reading by rank index is the derived load "
                       "(state `override checkpoint: reshard over (...)`)")
            elif whole and not model.undecided:
                why = (f"no state it names is sharded over {whole[0]}: every rank reads a replicated state whole, "
                       "by rank index or not")
        elif o.verb in (OverrideVerb.FUSED, OverrideVerb.FLAT_OFFSET) and not model.keys_undecided:
            why = _no_block_effect(model, o)
        elif o.verb in SAVE_VERBS and not model.undecided:
            mine = [lay for lay in model.layouts if lay.span == o.span]
            if mine and not any(lay.fault for lay in mine):
                why = ("every state it applies to is already written this way over "
                       f"({', '.join(o.axes or ())}) (sharded states by every rank, replicated ones by rank 0)")
        if why:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: {why}", o.span)


def _no_block_effect(model: CheckpointModel, o: ir.Override) -> str:
    """Why a fused or flat-offset statement changes nothing, or ''."""
    if not o.axes:
        return "it names no axis whose shards are keyed"
    off = [a for a in o.axes or () if a not in model.reshard_axes]
    if off:
        where = (f"on a new size of ({', '.join(model.reshard_axes)}) only, not of {off[0]}" if model.reshard_axes
                 else "on the same mesh")
        return (f"the checkpoint is resumed {where}: on the same size every rank reads back its own shard, whatever "
                "its layout inside (state `override checkpoint: reshard over (...)`)")
    cut = [a for a in o.axes or () if not any(lay.sharded and lay.axis == a and _applies(o, lay.group)
                                              for lay in model.layouts)]
    if cut:
        return f"no state it names is sharded over {cut[0]}: every rank reads it whole"
    if o.verb == OverrideVerb.FLAT_OFFSET:
        one = [a for a in o.axes or () if not any(_applies(o, lay.group) and model.block_count(lay.group, a) >= 2
                                                 for lay in model.layouts if lay.sharded and lay.axis == a)]
        if one:
            return (f"no state it names is laid out in blocks over {one[0]} (no `fused`, no interleaved schedule's "
                    "virtual stages): a contiguous shard's flat offset is its global offset")
    return ""


def _coordinates_no_effect(model: CheckpointModel) -> str:
    if not model.reshard_axes:
        return ("the checkpoint is loaded on the same mesh, where the saved rank of a rank's coordinates is the rank "
                "itself (state `override checkpoint: reshard over (...)`)")
    return (f"the dropout seed varies over none of the resharded axes ({', '.join(model.reshard_axes)}): every rank "
            "reads the stream of coordinates the new mesh keeps, its own")
