"""The dimensions a parameter group's gradient is computed over, one per mesh axis, each of
a kind (disjoint tokens, a split, an invariant, a shard) and with the reductions the schedule
applies over it; the axis's role is the group's own (parallel folding) where it has one."""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..ir import groups as pg
from ..ir import heads, views
from . import jointindex
from .wellformed import SPLIT_MODES

MICROBATCHES = "microbatches"  # the size name of the gradient-accumulation (time) dimension
NORMALISATION = "normalisation"  # the GI aspect of the loss weights, token count and divisor

# Dimension kinds of a gradient computation.
TOKEN = "token"  # contributions from disjoint tokens; token counts may differ along it
SPLIT = "split"  # partial contributions (a sequence slice, a tied copy) sharing one token count
INVARIANT = "invariant"  # every device computes the same value
SHARDED = "sharded"  # devices hold different elements

HEAD_PART, COPY_PART = "heads", "copies"

DATA_ROLES = (ir.Role.DATA,)
TENSOR_ROLES = (ir.Role.TENSOR, ir.Role.SEQUENCE)


@dataclass(frozen=True)
class GradDim:
    """One dimension a parameter group's gradient is computed over."""

    name: str  # mesh axis, MICROBATCHES, or "tie:<pipeline axis>"
    axis: str | None  # the mesh axis whose size this is (None for microbatches)
    kind: str  # TOKEN, SPLIT, INVARIANT or SHARDED
    k: int  # reductions over this dimension (accumulation for microbatches: 1 kept, 0 = last only)
    implicit: bool = False  # summed by the MoE all-to-all (experts over the expert axis)
    replica: bool = False  # devices along it update the same elements (replicated update)
    tie: bool = False  # size is 2 when the pipeline axis has >= 2 stages, else 1
    why: str = ""  # why it has this kind, for reports
    # a part of a tensor axis where K kv heads are copied on axis/K ranks each: HEAD_PART (size K, which
    # head a rank holds) or COPY_PART (size axis/K, which copy); a reduction over the axis counts on both
    part: str = ""
    heads: int = 0  # K, for a part (over several axes, the axis's own share of the heads: ``heads.copy_layout``)
    pin: int = 0  # the axis's size is this (K/V heads copied over several axes: an axis of whole heads)
    joint: tuple[tuple[str, int], ...] = ()  # (axis, declared size): copy groups crossing these axes (check.kvjoint)


def _kv_layout(plan: ir.Plan, kind: str) -> tuple[dict, tuple | None]:
    """(axis -> (h, pin) of ``heads.copy_layout``, ``heads.joint_layout``) for the kv group: where the copy
    groups cross the axes (check.kvjoint) every joint axis is in the layout, its parts from the joint index."""
    joint = heads.joint_layout(plan) if kind == "kv" else None
    if joint:
        return {a: (0, 0) for a, _ in joint[2]}, joint
    return (heads.copy_layout(plan) or {}) if kind == "kv" else {}, None


