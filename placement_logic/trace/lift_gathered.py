"""The loss computed on a sequence all-gathered over a context axis, read from a trace (no torch).

Input: the step's collectives on every rank, each rank's cross-entropy records (``input_collectives``: the
collectives whose output the logits hold, followed by ``recorder_terms`` through views, copies and constant
scales), the axes' roles. Output: the axes the loss is gathered over (``gathered_axes``, from ``axes_pass``:
such an axis is a context axis, ``context_parallel``) and the plan's line ``override loss: on_gathered_sequence
over (AXES)`` at the gather (``gathered_lines``); what cannot be told is added to ``st.items`` (PL614).

A sequence gather is a forward ``all_gather`` over data axes that carries no parameter and runs over no axis
the parameters are sharded on (not FSDP's or ZeRO-3's parameter gather): under Ulysses sequence parallelism
each rank holds a slice of every sequence and gathers its per-token outputs over the group before the loss
(verl's ``gather_outputs_and_unpad``, verl-project/verl#1963). It is lifted where every cross-entropy of the
step on every rank reads the gathered output, over one axis; where a cross-entropy does not show it (the
logits may be computed from the gathered tensor by ops the events do not follow: a head applied after the
gather; the loss computed without ``F.cross_entropy``; some ranks only) or the gather runs over two axes,
whether the loss is computed on the gathered sequence is not lifted, and it is named, never proved (a data
axis would count each rank's whole-sequence tokens as its own).
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames, _placement_axes
from .lift_step import Axes, LiftRole, Step

_WHAT = "the loss over a gathered sequence"


def _gathers(st: Step, ax: Axes, sharded: set[str], r: int) -> list[dict]:
    """Rank ``r``'s sequence gathers of the step."""
    out = []
    for c in st.ranks[r]["collectives"]:
        over = st.axes(c, r)
        if c["step"] == st.step_no and c["kind"] == "all_gather" and c["phase"] == "forward" and not c["carried"] \
                and over and all(ax.roles.get(a) in (LiftRole.DATA, LiftRole.CONTEXT) and a not in sharded
                                 for a in over):
            out.append(c)
    return out


def _read(st: Step, gathers: list[dict], r: int) -> bool:
    """Whether rank ``r`` recorded a cross-entropy in the step and every one reads one of its sequence gathers."""
    seqs = {c["seq"] for c in gathers}
    nll = (st.step.get(r) or {}).get("nll") or []
    return bool(nll) and all(seqs & set(n.get("input_collectives") or ()) for n in nll)


def gathered_axes(st: Step, ax: Axes, params: list[dict]) -> tuple[tuple[str, ...], list[dict]]:
    """(the axes the loss is computed on the gathered sequence over, the frames of the gathers); their roles set to
    context. What cannot be told is added to ``st.items``."""
    sharded = {a for p in params for a in _placement_axes(p, st.layout)}
    found = {r: _gathers(st, ax, sharded, r) for r in st.ranks}
    if not any(found.values()):
        return (), []
    first = next(c for r in sorted(found) for c in found[r])
    stack = tuple(first["stack"])
    over = tuple(sorted({a for r, cs in found.items() for c in cs for a in st.axes(c, r)},
                        key=st.layout.names.index))
    frames = _frames([c["stack"] for cs in found.values() for c in cs], st.script)
    reads = {r: _read(st, cs, r) for r, cs in found.items() if cs}
    where = f"an all_gather ({first['api']}) over ({', '.join(over)}) in forward of a tensor that is no parameter"
    if len(reads) != len(st.ranks) or set(reads.values()) != {True}:
        # some ranks gather and others do not, or a cross-entropy that does not show the gathered output: the
        # logits may still be computed from it by ops the events do not follow (a head applied after the gather)
        st.items.append(Unliftable(tuple(sorted(r for r in st.ranks if reads.get(r) is not True)), first["seq"], _WHAT,
                                   f"{where}: whether the loss is computed on the gathered sequence is not observed "
                                   "(the cross-entropy's logits do not hold the gathered output through views, "
                                   "copies or constant scales on every rank, no cross-entropy was recorded, or some "
                                   "ranks do not gather)", stack, hides=("divisor",)))
        return (), []
    ring = [a for a in st.layout.names if ax.roles.get(a) is LiftRole.CONTEXT and a not in over]
    if len(over) > 1 or ring:
        why = "two axes" if len(over) > 1 else f"an axis other than the ring-attention axis {ring[0]}"
        st.items.append(Unliftable((st.observer,), first["seq"], _WHAT, f"{where}, the loss computed on it: a "
                                   f"sequence gathered over {why} is not lifted (one context axis)", stack,
                                   hides=("divisor",)))
        return (), []
    for a in over:
        ax.roles[a] = LiftRole.CONTEXT
    return over, frames


def gathered_lines(st: Step, ax: Axes, tokens_reduced: bool, kind: str) -> list[tuple[str, list]]:
    """The plan's ``loss: on_gathered_sequence`` line; a divided loss whose count is not observed all-reduced is
    named (the count's ranks under the gather are not lifted)."""
    if not ax.gathered:
        return []
    shown = ", ".join(ax.gathered)
    if kind == "global_mean" and not tokens_reduced:
        st.items.append(Unliftable((st.observer,), -1, _WHAT, f"the loss is computed on the sequence gathered over "
                                   f"({shown}), and the token count it is divided by is not observed all-reduced: "
                                   "which ranks' counts it holds is not lifted", tuple(ax.gathered_frames[:1]),
                                   hides=("divisor",)))
    return [(f"  override loss: on_gathered_sequence over ({shown})  # observed: the cross-entropy reads the "
             f"per-token outputs all-gathered over ({shown}), every rank's count the whole sequence's",
             ax.gathered_frames)]
