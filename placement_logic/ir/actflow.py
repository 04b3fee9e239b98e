"""The activation dataflow of a tensor-parallel layer region: which collectives its forward and
backward apply, where, and over which axes (derived from the placements, or as an override states).

Input: an ``ir.Plan``. Output: ``flows(plan)``, one ``Flow`` per region and tensor group (plain data,
read by the checker's typing, ``check.actflow``), and ``adjust(plan, colls)``, the collective schedule
with the activation collectives the overrides move, remove or add (the cost engine prices it).

A region is Megatron-LM's pair of a column-parallel and a row-parallel linear (``attention``: QKV and
the output projection; ``mlp``: fc1 and fc2) or the vocabulary-parallel output layer (``head``: one
column-parallel linear whose sharded logits the vocabulary-parallel cross entropy reads). Each has
four slots where a collective sits (Megatron's f and g and their conjugates):

| slot | tensor parallelism | sequence parallelism |
|---|---|---|
| ``fwd_entry``: before the column-parallel linear | none (f: identity) | all-gather |
| ``fwd_exit``: after the row-parallel linear | all-reduce (g) | reduce-scatter |
| ``bwd_exit``: the output gradient, before the row-parallel linear's backward | none | all-gather |
| ``bwd_entry``: the input gradient, after the column-parallel linear's backward | all-reduce (f's conjugate) | reduce-scatter |

The head has no row-parallel linear: its slots are ``fwd_entry`` and ``bwd_entry``. The
vocabulary-parallel input embedding (``embedding``: each tensor rank holds a slice of the vocabulary
and looks up the tokens in it, zero rows for the others: a partial output) has ``fwd_exit`` (its
output's all-reduce, a reduce-scatter under sequence parallelism) and ``bwd_exit`` (the output
gradient its weight gradient reads: nothing, an all-gather under sequence parallelism); its input
(token ids) has no gradient. The vocabulary-parallel cross entropy (``loss``: each tensor rank holds the
logits of its vocabulary slice) has three all-reduces over the tensor group, one per slot: ``max``
(the max logit, an all-reduce MAX: every rank must subtract the same constant), ``target`` (the
target's logit, on the rank whose slice holds it) and ``sumexp`` (the sum of exponentials); its
backward (softmax minus the one-hot target, on each rank's slice) needs none. Where the model states
them (``losses { label_smoothing = true  logit_z_loss = true }``, ir.losses.CE_TERMS) it has one more
all-reduce each: ``smoothing`` (the sum of the logits over the vocabulary, for label smoothing's mean
log-probability) and ``zloss`` (the sum of exponentials of the z-loss's own log-sum-exp); with label smoothing
``vocab`` is its vocabulary size, a count each rank holds V/t of, summed over the tensor group (derived: the
whole vocabulary, known from the shapes, so it moves no bytes). The MoE layer
(``experts``: each rank of the expert group holds its own tokens and its own experts) has a dispatch
all-to-all over the expert axes before the expert MLPs (``fwd_entry``) and a combine all-to-all back
after them (``fwd_exit``); in backward the output gradient goes to the experts by combine's conjugate
(``bwd_exit``) and the input gradient back to its tokens by dispatch's (``bwd_entry``). Context
parallelism's attention (``context``, on each context-parallel group: ``ir.actflow_context``) has the
exchange of the key/value blocks before the attention (``fwd_entry``, a ring or an all-gather over the
context axes), the same exchange again in backward (``bwd_exit``) and the reduce-scatter of the
key/value gradients back to their owners (``bwd_entry``). An expert tensor group of its own (MoE
parallel folding: axes the experts split and the dense layers do not) adds ``expert_tensor``: the
routed tokens all-gathered over it before the expert MLPs (``fwd_entry``), the partial outputs
reduce-scattered after them (``fwd_exit``), and in backward the output gradient all-gathered
(``bwd_exit``) and the input gradient reduce-scattered (``bwd_entry``): a column/row-parallel pair
under sequence parallelism, stated as ``activations[experts]: gather | reduce`` and
``activation_grads[experts]: gather | reduce | no_reduce | reduce_copy``.

A declared type replaces a slot's derived collectives by DTensor's redistribution from the declared
type to the one the next operation needs: ``assert_*`` at ``fwd_exit`` (``from_local``'s placements)
and ``bwd_entry`` (the input gradient's ``grad_placements``), ``assert_output_*`` at ``bwd_exit`` (the
output gradient's: ``to_local(grad_placements=...)`` on the row-parallel output), redistributed to
the whole gradient the row-parallel linear's backward reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from ..diagnostics import NO_SPAN, Span
from . import views
from .actflow_context import passes
from .buffers import Collective, Kind, Payload, PayloadTensor, Phase, link_of
from .nodes import Const, Mode, Op, Recompute, Role, State
from .overrides import OverrideVerb

REGIONS = ("attention", "mlp", "head", "embedding", "loss", "experts", "context")
TP_REGIONS = REGIONS[:5]  # the regions of a tensor-parallel group
EXPERT_VERBS = ("dispatch", "combine")
LOSS_SLOTS = ("max", "target", "sumexp")
LOSS_VERBS = {"reduce_max": "max", "reduce_target": "target", "reduce_sumexp": "sumexp"}
# the cross entropy's extra terms' all-reduces (ir.losses.CE_TERMS), present where the model states the term:
# the sum of the logits label smoothing's mean log-probability reads, the sum of exponentials of the z-loss's lse
CE_SLOTS = ("smoothing", "zloss")
CE_VERBS = {"reduce_smoothing": "smoothing", "reduce_zloss": "zloss"}
# label smoothing's vocabulary size V (its α/V): a count each tensor rank holds V/t of, summed over the tensor group
# (derived: the whole vocabulary, known from the shapes; it moves no bytes), present with the smoothing term
VOCAB = "vocab"
CE_VERBS["smoothing_vocab"] = VOCAB
CE_TERM_OF_SLOT = {"smoothing": "smoothing", "zloss": "zloss", VOCAB: "smoothing"}  # the term's slot it needs
LOSS_VERBS.update(CE_VERBS)
# the slots each region has (the others: the four of a column/row-parallel pair)
REGION_SLOTS = {"head": ("fwd_entry", "bwd_entry"), "embedding": ("fwd_exit", "bwd_exit"),
                "loss": LOSS_SLOTS + CE_SLOTS + (VOCAB,),
                "context": ("fwd_entry", "bwd_exit", "bwd_entry")}
TARGETS = ("activations", "activation_grads")
ASSERTS = {"assert_replicate": "R", "assert_partial": "P", "assert_shard": "S"}
# the output gradient's declared type (to_local's grad_placements), redistributed to the whole gradient the
# row-parallel linear's backward (the embedding's weight gradient) reads
OUTPUT_ASSERTS = {OverrideVerb.ASSERT_OUTPUT_REPLICATE: "R", OverrideVerb.ASSERT_OUTPUT_PARTIAL: "P",
                  OverrideVerb.ASSERT_OUTPUT_SHARD: "S"}
DECLARES = {**ASSERTS, **OUTPUT_ASSERTS}
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, SLICE, COPY = "all_reduce", "all_gather", "reduce_scatter", "slice", "copy"
ALL_TO_ALL = "all_to_all"
# the verb of each target -> the slot it states
SLOT_OF = {("activations", "gather"): "fwd_entry", ("activations", "reduce"): "fwd_exit",
           ("activation_grads", "gather"): "bwd_exit", ("activation_grads", "reduce"): "bwd_entry",
           ("activation_grads", "no_reduce"): "bwd_entry", ("activation_grads", "reduce_copy"): "bwd_entry"}
SLOT_OF.update({("activations", v): "fwd_exit" for v in ASSERTS})
SLOT_OF.update({("activation_grads", v): "bwd_entry" for v in ASSERTS})
SLOT_OF.update({("activation_grads", v): "bwd_exit" for v in OUTPUT_ASSERTS})
SLOT_OF.update({("activations", v): slot for v, slot in LOSS_VERBS.items()})
SLOT_OF.update({("activations", "dispatch"): "fwd_entry", ("activations", "combine"): "fwd_exit",
                ("activation_grads", "combine"): "bwd_exit", ("activation_grads", "dispatch"): "bwd_entry"})
# Ulysses context parallelism (ir.actflow_context): the all-to-all pair around the attention, in place of the
# key/value exchange (its inverse after the attention is part of the same statement)
SLOT_OF.update({("activations", "all_to_all"): "fwd_entry", ("activation_grads", "all_to_all"): "bwd_exit"})
SLOTS = ("fwd_entry", "fwd_exit", "bwd_exit", "bwd_entry")
# the expert tensor group's statements (group experts, not the all-to-alls)
ETP_VERBS = {("activations", "gather"), ("activations", "reduce"), ("activation_grads", "gather"),
             ("activation_grads", "reduce"), ("activation_grads", "no_reduce"), ("activation_grads", "reduce_copy")}
ETP_VERBS |= {(t, v) for t in ("activations", "activation_grads") for v in ASSERTS}
ETP_VERBS |= {("activation_grads", v) for v in OUTPUT_ASSERTS}
ALL_SLOTS = SLOTS + LOSS_SLOTS + CE_SLOTS + (VOCAB,)


@dataclass(frozen=True)
class Step:
    """One collective (or local slice) over ``axes``; ``kind`` COPY: a reduction applied to a copy of
    the value (it moves ``moved`` bytes and leaves the value that flows on as it was)."""
    kind: str
    axes: tuple[str, ...]
    moved: str = ""  # for COPY: the collective it performs


@dataclass(frozen=True)
class Slot:
    """The steps of one activation slot, derived or stated by an override."""

    steps: tuple[Step, ...]
    span: Span = NO_SPAN  # the override that states it (NO_SPAN: derived)
    verb: str = ""  # the override's verb ("": derived)
    declared: str = ""  # R | P | S: the asserted type (assert_* verbs)
    axes: tuple[str, ...] = ()  # the axes an assert_* verb names


@dataclass(frozen=True)
class Flow:
    """The activation flow of one region over a tensor group: its slots in order."""

    region: str
    tensor: tuple[str, ...]  # the tensor group (a product binding's axes)
    sp: bool
    slots: tuple[tuple[str, Slot], ...]
    layers: tuple[str, ...] = ()  # axes whose ranks hold other layers (pipeline stages): experts only
    summed: tuple[str, ...] = ()  # experts only: axes whose ranks hold the same tokens and sum the experts' shards

    def slot(self, name: str) -> Slot | None:
        return dict(self.slots).get(name)

    @property
    def shown(self) -> str:
        """The region as an override names it."""
        return "experts" if self.region == "expert_tensor" else self.region

    @property
    def has_row(self) -> bool:
        return self.region not in ("head", "embedding", "experts", "context")


def redistribute(declared: str, needed: str, axes: tuple[str, ...]) -> tuple[Step, ...]:
    """What DTensor's redistribute does to a value declared ``declared`` to make it ``needed`` (R or S)."""
    kind = {("P", "R"): ALL_REDUCE, ("S", "R"): ALL_GATHER, ("P", "S"): REDUCE_SCATTER, ("R", "S"): SLICE}
    k = kind.get((declared, needed))
    return (Step(k, axes),) if k and axes else ()


