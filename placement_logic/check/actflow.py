"""The typing of activations and activation gradients through a tensor-parallel layer region.

Input: an ``ir.Plan`` and its axis roles. Output: an ``ActModel`` (plain frozen data): one
``Typed`` per region (``ir.actflow``: attention, mlp, head, embedding) and tensor group, with the type its
forward output and its input gradient have on every mesh axis, and the override that makes either
wrong. ``act_obligations`` states two obligations per region, each with a z3 negation (some axis on
which the type is wrong has two or more ranks) and a concrete replay (``check.actflow_replay``).

Per mesh axis a value has one of the types of docs/semantics.md (DTensor's names): R replicated
(with a multiplier n^k after k extra sums), P partial, S sharded along the sequence, C sharded along
the hidden columns (a column-parallel linear's output), V varying (different samples: every
non-tensor axis), W wrong (a collective that mixes elements that do not belong together), Q a partial value sliced along
the sequence (DTensor's Replicate -> Shard applied to a value that is really Partial). A
collective changes the type along its axes: all-reduce P -> R, R -> R·n; all-gather S -> R;
reduce-scatter P -> S, R -> S·n; a local slice R -> S; anything else W. The column-parallel linear
takes R to C, the row-parallel linear C to P; in backward the row-parallel linear's input gradient
takes R to C and the column-parallel linear's C to P; the embedding's masked lookup takes R (the
token ids) to P. A region is right on an axis when its
forward output (input gradient) has the type the next operation needs there: R under tensor
parallelism, S under sequence parallelism, C for the head's logits, R for the output gradient the
embedding's weight gradient reads, V on every other axis. On an
axis of one rank every type is the value itself, so a wrong type is a wrong value exactly when its
axis has two or more ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir import actflow as af
from ..ir.overrides import OverrideTarget

Type = tuple[str, int]  # (kind, extra sums)


@dataclass(frozen=True)
class Typed:
    flow: af.Flow
    direction: str  # "forward" | "backward"
    result: tuple[tuple[str, Type], ...]  # axis -> the type reached
    needed: tuple[tuple[str, str], ...]  # axis -> the kind the next operation needs
    bad: tuple[str, ...]  # axes whose type is wrong
    cause: tuple[tuple[str, str, Span], ...]  # axis -> (slot, span) where it first departs from the derived flow

    @property
    def name(self) -> str:
        target = OverrideTarget.ACTIVATIONS if self.direction == "forward" else OverrideTarget.ACTIVATION_GRADS
        return f"{target}[{self.flow.shown}]"


@dataclass(frozen=True)
class ActModel:
    typed: tuple[Typed, ...] = ()


_COLL = {
    af.ALL_REDUCE: {"P": "R", "R": "R+"},
    af.ALL_GATHER: {"S": "R"},
    af.REDUCE_SCATTER: {"P": "S", "R": "S+"},
    af.SLICE: {"R": "S", "P": "Q"},
}
_LOCAL = {"column": {"R": "C"}, "row": {"C": "P"}, "row_back": {"R": "C"}, "col_back": {"C": "P"},
          "lookup": {"R": "P"}}


def _coll(t: Type, kind: str) -> Type:
    if kind == af.COPY:
        return t
    to = _COLL[kind].get(t[0])
    if to is None:
        return ("W", 0)
    return (to[0], t[1] + (1 if to.endswith("+") else 0))


def _local(t: Type, op: str, tensor: bool) -> Type:
    if not tensor:
        return t if t[0] == "V" else ("W", 0)
    to = _LOCAL[op].get(t[0])
    return (to, t[1]) if to else ("W", 0)


def _run(flow: af.Flow, slots: dict[str, af.Slot], axes: tuple[str, ...], direction: str
         ) -> list[tuple[str, dict[str, Type]]]:
    """The types after each stage: (stage name, axis -> type)."""
    t = flow.tensor
    start = "S" if flow.sp else "R"
    if flow.region == "embedding":  # the token ids are whole on every tensor rank; the lookup is masked
        plan = [("lookup", "lookup"), ("fwd_exit", None)] if direction == "forward" else [("bwd_exit", None)]
        start = "R" if direction == "forward" else start
    elif direction == "forward":
        plan = [("fwd_entry", None), ("column", "column")]
        if flow.has_row:
            plan += [("row", "row"), ("fwd_exit", None)]
    else:
        start = "C" if not flow.has_row else start
        plan = [("bwd_exit", None), ("row_back", "row_back")] if flow.has_row else []
        plan += [("col_back", "col_back"), ("bwd_entry", None)]
    cur = {a: ((start, 0) if a in t else ("V", 0)) for a in axes}
    out = []
    for stage, op in plan:
        if op is not None:
            cur = {a: _local(x, op, a in t) for a, x in cur.items()}
        else:
            for s in slots[stage].steps:
                for a in s.axes:
                    if a in cur:
                        cur[a] = _coll(cur[a], s.kind)
        out.append((stage, dict(cur)))
    return out


def needed_kind(flow: af.Flow, direction: str) -> str:
    """What the next operation needs on the tensor axes: the head's logits column-sharded, the
    embedding's weight gradient the whole output gradient (it picks the rows of its vocabulary slice
    from every position), every other region's output and input gradient replicated (sharded under
    sequence parallelism)."""
    if flow.region == "head" and direction == "forward":
        return "C"
    if flow.region == "embedding" and direction == "backward":
        return "R"
    return "S" if flow.sp else "R"


def typed(flow: af.Flow, axes: tuple[str, ...], direction: str) -> Typed:
    if flow.region == "loss":
        from .actflow_loss import typed as loss_typed

        return loss_typed(flow, axes, direction, _coll, Typed)
    if flow.region == "experts":
        from .actflow_experts import typed as experts_typed

        return experts_typed(flow, axes, direction, Typed)
    if flow.region == "context":
        from .actflow_context import typed as context_typed

        return context_typed(flow, axes, direction, _coll, Typed)
    slots = dict(flow.slots)
    derived = af.derived_slots(flow.region, flow.tensor, flow.sp)
    got, ref = _run(flow, slots, axes, direction), _run(flow, derived, axes, direction)
    want = needed_kind(flow, direction)
    needed = {a: (want if a in flow.tensor else "V") for a in axes}
    final = got[-1][1]
    bad = tuple(a for a in axes if final[a] != (needed[a], 0))
    cause = []
    for a in bad:
        stage = next((s for (s, g), (_, r) in zip(got, ref) if g[a] != r[a]), got[-1][0])
        slot = slots.get(stage)
        cause.append((a, stage, slot.span if slot is not None else NO_SPAN))
    return Typed(flow, direction, tuple(final.items()), tuple(needed.items()), bad, tuple(cause))


def model(plan: ir.Plan, axes: tuple[str, ...], tensor: tuple[str, ...]) -> ActModel:
    stated = af.overrides(plan)
    flows = af.flows(plan)
    for o in stated:
        if _context_misfit(o, flows) or _experts_misfit(o, flows):
            continue
        if not [f for f in flows if f.region not in ("experts", "context")]:
            why = ("the plan has no tensor-parallel axis" if not tensor else
                   f"its params are whole on every rank of {', '.join(tensor)}")
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override {o.target}{_grp(o)}: {o.verb} changes nothing: {why}, so no layer region splits "
                "its activations", o.span)])
        slot = af.SLOT_OF[(o.target, o.verb)]
        if o.verb in af.CE_VERBS and af.CE_TERM_OF_SLOT[slot] not in af.ce_slots(plan):
            from ..ir.losses import CE_TERMS

            key = next(k for k, v in CE_TERMS.items() if v == af.CE_TERM_OF_SLOT[slot])
            what = {"smoothing": "smoothing term to reduce", "zloss": "z-loss (its own log-sum-exp) to reduce",
                    af.VOCAB: "smoothing term whose vocabulary size to count"}[slot]
            raise DiagnosticError([Diagnostic(
                Code.CE_TERM_UNSTATED, f"override {o.target}{_grp(o)}: {o.verb}: the model's losses section states no "
                f"{key}, so the cross entropy has no {what}", o.span,
                notes=(f"state it in the model: losses {{ {key} = true }}",))])
        if o.group == "embedding" and slot not in af.REGION_SLOTS["embedding"]:
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override {o.target}[embedding]: {o.verb} changes nothing: the vocabulary-parallel "
                "embedding has no column-parallel linear and its input (token ids) no gradient, so nothing is "
                "gathered before it or reduced after its backward (its slots: activations: reduce/assert_*, "
                "activation_grads: gather)", o.span)])
        if o.group == "loss" and slot not in af.REGION_SLOTS["loss"]:
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override {o.target}[loss]: {o.verb} changes nothing: the vocabulary-parallel cross "
                "entropy's collectives are its three all-reduces (activations[loss]: reduce_max, reduce_target, "
                "reduce_sumexp); its backward needs none", o.span)])
        if o.verb in af.LOSS_VERBS and o.group not in (None, "loss"):
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override {o.target}[{o.group}]: {o.verb} changes nothing: only the vocabulary-parallel "
                "cross entropy (activations[loss]) reduces the max logit, the target's logit and the sum of "
                "exponentials", o.span)])
        if o.group == "head" and slot not in ("fwd_entry", "bwd_entry"):
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override {o.target}[head]: {o.verb} changes nothing: the output layer has no "
                "row-parallel linear, so its logits are neither reduced nor gathered after it (its slots: "
                "activations: gather, activation_grads: reduce/no_reduce/reduce_copy/assert_*)", o.span)])
        if o.verb in af.DECLARES:
            off = [a for a in o.axes or () if a not in tensor]
            if off or not o.axes:
                raise DiagnosticError([Diagnostic(
                    Code.ACTIVATION_ASSERT_OFF_TENSOR, f"override {o.target}{_grp(o)}: {o.verb} over ({', '.join(o.axes or ())}): an "
                    "activation's type is asserted over the tensor axes only "
                    f"({', '.join(tensor)}); over {', '.join(off) or 'no axis'} it is the samples of different "
                    "ranks, which no placement describes", o.span)])
    return ActModel(tuple(typed(f, axes, d) for f in flows for d in ("forward", "backward")))


def _experts_misfit(o, flows) -> bool:
    """True for a statement on the MoE layer's all-to-alls that fits (raises PL506 for one that
    changes nothing); False for every other statement."""
    if o.verb not in af.EXPERT_VERBS and o.group != "experts":
        return False
    etp = next((f.tensor for f in flows if f.region == "expert_tensor"), ())
    if o.verb not in af.EXPERT_VERBS and (o.target, o.verb) in af.ETP_VERBS and etp:
        off = [a for a in o.axes or () if a not in etp]
        if o.verb in af.DECLARES and (off or not o.axes):
            raise DiagnosticError([Diagnostic(
                Code.ACTIVATION_ASSERT_OFF_TENSOR, f"override {o.target}[experts]: {o.verb} over ({', '.join(o.axes or ())}): "
                f"the routed tokens' type is asserted over the expert tensor axes only ({', '.join(etp)}); over "
                f"{', '.join(off) or 'no axis'} they are the tokens of different ranks, which no placement describes",
                o.span)])
        return True
    if o.verb not in af.EXPERT_VERBS:
        why = ("the MoE layer's collectives are its dispatch and combine all-to-alls (activations[experts], "
               "activation_grads[experts]: dispatch, combine)" + (
                   ", and the all-gather and reduce-scatter of the routed tokens over an expert tensor group of its "
                   "own (gather, reduce), which this plan does not have: no axis is tensor for the experts only "
                   "(group experts { role = {AXIS: tensor} })" if (o.target, o.verb) in af.ETP_VERBS else ""))
    elif o.group not in (None, "experts"):
        why = f"only the MoE layer (experts) dispatches and combines tokens, not {o.group}"
    elif not any(f.region == "experts" for f in flows):
        why = "the plan has no expert axis, so every rank holds every expert and no token is sent anywhere"
    else:
        return True
    raise DiagnosticError([Diagnostic(
        Code.OVERRIDE_NO_EFFECT, f"override {o.target}{_grp(o)}: {o.verb} changes nothing: {why}", o.span)])


CONTEXT_VERBS = {("activations", "gather"), ("activation_grads", "gather"), ("activation_grads", "reduce"),
                 ("activation_grads", "no_reduce"), ("activation_grads", "reduce_copy"),
                 ("activations", "all_to_all"), ("activation_grads", "all_to_all")}


def _context_misfit(o, flows) -> bool:
    """True for a statement on context parallelism's attention exchange that fits (raises PL506 for
    one that changes nothing); False for every other statement."""
    if o.group != "context" and o.verb != af.ALL_TO_ALL:
        return False
    if o.group != "context":
        why = (f"only context parallelism's attention (activations[context], activation_grads[context]) has "
               f"Ulysses' all-to-all, not {o.group or 'every region'}")
    elif (o.target, o.verb) not in CONTEXT_VERBS:
        why = ("context parallelism's collectives are the key/value exchange (activations[context]: gather, "
               "activation_grads[context]: gather) and the key/value gradients' reduce-scatter "
               "(activation_grads[context]: reduce, no_reduce, reduce_copy), or Ulysses' all-to-all pair around the "
               "attention (all_to_all)")
    elif not any(f.region == "context" for f in flows):
        why = "the plan has no context-parallel axis, so every rank holds the whole sequence and exchanges nothing"
    else:
        return True
    raise DiagnosticError([Diagnostic(
        Code.OVERRIDE_NO_EFFECT, f"override {o.target}{_grp(o)}: {o.verb} changes nothing: {why}", o.span)])


def _grp(o) -> str:
    return f"[{o.group}]" if o.group else ""