def axis_dims(plan: ir.Plan, axes, cls: pg.ParamGroup, role_of, pls, k, sp: bool, tied: bool) -> list[GradDim]:
    """One ``GradDim`` per mesh axis for gradient group ``cls`` (``pls``: its params and
    optimizer placements; ``k``: the schedule's reductions per axis)."""
    par_pl, opt_pl = pls
    g, kind = cls.name, cls.checks_as
    dims: list[GradDim] = []
    partial = heads.partial_axes(plan, cls)
    layout, joint = _kv_layout(plan, kind)
    several = len(layout) > 1
    for a in axes:
        role = role_of(a)
        if role in DATA_ROLES and views.view(plan).role(a) in TENSOR_ROLES:  # folding: expert data over a tensor axis
            if sp:
                dims.append(GradDim(a, a, SPLIT, k[a], replica=True,
                                    why=f"{g} take {a} as expert data: each rank routes its own sequence slice"))
            else:
                dims.append(GradDim(a, a, INVARIANT, k[a], replica=True,
                                    why=f"{g} take {a} as expert data, but every {a} rank sees the same tokens"))
        elif role in TENSOR_ROLES and views.view(plan).role(a) not in TENSOR_ROLES:  # folding: expert tensor over data devices
            dims.append(GradDim(a, a, TOKEN, k[a], implicit=True,
                                why=f"{g} are split over {a} (expert tensor) and the dispatch brings every {a} rank's "
                                    "tokens to each shard"))
        elif role in DATA_ROLES:
            dims.append(GradDim(a, a, TOKEN, k[a], replica=opt_pl.mode(a) is ir.Mode.R,
                                why=f"{a} is a data axis: each replica sees different samples"))
        elif role is ir.Role.CONTEXT:
            dims.append(GradDim(a, a, TOKEN, k[a], replica=True,
                                why=f"{a} is a context axis: each device holds a slice of the sequence"))
        elif role is ir.Role.EXPERT:
            if kind == "experts" and par_pl.mode(a) in SPLIT_MODES and views.view(plan).role(a) in TENSOR_ROLES and sp:
                dims.append(GradDim(a, a, SPLIT, 1 + k[a], why=f"experts folded over {a}: each rank's sequence "
                                    "slice reaches its experts through the all-to-all"))
            elif kind == "experts" and par_pl.mode(a) in SPLIT_MODES:
                dims.append(GradDim(a, a, TOKEN, k[a], implicit=True,
                                    why=f"experts are sharded over {a}; the all-to-all brings every rank's tokens"))
            elif kind == "experts":
                dims.append(GradDim(a, a, TOKEN, k[a], replica=True,
                                    why=f"params are {par_pl.mode(a).value} over {a}: every rank holds every "
                                        "expert and sees its own tokens"))
            else:
                dims.append(GradDim(a, a, TOKEN, k[a], replica=True,
                                    why=f"non-expert parameters see different tokens on each {a} rank"))
        elif role in TENSOR_ROLES and a in layout and several:  # K kv heads copied over several axes (kvproduct)
            dims += joint_dims(a, joint, k) if joint else copied_dims(a, layout, k)
        elif role in TENSOR_ROLES and a in layout:  # K kv heads, each copied on a/K ranks
            n_heads = layout[a][0]
            dims.append(GradDim(a, a, SHARDED, k[a], part=HEAD_PART, heads=n_heads,
                                why=f"the {n_heads} kv heads are split over {a} in blocks of {a}/{n_heads} ranks"))
            dims.append(GradDim(f"{a}.copies", a, SPLIT, k[a] + k[(a, COPY_PART)], replica=True, part=COPY_PART,
                                heads=n_heads, why=f"each kv head is copied on {a}/{n_heads} ranks: each copy's "
                                "gradient comes from its rank's query heads only and is summed over its copy group"))
        elif role in TENSOR_ROLES and a in partial:  # a whole weight on head-split activations
            dims.append(GradDim(a, a, SPLIT, k[a], replica=True, why=(
                f"one K/V head is copied on every {a} rank: each copy's gradient comes from its rank's query heads "
                f"only and is summed over {a}" if cls.checks_as == pg.GradClass.KV else
                f"{g} are whole on every {a} rank but see only its heads: each rank's gradient is the part from its "
                f"heads, summed over {a}")))
        elif role in TENSOR_ROLES:
            if cls.tensor == pg.WHOLE:
                if sp:
                    dims.append(GradDim(a, a, SPLIT, 1 + k[a], replica=True,
                                        why=f"sequence parallel: replicated {g} see a sequence slice per {a} rank"))
                else:
                    dims.append(GradDim(a, a, INVARIANT, k[a], replica=True,
                                        why=f"{g} are replicated over {a} and see the whole sequence"))
            elif par_pl.mode(a) in SPLIT_MODES:
                dims.append(GradDim(a, a, SHARDED, k[a], why=f"{g} are partitioned over {a}"))
            else:
                dims.append(GradDim(a, a, INVARIANT, k[a], replica=True,
                                    why=f"params are {par_pl.mode(a).value} over {a}: every {a} rank computes "
                                        f"the whole {g} gradient on the same tokens"))
        elif role is ir.Role.PIPELINE:
            if kind == "embedding" and tied:
                dims.append(GradDim(f"tie:{a}", a, SPLIT, 1, replica=True, tie=True,
                                    why=f"the tied embedding lives on the first and last {a} stage"))
            else:
                dims.append(GradDim(a, a, SHARDED, k[a], why=f"each {a} stage holds its own layers"))
    return dims


def copied_dims(a: str, layout: dict[str, tuple[int, int]], k) -> list[GradDim]:
    """The dimensions of tensor axis ``a`` of a copy layout over several axes (check.kvproduct)."""
    h, pin = layout[a]
    joint = "×".join(layout)
    if pin:
        return [GradDim(a, a, SHARDED, k[a], pin=pin,
                        why=f"each {a} rank holds its own kv heads: numbered by the joint index of {joint}, a copy "
                            f"group is a run of consecutive ranks on the later axes (the layout at {a} = {pin})")]
    blocks = f"in {h} blocks of {a}/{h} ranks" if h > 1 else "in one block: every rank a copy"
    return [GradDim(a, a, SHARDED, k[a], part=HEAD_PART, heads=h,
                    why=f"the kv heads are split over {a} {blocks} (the joint index of {joint})"),
            GradDim(f"{a}.copies", a, SPLIT, k[a] + k[(a, COPY_PART)], replica=True, part=COPY_PART, heads=h,
                    why=f"each kv head is copied on {a}/{h} ranks of {a} (its copy group a run of ranks of {joint}): "
                        "each copy's gradient comes from its rank's query heads only and is summed over its copy group")]


def joint_dims(a: str, lay, k) -> list[GradDim]:
    """The dimensions of joint axis ``a`` (``lay``: ``ir.heads.joint_layout``; ``k``: the schedule's
    reductions per axis, a copy-group reduction as (axis, "copies"))."""
    heads, c, joint = lay
    kh, kc, inside = jointindex.counts(lay, k)
    names = "×".join(x for x, _ in joint)
    if a != joint[0][0]:
        return [GradDim(a, a, SHARDED, inside.get(a, 0), joint=joint,
                        why=f"{a} is read with {names}: the kv heads' copy groups are runs of their joint index")]
    return [GradDim(a, a, SHARDED, kh, part=HEAD_PART, heads=heads, joint=joint,
                    why=f"the {heads} kv heads are split over {names} (rank j of the joint index holds head j // {c})"),
            GradDim(f"{names}.copies", a, SPLIT, kc, replica=True, part=COPY_PART, heads=heads, joint=joint,
                    why=f"each kv head is copied on {c} consecutive ranks of the joint index of {names} (its copy "
                        "group, crossing the axes' blocks): each copy's gradient comes from its rank's query heads "
                        "only and is summed over its copy group")]
