"""Optimizer algorithms per parameter group: what an update needs to see, what it keeps.

Input: a plan's ``optimizer { GROUP = ALGORITHM(args) }`` section (resolved into
``Plan.optimizers``). Output: for every parameter group the ``Choice`` that updates it (the
model's element-wise default where the section names none), with its locality, the state it
keeps per parameter and the arguments that size its update.

Locality (docs/semantics.md, "Optimizers that need whole matrices"):

| locality | algorithms | what one rank's update needs |
|---|---|---|
| element | adamw, adam, sgd, lion, adafactor | the elements it steps (any shard) |
| matrix | muon(ns_steps = 5) | each whole weight matrix it steps |
| block | shampoo(block = B), soap(block = B) | each whole B×B block |
| sharded | dion(rank = r) | its own shard (the algorithm's collectives combine them) |

State bytes per parameter, fp32 master weights included as in the model's 12-byte AdamW
(``bytes { optimizer = 12 }``): adamw/adam the model's ``bytes.optimizer``; sgd and lion 8
(master + momentum); adafactor 4 + 4·(m + n) per m×n matrix (factored second moment);
muon 8 (master + momentum, Jordan et al. 2024); shampoo 28 (master, momentum, grafting
accumulator, and the two B×B preconditioners with their inverse roots: 16 bytes per parameter
when B divides the matrix); soap 28 (master, Adam's two moments in the rotated basis, the two
preconditioners and their eigenbases); dion 8 + 4·r·n per m×n matrix (the n×r right factor).
Nothing here imports sympy: costs/optimizer.py sizes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import NO_SPAN, Span
from . import views
from .nodes import Const
from .overrides import OverrideTarget, OverrideVerb

ELEMENT, MATRIX, BLOCK, SHARDED = "element", "matrix", "block", "sharded"


@dataclass(frozen=True)
class Algorithm:
    """An optimizer algorithm: its locality, state bytes per parameter and arguments."""

    name: str
    locality: str
    state: int | None  # bytes per parameter (None: the model's bytes.optimizer)
    args: tuple[tuple[str, int | None], ...] = ()  # argument -> default (None: required)
    per_dim: str = ""  # "rows+cols" (adafactor) or "rank*cols" (dion): 4 bytes per element of that


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("adamw", ELEMENT, None),
    Algorithm("adam", ELEMENT, None),
    Algorithm("sgd", ELEMENT, 8),
    Algorithm("lion", ELEMENT, 8),
    Algorithm("adafactor", ELEMENT, 4, per_dim="rows+cols"),
    Algorithm("muon", MATRIX, 8, (("ns_steps", 5),)),
    Algorithm("shampoo", BLOCK, 28, (("block", None),)),
    Algorithm("soap", BLOCK, 28, (("block", None),)),
    Algorithm("dion", SHARDED, 8, (("rank", None),), per_dim="rank*cols"),
)}

# groups whose parameters are vectors: a matrix-, block- or sharded-matrix update has no meaning there
VECTOR_GROUPS = ("norms", "qk_norms", "final_norm", "biases", "mlp_biases", "expert_biases")
# ``matrices``: the weight matrices inside the layers (Muon recipes keep the embedding and head on AdamW)
MATRIX_GROUPS = ("attention", "kv", "mlp", "experts", "shared_experts", "router", "dense")


@dataclass(frozen=True)
class Choice:
    """An optimizer chosen in a spec, with its arguments."""

    algorithm: str
    args: tuple[tuple[str, int], ...] = ()
    span: Span = field(default=NO_SPAN, compare=False)

    @property
    def locality(self) -> str:
        return ALGORITHMS[self.algorithm].locality

    def arg(self, name: str) -> int | None:
        return dict(self.args).get(name)

    def text(self) -> str:
        return self.algorithm + (f"({', '.join(f'{k} = {v}' for k, v in self.args)})" if self.args else "")


DEFAULT = Choice("adamw")


def choice(plan, group: str) -> Choice:
    """The algorithm that updates ``group`` in ``plan``: its own entry, else ``all``, else AdamW."""
    own = dict(plan.optimizers)
    return own.get(group) or own.get("all") or DEFAULT


def whole_needed(plan) -> tuple[tuple[str, Choice], ...]:
    """(group, choice) for every parameter group of the plan whose update needs whole matrices or blocks."""
    from .groups import param_groups

    out = []
    for g in param_groups(plan.model):
        c = choice(plan, g.name)
        if c.locality in (MATRIX, BLOCK) and g.name not in VECTOR_GROUPS:
            out.append((g.name, c))
    return tuple(out)


def stated(plan, verb: str, group: str) -> tuple[tuple[str, ...], Span]:
    """The axes of ``override optimizer[group]: VERB over (...)`` (group or ``all``), and where."""
    axes: list[str] = []
    span = NO_SPAN
    for o in plan.overrides:
        if o.target == OverrideTarget.OPTIMIZER and o.verb == verb and (
                o.group in (group, "all", None) or (o.group == "matrices" and group in MATRIX_GROUPS)):
            axes += [a for a in (o.axes or ()) if a not in axes]
            span = o.span if span == NO_SPAN else span
    return tuple(axes), span


def group_of(plan, name: str):
    from .groups import param_groups

    return next((g for g in param_groups(plan.model) if g.name == name), None)


def single_kv(plan, bindings=None) -> bool | None:
    """Whether the model has one K/V head (copied whole on every tensor rank): its ``kv_heads``, a
    number or a ``let`` name bound to one in ``bindings`` (name -> value); None when it is not known."""
    from .nodes import Const, Sym

    t = plan.model.transformer
    v = t.kv_heads if t is not None else None
    for _ in range(8):
        if isinstance(v, Sym) and bindings is not None and v.name in bindings:
            v = bindings[v.name]
    if isinstance(v, Const):
        return v.value == 1
    return None


def cuts(plan, name: str, bindings=None) -> tuple[str, ...]:
    """The mesh axes over which the update of group ``name`` sees a piece of each matrix, not the
    whole: a tensor (or sequence) axis that splits its weights, or a data, context or expert axis
    over which its optimizer state is sharded (``S``, ``S*``, ``O``: a flat ZeRO/FSDP shard), except
    an expert axis that hands whole experts to its ranks. Gathers and owners stated by the plan are
    not applied. K/V weights (split by heads) count as cut by a tensor axis unless the model has one
    K/V head (``single_kv``; a head count not known here counts as cut: ``unsure_cuts``)."""
    from .groups import HEADS, SPLIT
    from .nodes import Role, State
    from .views import class_view

    g = group_of(plan, name)
    if g is None:
        return ()
    view = class_view(plan, g)
    one_kv = single_kv(plan, bindings) is True
    out = []
    for a in plan.mesh.names:
        from .views import role_of

        role = role_of(plan, g, a)
        sharded = view.placement(State.OPTIMIZER).mode(a).shards
        if role is Role.PIPELINE:
            continue
        if role is Role.EXPERT and g.expert:
            continue
        if role in (Role.TENSOR, Role.SEQUENCE):  # the tensor rule decides: split weights are cut, whole ones not
            if g.tensor == SPLIT or (g.tensor == HEADS and not one_kv):
                out.append(a)
        elif sharded:
            out.append(a)
    return tuple(out)


def unsure_cuts(plan, name: str, bindings=None) -> tuple[str, ...]:
    """The tensor axes ``cuts`` counts for a heads-split group only because the K/V head count is
    not known (a symbol): with one K/V head they would not cut it."""
    from .groups import HEADS
    from .nodes import Role
    from .views import role_of

    g = group_of(plan, name)
    if g is None or g.tensor != HEADS or single_kv(plan, bindings) is not None:
        return ()
    return tuple(a for a in cuts(plan, name, bindings) if role_of(plan, g, a) in (Role.TENSOR, Role.SEQUENCE))


def uncut(plan, name: str) -> tuple[str, ...]:
    """The axes over which the plan gives group ``name``'s update the whole matrix (a gather or an owner)."""
    return tuple(dict.fromkeys(stated(plan, OverrideVerb.GATHER, name)[0] + stated(plan, OverrideVerb.ROUND_ROBIN, name)[0]))