def derived_slots(region: str, t: tuple[str, ...], sp: bool) -> dict[str, Slot]:
    if region == "loss":  # the extra terms' slots too: flows keeps those the model states (ce_slots)
        return {s: Slot((Step(ALL_REDUCE, t),)) for s in LOSS_SLOTS + CE_SLOTS + (VOCAB,)}
    if region == "experts":  # t: the expert axes; every slot one all-to-all over them
        return {s: Slot((Step(ALL_TO_ALL, t),)) for s in SLOTS}
    if region == "context":  # t: the context axes; K/V gathered in forward and backward, dK/dV reduce-scattered
        return {"fwd_entry": Slot((Step(ALL_GATHER, t),)), "bwd_exit": Slot((Step(ALL_GATHER, t),)),
                "bwd_entry": Slot((Step(REDUCE_SCATTER, t),))}
    out = {"fwd_entry": Slot((Step(ALL_GATHER, t),) if sp else ()),
           "bwd_entry": Slot((Step(REDUCE_SCATTER if sp else ALL_REDUCE, t),)),
           "fwd_exit": Slot((Step(REDUCE_SCATTER if sp else ALL_REDUCE, t),)),
           "bwd_exit": Slot((Step(ALL_GATHER, t),) if sp else ())}
    return {k: v for k, v in out.items() if k in REGION_SLOTS.get(region, SLOTS)}


