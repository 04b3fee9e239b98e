"""Whole weights that see head-split activations: partial gradients over the tensor axes.

A tensor axis splits the attention heads. A weight kept whole on every tensor rank but
applied to the rank's own heads only computes, on each rank, the part of its gradient that
comes from those heads; the gradient is the sum over the ranks (Megatron-LM all-reduces the
gradients of ``q_layernorm`` / ``k_layernorm`` over the tensor group). Such groups:

- a group whose ``sees`` is ``heads`` (``ParamGroup.sees``): the per-head query/key norms of a
  ``qk_norm`` transformer (``qk_norms``) or a user's ``group NAME { tensor = whole  sees = heads }``;
- the K/V projections when the tensor ranks that split them outnumber the kv heads: each head
  is copied on n/K ranks (PL130 allows it), and each copy's gradient comes from its rank's query
  heads only, so it is summed over the copy group. With one kv head the copy group is the whole
  tensor axis (``kv`` is then a checker class of its own, typed split over the axis for every
  size); with K >= 2 heads copied at the plan's sizes the copy group is a part of the axis
  (``kv_copies``): the checker splits the axis into a head part and a copy part (``check.dims``);
  over several axes it reads the copy groups as runs of their joint index (``copy_layout``,
  ``joint_layout``).

``grad_sums`` is the reduction a correct system makes for them: an all-reduce of the group's
gradient over its tensor axes (or over each copy group), once per step, priced by the cost
engine with the group's own bytes and the copy group's size.
"""

from __future__ import annotations

from . import groups as pg
from . import views
from .buffers import Collective, Kind, Payload, Phase, group_grads, link_of, step_reduction
from .nodes import Const, Mode, Op, Plan, Role, State, Sym, Value, const
from .overrides import OverrideTarget, OverrideVerb

_TENSOR = (Role.TENSOR, Role.SEQUENCE)
_SPLIT = (Mode.S, Mode.O)


def _number(v: Value | None) -> int | None:
    if isinstance(v, Const) and v.value.denominator == 1:
        return int(v.value)
    return None


def partial_axes(plan: Plan, group: pg.ParamGroup) -> tuple[str, ...]:
    """The tensor (or sequence) axes over which ``group``'s gradient is partial: every such axis
    for a whole weight that sees heads; for the K/V projections of one head, the axes that split
    the parameters (the head is copied there)."""
    if group.sees != pg.HEADS:
        return ()
    par = views.effective(plan, plan.placement(State.PARAMS), group)
    return tuple(a for a in plan.mesh.names
                 if views.view(plan).role(a) in _TENSOR and views.role_of(plan, group, a) in _TENSOR
                 and (group.tensor == pg.WHOLE or par.mode(a) in _SPLIT))


def kv_copies(plan: Plan) -> tuple[int, int, tuple[str, ...]] | None:
    """(K, n, axes): the model's K >= 2 kv heads, copied at the plan's declared sizes on the
    n > K tensor ranks (``axes``) that split them, each head on n/K ranks. None otherwise
    (one kv head: ``partial_axes``; sizes not numbers: not decided here)."""
    t = plan.model.transformer
    if t is None or t.mla:
        return None
    k = _number(t.kv_heads)
    kv = next((g for g in pg.param_groups(plan.model) if g.name == "kv"), None)
    if k is None or k < 2 or kv is None:
        return None
    par = views.effective(plan, plan.placement(State.PARAMS), kv)
    axes = tuple(a for a in plan.mesh.names if views.view(plan).role(a) in _TENSOR and par.mode(a) in _SPLIT)
    n = 1
    for a in axes:
        size = _number(plan.mesh.axis(a).size)
        if size is None:
            return None
        n *= size
    return (k, n, axes) if n > k and n % k == 0 else None