def is_placement(o) -> bool:
    """An ``optimizer[G]: gather`` or ``round_robin`` override: how a correct system reaches whole matrices."""
    return o.target == OverrideTarget.OPTIMIZER and o.verb in (OverrideVerb.GATHER, OverrideVerb.ROUND_ROBIN)


def section_text(plan) -> str:
    return ", ".join(f"{g} {c.text()}" for g, c in plan.optimizers)


def export_problems(plan, framework: str, what: str) -> list[str]:
    """What a framework's configuration cannot say of the plan's optimizer section."""
    if all(c.algorithm in ("adamw", "adam") for _, c in plan.optimizers):
        return []
    return [f"optimizer {{ {section_text(plan)} }}: {framework}'s {what} names one element-wise optimizer for every "
            "parameter; the algorithms per group (and how whole matrices reach them) are not expressed"]


def megatron_args(plan) -> tuple[list[str], list[str]]:
    """(arguments, problems) of Megatron-LM's Muon (--optimizer muon on the linear layers' matrices,
    Adam on the rest): --muon-num-ns-steps, --muon-tp-mode duplicated for a gather over the tensor
    axes, --use-layer-wise-distributed-optimizer for owners over the data axes."""
    from .nodes import Role

    own = {g: c for g, c in plan.optimizers if c.algorithm not in ("adamw", "adam")}
    if not own:
        return [], []
    steps = {c.arg("ns_steps") for c in own.values()}
    if any(c.algorithm != "muon" for c in own.values()) or len(steps) != 1 or \
            not set(own) <= set(MATRIX_GROUPS) or "all" in dict(plan.optimizers):
        return [], export_problems(plan, "Megatron-LM", "arguments")
    out = ["--optimizer", "muon", "--muon-num-ns-steps", str(steps.pop())]
    tensor = views.view(plan).axes_with_role(Role.TENSOR, Role.SEQUENCE)
    data = views.view(plan).axes_with_role(Role.DATA)
    groups = tuple(own)
    if tensor and all(set(tensor) <= set(stated(plan, OverrideVerb.GATHER, g)[0]) for g in groups):
        out += ["--muon-tp-mode", "duplicated"]
    elif tensor:
        out += ["--muon-tp-mode", "blockwise"]
    problems = []
    if data and all(set(data) <= set(stated(plan, OverrideVerb.ROUND_ROBIN, g)[0]) for g in groups):
        out.append("--use-layer-wise-distributed-optimizer")
    elif any(set(stated(plan, OverrideVerb.GATHER, g)[0]) & set(data) for g in groups):
        problems.append("optimizer[G]: gather over the data axes: Megatron-LM's Muon does not gather matrices over "
                        "its distributed optimizer's flat shards (its layer-wise optimizer owns whole layers: "
                        "round_robin over the data axes)")
    return out, problems