def stated_slot(o, region: str, t: tuple[str, ...], sp: bool) -> Slot:
    axes = tuple(o.axes or ())
    if o.verb in ASSERTS:
        return Slot(redistribute(ASSERTS[o.verb], "S" if sp else "R", axes), o.span, o.verb, ASSERTS[o.verb], axes)
    if o.verb in OUTPUT_ASSERTS:  # read whole by the row-parallel backward, sequence parallelism or not
        return Slot(redistribute(OUTPUT_ASSERTS[o.verb], "R", axes), o.span, o.verb, OUTPUT_ASSERTS[o.verb], axes)
    if o.verb == OverrideVerb.NO_REDUCE:
        return Slot((), o.span, o.verb)
    if o.verb == OverrideVerb.REDUCE_COPY:
        derived = derived_slots(region, t, sp)["bwd_entry"].steps
        return Slot(tuple(Step(COPY, s.axes, s.kind) for s in derived), o.span, o.verb)
    if o.verb in EXPERT_VERBS or o.verb == OverrideVerb.ALL_TO_ALL:
        kind = ALL_TO_ALL
    elif o.verb == OverrideVerb.GATHER:
        kind = ALL_GATHER
    elif o.verb in LOSS_VERBS:  # per-token scalars: all-reduced under sequence parallelism too
        kind = ALL_REDUCE
    elif region == "context":  # the key/value gradients go back to the rank that owns their block
        kind = REDUCE_SCATTER
    else:
        kind = REDUCE_SCATTER if sp else ALL_REDUCE
    return Slot(tuple(Step(kind, p) for p in passes(axes)), o.span, o.verb)


