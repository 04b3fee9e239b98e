"""Statements a plan makes once: the router's top-k choice (``override router: ...``), the MoE capacity
step (``capacity: ...``: whether padding takes slots, what a dropped pair adds, the renormalisation, each once), the
sliding-window and the chunked-attention behaviour of the causal mask (``layout[causal_mask]: window_* | chunk_*``),
a per-token tensor's layout (``layout[T]: zigzag | ptrr | pad_to_chunks | ...``), the fp8 scaling granularity
of a group (``amax[g]: blockwise | rowwise``), the head split of one pair of Ulysses' all-to-alls
(``heads[P]: ...``) and the checkpoint's resharding, re-gather, RNG and skipped optimizer (``checkpoint:
reshard over (AXES) | no_regather_after_load | rng_shared, rng_not_restored or
rng_by_coordinates | skip_optimizer``), a loss term's path, divisor and token count reduction (``loss[T]:
VERB``, ``loss[T]: divide by X``, ``tokens[T]: reduce over (AXES)``), the loss computed on the gathered sequence
(``loss: on_gathered_sequence over (AXES)``, ir.lossgather), per context axis the length a per-sequence token mean
divides a rank's part of a sequence by (``tokens[T]: per_sequence_local | per_sequence_gathered over (AXES)``),
and what a named region's activations or their gradients do at one point of its flow over the same axes
(``activation_grads[R]: assert_output_* over (AXES)``, ``activations[R]: reduce over (AXES)``, ...). The checker
reads one statement of each (check.router, check.encode_capacity, check.cpwindow, check.encode_cplayout,
check.amax_blocks, ir.actflow_context, check.checkpoint, check.losses, ir.actflow), so a second one (the same
again, or a contradicting one) would silently replace the first: PL291, located at the second, the first's
line in the message. The axes of a router, checkpoint or sequence length statement are the axes it applies on, not
a reduction's (where an axis named twice is a reduction made twice, ``grads: reduce over (dp, dp)``): an axis
named twice there is PL106 (an amax granularity's is check.amax_blocks's PL506; a gathered loss's is ir.lossgather's PL292).

Input: an ``ir.Plan``. Output: (code, message, span, notes) per problem, reported where the plan is resolved.
"""

from __future__ import annotations

from ..diagnostics import Code
from .actflow import EXPERT_VERBS, PARTIAL_OPS, SLOT_OF
from .losses import LENGTH_VERBS, PATH_VERBS
from .overrides import OverrideTarget, OverrideVerb
from .walker import show

WINDOW = (OverrideVerb.WINDOW_DROPPED, OverrideVerb.WINDOW_LOCAL, OverrideVerb.WINDOW_ON_DIAGONAL,
          OverrideVerb.WINDOW_ACROSS_DOCUMENTS)
CHUNK = (OverrideVerb.CHUNK_DROPPED, OverrideVerb.CHUNK_LOCAL, OverrideVerb.CHUNK_ON_DIAGONAL)
# the capacity step's three separate questions (check.encode_capacity, check.encode_capdrop): whether padding
# takes slots, what a dropped pair adds, and over which experts the kept gate weights are renormalised
CAPACITY_FAMILIES = {**{v: "padding" for v in (OverrideVerb.MASKS_PADDING, OverrideVerb.COUNTS_PADDING)},
                     **{v: "dropped pairs" for v in (OverrideVerb.DROPS_ZEROED, OverrideVerb.DROPPED_UNINITIALISED,
                                                     OverrideVerb.DROPPED_WEIGHTED)},
                     **{v: "renormalisation" for v in (OverrideVerb.RENORMALISE_KEPT,
                                                       OverrideVerb.RENORMALISE_DROPPED)}}
GRANULARITY = (OverrideVerb.BLOCKWISE, OverrideVerb.ROWWISE)
# the checkpoint behaviours check.checkpoint reads from the last statement (the writers' and readers' combine)
CHECKPOINT_ONCE = (OverrideVerb.RESHARD, OverrideVerb.NO_REGATHER_AFTER_LOAD, OverrideVerb.RNG_SHARED,
                   OverrideVerb.SKIP_OPTIMIZER)
# how the saved RNG states are put back: one statement of the two (they contradict each other)
# a loss term's path, divisor and token count reduction (check.losses reads the last of each)
TERM_PATH = tuple(v for v in PATH_VERBS if v != OverrideVerb.DIVIDE)
RNG_RESTORE = (OverrideVerb.RNG_SHARED, OverrideVerb.RNG_NOT_RESTORED, OverrideVerb.RNG_BY_COORDINATES)