def owners(plan, name: str) -> tuple[str, ...]:
    """The axes of ``optimizer[name]: round_robin`` that spread its matrices over owners: not a
    pipeline axis (stages hold their own layers) nor an expert axis dividing the group (each
    expert rank holds its own experts)."""
    from .nodes import Role
    from .views import role_of

    g = group_of(plan, name)
    out = []
    for a in plan.mesh.names:
        if a not in stated(plan, OverrideVerb.ROUND_ROBIN, name)[0] or g is None:
            continue
        role = role_of(plan, g, a)
        if role is Role.PIPELINE or (role is Role.EXPERT and g.expert):
            continue
        out.append(a)
    return tuple(out)


def stepped_every_microbatch(plan, group: str) -> bool:
    """Whether ``override optimizer[G]: step_every_microbatch`` reaches the parameter group ``group`` (G that
    group, ``all``, none, or ``matrices`` for a weight matrix group): its update runs after every micro-step."""
    return any(o.target == OverrideTarget.OPTIMIZER and o.verb == OverrideVerb.STEP_EVERY_MICROBATCH and (
        o.group in (None, "all", group) or (o.group == "matrices" and group in MATRIX_GROUPS)) for o in plan.overrides)


def updates_per_step(plan, group: str):
    """How many updates ``group`` takes per step: one, or the model's microbatches where it is stepped after
    every micro-step (``stepped_every_microbatch``)."""
    return plan.model.microbatches if stepped_every_microbatch(plan, group) else Const(1)