# operations on the row-parallel output before its reduction (check.actpartial): no collective of a slot
PARTIAL_OPS = ("bias_before_reduce", "residual_before_reduce", "nonlinear_before_reduce", "scale_before_reduce",
               "positional_before_reduce", "shared_before_reduce")


def overrides(plan) -> list:
    return [o for o in plan.overrides if o.target in TARGETS and o.verb not in PARTIAL_OPS]


def flows(plan) -> tuple[Flow, ...]:
    """Every region on every tensor group, with its slots as derived or stated (the last statement
    of a slot wins; a statement without a region states it in every region that has the slot)."""
    out = []
    sp = bool(plan.sequence_parallel or views.view(plan).axes_with_role(Role.SEQUENCE))
    params = plan.placement(State.PARAMS)
    for t in plan.groups_with_role(Role.TENSOR, Role.SEQUENCE):
        if params.mode(t[0]) not in (Mode.S, Mode.S_STAR, Mode.O):
            continue  # the layers are whole on every rank of t: no region splits them
        for region in TP_REGIONS:
            slots = derived_slots(region, tuple(t), sp)
            if region == "loss":
                slots = {k: v for k, v in slots.items() if k in LOSS_SLOTS or CE_TERM_OF_SLOT[k] in ce_slots(plan)}
            for o in overrides(plan):
                slot = SLOT_OF[(o.target, o.verb)]
                if o.group in (None, region) and slot in slots and o.verb not in EXPERT_VERBS \
                        and o.verb != OverrideVerb.ALL_TO_ALL:
                    slots[slot] = stated_slot(o, region, tuple(t), sp)
            out.append(Flow(region, tuple(t), sp, tuple((s, slots[s]) for s in ALL_SLOTS if s in slots)))
    e = expert_axes(plan)
    if e:
        slots = derived_slots("experts", e, sp)
        for o in overrides(plan):
            if o.group in (None, "experts") and o.verb in EXPERT_VERBS:
                slots[SLOT_OF[(o.target, o.verb)]] = stated_slot(o, "experts", e, sp)
        out.append(Flow("experts", e, sp, tuple((s, slots[s]) for s in SLOTS), plan.axes_with_role(Role.PIPELINE),
                        summed_axes(plan)))
    etp = expert_tensor_axes(plan)
    if etp:  # a column/row-parallel pair whose input is each rank's own tokens: sequence-parallel typing
        slots = derived_slots("expert_tensor", etp, True)
        for o in overrides(plan):
            if o.group == "experts" and (o.target, o.verb) in ETP_VERBS:
                slots[SLOT_OF[(o.target, o.verb)]] = stated_slot(o, "expert_tensor", etp, True)
        out.append(Flow("expert_tensor", etp, True, tuple((s, slots[s]) for s in SLOTS)))
    for c in plan.groups_with_role(Role.CONTEXT):  # stated only with the region named: [context]
        slots = derived_slots("context", tuple(c), sp)
        for o in overrides(plan):
            slot = SLOT_OF[(o.target, o.verb)]
            if o.group == "context" and slot in slots:
                slots[slot] = stated_slot(o, "context", tuple(c), sp)
        if slots["bwd_exit"].verb == OverrideVerb.ALL_TO_ALL and not slots["bwd_entry"].verb:
            # Ulysses: the inverse all-to-all returns the key/value gradients to their owners, no reduce-scatter
            slots["bwd_entry"] = Slot((), slots["bwd_exit"].span, OverrideVerb.ALL_TO_ALL)
        out.append(Flow("context", tuple(c), sp, tuple((s, slots[s]) for s in SLOTS if s in slots)))
    return tuple(out)