def copy_layout(plan: Plan) -> dict[str, tuple[int, int]] | None:
    """axis -> (h, pin) for the axes over which ``kv_copies`` copies the K kv heads, or None where
    there are none or the copy groups are no product of parts of the axes. The tensor ranks are
    numbered by the axes' joint index (mixed radix, the first axis most significant); rank j holds
    head j // (n/K), so each copy group is a run of n/K consecutive joint indices: the last axes
    wholly (h = 1: every rank of the axis a copy), then one axis cut into h blocks of ranks (its
    head part, h = size/copies; for one axis h = K), and the first axes whole heads (h = the size,
    pinned: at another size the runs would cross the axes otherwise, so the layout holds at that
    size only; pin 0: any size that is a multiple of h). A run that crosses an axis's blocks (2 kv
    heads on 2 x 3 ranks: runs of 3 of 6 joint indices) is no product: None."""
    got = kv_copies(plan)
    if got is None:
        return None
    k, n, axes = got
    rem, out = n // k, {}
    for a in reversed(axes):
        s = _number(plan.mesh.axis(a).size)
        if rem == 1:
            out[a] = (s, s)
        elif rem % s == 0:
            out[a], rem = (1, 0), rem // s
        elif s % rem == 0:
            out[a], rem = (s // rem, 0), 1
        else:
            return None
    return {a: out[a] for a in axes}


def joint_layout(plan: Plan) -> tuple[int, int, tuple[tuple[str, int], ...]] | None:
    """(K, c, ((axis, size), ...)) where ``kv_copies`` copies the K kv heads over several axes in
    copy groups that cross the axes' blocks (``copy_layout`` None): each copy group is the run of
    c = n/K consecutive joint indices, a set of devices that is no product of parts of the axes
    (3 kv heads on 2 x 3 ranks: {(0,0),(0,1)}, {(0,2),(1,0)}, {(1,1),(1,2)}). None otherwise."""
    got = kv_copies(plan)
    if got is None or copy_layout(plan) is not None:
        return None
    k, n, axes = got
    return k, n // k, tuple((a, _number(plan.mesh.axis(a).size)) for a in axes)


def copies_note(plan: Plan) -> str | None:
    """One sentence for reports when the plan copies K/V heads over tensor ranks, else None."""
    t = plan.model.transformer
    if t is None or t.mla:
        return None
    got = kv_copies(plan)
    if got is not None:
        k, n, axes = got
        return (f"the {k} kv heads are each copied on {n // k} of the {n} ranks of {'×'.join(axes)}: every copy's "
                f"gradient comes from its rank's query heads and is summed over its copy group ({n // k} ranks)")
    kv = next((g for g in pg.param_groups(plan.model) if g.name == "kv"), None)
    axes = partial_axes(plan, kv) if kv is not None else ()
    if axes and kv.checks_as == pg.GradClass.KV:
        return (f"the single kv head is copied on every rank of {'×'.join(axes)}: every copy's gradient comes from "
                f"its rank's query heads and is summed over {'×'.join(axes)}")
    return None


def _given(plan: Plan, name: str) -> bool:
    """Whether an override states this group's gradient reductions (then it says what is done)."""
    return any(o.verb == OverrideVerb.REDUCE and o.group in (None, "all", name) for o in plan.overrides_for(OverrideTarget.GRADS))


def grad_sums(plan: Plan) -> list[Collective]:
    """The all-reduce a correct system makes of each partial group's gradient over its tensor
    axes, or, for copied K/V heads, over each copy group (a part of the axes, ``size`` devices)."""
    per_mb = plan.model.microbatches
    count, when = step_reduction(plan, per_mb)
    pipe = tuple(a for a in plan.mesh.names if views.view(plan).role(a) is Role.PIPELINE)
    out: list[Collective] = []
    copies = kv_copies(plan)
    for g in pg.param_groups(plan.model):
        if _given(plan, g.name):
            continue
        size = None
        if copies is not None and g.name == "kv":
            k, n, axes = copies
            ranks: Value = Sym(axes[0]) if len(axes) == 1 else Op("*", tuple(Sym(a) for a in axes))
            size = Op("/", (ranks, const(k)))
            why = f"K/V heads copied on {n // k} ranks each: the copies' gradients all-reduced over each copy group"
        else:
            axes = partial_axes(plan, g)
            why = ("one K/V head copied on every tensor rank: the copies' gradients all-reduced over the axis"
                   if g.name == "kv" else f"{g.name} sees head-split activations: its gradient all-reduced over the "
                                          "tensor axis")
        if not axes:
            continue
        divided = tuple(a for a in plan.mesh.names if a in pipe or a in axes)
        out.append(Collective(Kind.ALL_REDUCE, State.GRADS, axes, link_of(plan, axes), Phase.GRAD_SYNC, count,
                              Payload(group_grads(g.name), divided, f"{g.name} gradients"), why + " " + when, size=size))
    return out


def checker_groups(plan: Plan, present: tuple[str, ...]) -> tuple[str, ...]:
    """The checker's gradient groups with ``kv`` of its own where the plan copies K/V heads."""
    if "kv" in present or kv_copies(plan) is None:
        return present
    i = present.index("dense") + 1 if "dense" in present else 0
    return present[:i] + ("kv",) + present[i:]


def undecided(plan: Plan, group: str) -> str:
    """The fact the checker's step model lacks for ``group`` (empty when it decides it). K >= 2 kv
    heads copied over tensor axes are decided: a head part and a copy part per axis where the copy
    groups are products of parts of the axes (``copy_layout``), the joint index read at the declared
    sizes where they cross the axes' blocks (``joint_layout``, check.kvjoint)."""
    return ""