def family(o) -> str | None:
    """The name of the statement's once-only family (its group included), or None where statements of its
    target combine (reductions, several loss or checkpoint behaviours, ...)."""
    group = f"[{o.group}]" if o.group else ""
    if o.target == OverrideTarget.ROUTER and o.verb in (OverrideVerb.COUNTS_REDUCE, OverrideVerb.COUNTS_RECOMPUTED):
        return f"router{group}: {o.verb}"
    if o.target in (OverrideTarget.ROUTER, OverrideTarget.HEADS):
        return f"{o.target}{group}"
    if o.target == OverrideTarget.CAPACITY:
        return f"capacity{group} ({CAPACITY_FAMILIES.get(o.verb, o.verb)})"
    if o.target == OverrideTarget.LAYOUT:
        if o.verb in WINDOW:
            return f"layout{group}: window_*"
        return f"layout{group}: chunk_*" if o.verb in CHUNK else f"layout{group}"
    if o.target == OverrideTarget.AMAX and o.verb in GRANULARITY:
        return f"amax{group}: blockwise | rowwise"
    if o.target == OverrideTarget.CHECKPOINT and o.verb in RNG_RESTORE:
        return f"checkpoint{group}: rng_shared | rng_not_restored | rng_by_coordinates"
    if o.target == OverrideTarget.CHECKPOINT and o.verb in CHECKPOINT_ONCE:
        return f"checkpoint{group}: {o.verb}"
    if o.target == OverrideTarget.LOSS and o.verb == OverrideVerb.ON_GATHERED_SEQUENCE:
        return f"loss{group}: on_gathered_sequence"
    if o.group is not None and o.target == OverrideTarget.LOSS and o.verb in PATH_VERBS:  # a loss term's (check.losses)
        return f"loss{group}: divide" if o.verb == OverrideVerb.DIVIDE else f"loss{group}: {' | '.join(TERM_PATH)}"
    if o.group is not None and o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.REDUCE:
        return f"tokens{group}: reduce"
    return None


def _families(o) -> list[str]:
    """The once-only families of the statement: a sequence length statement's one per axis it names; a region's
    activation statement's its slot in the region's flow over the same axes (ir.actflow: the last one wins)."""
    if o.target == OverrideTarget.TOKENS and o.verb in LENGTH_VERBS:
        return [f"tokens[{o.group}]: per_sequence_local | per_sequence_gathered over ({a})"
                for a in dict.fromkeys(o.axes or ())]
    slot = SLOT_OF.get((o.target, o.verb))
    if slot and o.group is not None and o.verb not in PARTIAL_OPS + EXPERT_VERBS + (OverrideVerb.ALL_TO_ALL,):
        return [f"{o.target}[{o.group}] at the {slot.replace('_', ' ')} of its flow over ({', '.join(o.axes or ())})"]
    kind = family(o)
    return [kind] if kind is not None else []


def _head(o) -> str:
    text = f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb}"
    text += f" over ({', '.join(o.axes)})" if o.axes is not None else ""
    return text + (f" by {show(o.by)}" if o.by is not None else "")


def problems(plan) -> list[tuple[str, str, object, tuple[str, ...]]]:
    out = []
    first: dict[str, object] = {}
    for o in plan.overrides:
        twice = [a for i, a in enumerate(o.axes or ()) if a in (o.axes or ())[:i]]
        if twice and (o.target in (OverrideTarget.ROUTER, OverrideTarget.CHECKPOINT) or (  # amax's: check.amax_blocks
                o.target == OverrideTarget.TOKENS and o.verb in LENGTH_VERBS)):
            out.append((Code.DUPLICATE_AXIS, f"{_head(o)}: axis '{twice[0]}' is named twice (the statement says "
                        "what the ranks of each axis do, once)", o.span, ()))
        for kind in _families(o):
            if kind in first:
                was = first[kind]
                same = was.verb == o.verb and (was.axes == o.axes or o.verb in LENGTH_VERBS) and was.by == o.by
                out.append((Code.OVERRIDE_RESTATED, f"{_head(o)}: {'repeats' if same else 'contradicts'} "
                            f"{_head(was)} (line {was.span.line}); the plan states {kind} once", o.span,
                            ("keep the one statement that describes the system",)))
                break
            first[kind] = o
    return out