def ce_slots(plan) -> tuple[str, ...]:
    """The slots of the cross entropy's extra terms the plan's model states (ir.losses.CE_TERMS)."""
    from .losses import CE_TERMS

    return tuple(CE_TERMS[k] for k, _ in plan.model.ce_terms)


def expert_axes(plan) -> tuple[str, ...]:
    """The axes the dispatch and combine all-to-alls range over: the expert axes (under parallel
    folding, the expert group's own expert axes)."""
    fold = views.expert_group(plan)
    if fold is not None:
        return tuple(views.group_axes(plan, fold, Role.EXPERT))
    return tuple(a for g in plan.groups_with_role(Role.EXPERT) for a in g)


def summed_axes(plan) -> tuple[str, ...]:
    """The tensor axes (Megatron TP without sequence parallelism) that split the experts too: every rank
    holds the same tokens and a shard of each expert, whose partial products are all-reduced over the
    axis, so the ranks must hold the same tokens when the experts run."""
    if plan.sequence_parallel or plan.axes_with_role(Role.SEQUENCE):
        return ()
    fold = views.expert_group(plan)
    params = plan.placement(State.PARAMS)
    return tuple(a for a in plan.axes_with_role(Role.TENSOR) if params.mode(a) in (Mode.S, Mode.S_STAR, Mode.O)
                 and (fold is None or views.role_of(plan, fold, a) is Role.TENSOR))


def expert_tensor_axes(plan) -> tuple[str, ...]:
    """The expert tensor group's own axes (parallel folding: tensor for the experts, not for the dense
    layers), over which the routed tokens are all-gathered and reduce-scattered (ir.collectives)."""
    fold = views.expert_group(plan)
    if fold is None:
        return ()
    return tuple(a for a in views.group_axes(plan, fold, Role.TENSOR)
                 if views.view(plan).role(a) not in (Role.TENSOR, Role.SEQUENCE))


# --------------------------------------------------------------------------- costs


def _moves(slot: Slot) -> list[tuple[str, tuple[str, ...]]]:
    return [(s.moved if s.kind == COPY else s.kind, s.axes) for s in slot.steps if s.kind != SLICE]


_KIND = {ALL_REDUCE: Kind.ALL_REDUCE, ALL_GATHER: Kind.ALL_GATHER, REDUCE_SCATTER: Kind.REDUCE_SCATTER,
         ALL_TO_ALL: Kind.ALL_TO_ALL}


def adjust(plan, colls: tuple[Collective, ...], per_layer, per_microbatch) -> tuple[Collective, ...]:
    """The schedule with each stated slot's collectives in place of the derived ones: a removed
    collective's count drops by the region's share (one per layer per microbatch for attention and
    mlp, one per microbatch for the head, the embedding and each of the loss's three), a stated one is added on its own axes. Under full
    recomputation a forward slot runs again in backward."""
    if not overrides(plan):
        return colls
    out = list(colls)
    again = plan.recompute is Recompute.FULL
    mesh = plan.mesh.names
    for f in flows(plan):
        if f.region == "context":
            from . import actflow_context

            out = actflow_context.adjust(plan, out, f, per_layer)
            continue
        derived = derived_slots(f.region, f.tensor, f.sp)
        per = per_microbatch if f.region in ("head", "embedding", "loss") else per_layer
        pay = (Payload(PayloadTensor.TOKEN_SCALARS, (), "one fp32 value per token (s·b·4)") if f.region == "loss" else
               Payload(PayloadTensor.TOKENS, (), "routed tokens (s·b·h·top_k·capacity_factor)") if f.region == "experts" else
               Payload(PayloadTensor.EXPERT_TOKENS, f.tensor, "routed tokens gathered over the expert tensor group "
                       "(s·b·h·top_k·capacity_factor × its size)") if f.region == "expert_tensor" else
               Payload(PayloadTensor.ACTIVATION, (), "layer input/output activations (s·b·h)"))
        for name, slot in f.slots:
            if not slot.verb or name == VOCAB:  # the vocabulary size: each rank knows it from the shapes
                continue
            if name.startswith("fwd") or name in LOSS_SLOTS or name in CE_SLOTS:
                # the embedding and the loss lie outside the recomputed layers
                phases = [Phase.FORWARD, Phase.BACKWARD] if again and f.region not in (
                    "embedding", "loss", "experts", "expert_tensor") \
                    else [Phase.FORWARD]
            else:
                phases = [Phase.BACKWARD]
            for phase in phases:
                for kind, axes in _moves(derived[name]):
                    out = _take(out, _KIND[kind], phase, axes, per, f.region)
                for kind, axes in _moves(slot):
                    group = tuple(a for a in mesh if a in axes)
                    out.append(Collective(_KIND[kind], State.ACTIVATIONS, group, link_of(plan, group), phase, per,
                                          pay, f"override {('activation_grads' if name.startswith('bwd') else 'activations')}"
                                          f"[{f.shown}] (line {slot.span.line}): "
                                          f"{kind.replace('_', '-')} over ({', '.join(axes)})"))
            if name == "fwd_entry" and f.sp and f.region in ("attention", "mlp", "head"):
                # Megatron-LM gathers a column-parallel input again in backward for the weight gradient,
                # as the forward gathered it (ir.collectives): the re-gather follows the stated slot
                for kind, axes in _moves(derived[name]):
                    out = _take(out, _KIND[kind], Phase.BACKWARD, axes, per, f.region,
                                (REGATHER + (': the head' if f.region == 'head' else ': the 2'),))
                for kind, axes in _moves(slot):
                    group = tuple(a for a in mesh if a in axes)
                    out.append(Collective(_KIND[kind], State.ACTIVATIONS, group, link_of(plan, group), Phase.BACKWARD,
                                          per, pay, f"override activations[{f.region}] (line {slot.span.line}): "
                                          f"{kind.replace('_', '-')} over ({', '.join(axes)}), again in backward "
                                          "for the weight gradient"))
    return tuple(out)


REGATHER = "Megatron SP (weight gradient)"  # the rule of the derived backward re-gathers (ir.collectives)


def _take(colls: list, kind: Kind, phase: Phase, axes: tuple[str, ...], per, region: str,
          rules: tuple[str, ...] = ()) -> list:
    """Lower the count of the derived activation collective that holds this slot's share."""
    want = rules or {"head": ("vocabulary-parallel head", "Megatron SP: the head"),
            "embedding": ("vocabulary-parallel embedding", "Megatron SP: the embedding"),
            "loss": ("vocabulary-parallel cross entropy",), "experts": ("expert parallel",),
            "expert_tensor": ("expert tensor parallel",)}.get(
        region, ("Megatron TP", "Megatron SP: 2"))
    for i, c in enumerate(colls):
        if c.kind is kind and c.phase is phase and c.axes == axes and c.state is State.ACTIVATIONS \
                and c.rule.startswith(want):
            count = Const(Fraction(0)) if c.count == per else Op("-", (c.count, per))
            colls[i] = replace(c, count=count)
            return colls
    return colls


KIND_TEXT = {"R": "replicated", "P": "partial (each rank holds a summand)", "S": "sharded along the sequence",
             "C": "sharded along the hidden columns", "V": "each rank's own samples",
             "Q": "partial and sliced (each rank holds a summand of its own sequence slice)",
             "W": "wrong (elements that do not belong together were combined)",
             "L": "shifted by a different constant on each rank (each subtracted its own local max logit)",
             "H": "sharded along the heads (the whole sequence of the rank's heads)",
             "X": "routed to the wrong expert or returned to the wrong token"}


def type_text(t: tuple) -> str:
    if t[1] and t[0] in ("R", "S"):
        extra = "once too often" if t[1] == 1 else f"{t[1]} times too often"
        return (f"{KIND_TEXT[t[0]]} but summed over its axes {t[1] + 1} times, {extra} (each extra sum multiplies it by "
                "the axis size)")
    return KIND_TEXT[t[0]]
