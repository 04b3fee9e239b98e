"""Facts of a traced step beyond the gradient programs: split weights, overflow-flag reductions, and what the
script does that no plan statement reads (no torch).

- ``split_by_values``: ranks along an axis that see the same inputs and hold parameters of the same names
  with different values before the first update hold slices of the weights (tensor parallelism written by
  hand over plain tensors): the axis splits the weights.
- (layers left partial over the tensor axis, input gradients never reduced: ``lift_activations``)
- ``overflow``: a one-element all-reduce of a 0/1 flag with MAX after backward is the loss-scale overflow
  decision: ``override overflow: reduce over (...)`` on the axes it ran over; another MAX/MIN/product
  reduction is reported, but for one over the tensor axis alone in forward (a vocabulary-parallel softmax).
- ``local_overflow``: GradScaler's found-inf flag, set from each rank's own gradients and never reduced while they
  differ between ranks, is ``override loss_scale: local over (...)``.
- ``unmodelled``: the recorder's unmodelled calls (a collective in a custom autograd function's backward; in
  traces of earlier recorders, checkpoint save and load and the RNG state set, which ``lift_checkpoint`` now reads), RNG seeds that differ between ranks, and a loss that is no
  constant multiple of the cross-entropy (an auxiliary term) are reported, each naming what is missing.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .lift_layout import Unliftable, _frames, _Layout

LINEAR_OPS = ("sum", "avg", "premul_sum", "")
LOCAL_OVERFLOW = "a loss-scale overflow check (GradScaler's unscale_)"  # the recorder's name for it


def local_overflow(items: list[Unliftable], overflow_line, bindings: dict[str, str], script: str = "",
                   notes: list[str] | None = None) -> tuple[tuple | None, list[Unliftable]]:
    """GradScaler's found-inf flag is set from each rank's own gradients. Where a flag reduction was read
    (``override overflow``, which the checker checks) or every axis holds whole reduced gradients (DDP's, ZeRO-1's:
    equal on every rank, so every rank decides alike) it is what the plan derives; over gradients that differ
    between ranks (sharded: ZeRO-2/3, FSDP, tensor or pipeline parallelism) with no reduction of the flag, each rank
    updates its loss scale from its own flag: ``override loss_scale: local over (...)`` at the scaler's line (the
    step skipped per rank too, in a note). (the line or None, the items left)"""
    out, line = [], None
    apart = [a for a, b in bindings.items() if b not in ("ddp", "zero1")]
    for u in items:
        if u.what != LOCAL_OVERFLOW:
            out.append(u)
        elif overflow_line is None and apart and line is None:
            line = (f"  override loss_scale: local over ({', '.join(apart)})  # observed: GradScaler's found-inf "
                    "flag set from each rank's own gradients and never all-reduced, while the gradients differ "
                    "along " + ", ".join(f"{a} ({bindings[a]})" for a in apart), _frames([u.stack], script))
            if notes is not None:
                notes.append("the loss scale's found-inf flag is never all-reduced: each rank also decides alone "
                             "whether to skip the step (lifted as loss_scale: local, which the checker refutes)")
    return line, out


def split_by_values(initial: dict, layout: _Layout, observer: int, axis: str) -> bool:
    """Plain parameters of the same name whose values differ between the observer and its neighbour along
    ``axis`` before the first update (DTensor parameters carry their placements instead)."""
    other = layout.neighbour(observer, axis)
    mine, theirs = initial.get(observer, {}), initial.get(other, {}) if other is not None else {}
    return any(not p.get("placements") and n in theirs and p.get("checksum")
               and theirs[n].get("checksum") not in (None, p["checksum"]) for n, p in mine.items())


def overflow(step_colls: list[dict], axes, observer: int, script: str, tp: str | None = None) -> tuple[
        tuple | None, set[int], list[Unliftable]]:
    """(the overflow line, the seqs of the non-linear reductions read here, reported items). A MAX over the tensor
    axis alone in forward is a vocabulary-parallel softmax's (its logits' maximum), part of the loss."""
    line, seen, items = None, set(), []
    for c in step_colls:
        if c["kind"] != "all_reduce" or c.get("op", "sum") in LINEAR_OPS:
            continue
        if tp is not None and c["phase"] == "forward" and axes(c) == (tp,):
            continue
        seen.add(c["seq"])
        flag = c["numel"] == 1 and c.get("value_in") in (0.0, 1.0) and c["op"] == "max" \
            and c["phase"] in ("backward", "after_backward", "optimizer")
        if flag and line is None:
            over = axes(c)
            line = (f"  override overflow: reduce over ({', '.join(over)})  # observed: a found-inf flag "
                    "all-reduced with MAX", _frames([c["stack"]], script))
        elif not flag:
            items.append(Unliftable((observer,), c["seq"], f"an all-reduce {c['op'].upper()} ({c['api']})",
                                    f"a {c['op']} reduction of {c['numel']} element(s) in {c['phase']} that is no "
                                    "loss-scale overflow flag: what the script does with it is not lifted",
                                    tuple(c["stack"]), (c["seq"],)))
    return line, seen, items


def unmodelled(ranks: dict, step_no: int, step: dict, loss_rank: int) -> list[Unliftable]:
    items: dict[tuple, Unliftable] = {}
    for r, part in sorted(ranks.items()):
        for u in part.get("unmodelled", []):
            st = tuple(u.get("stack") or ())
            key = (u["what"], tuple((f["file"], f["line"]) for f in st[:1]))
            prev = items.get(key)
            # a collective in a custom backward changes gradients through autograd, which no program follows
            hides = ("reductions", "divisor") if u["what"].startswith("a collective (") else ()
            items[key] = Unliftable(tuple(sorted(set((prev.ranks if prev else ()) + (r,)))), -1, u["what"],
                                    u.get("detail") or "not lifted", st, hides=hides)
    out = list(items.values())
    out.extend(_seeds(ranks, step_no))
    # the step analysed only: a pipelining schedule's shape inference runs the loss once more in its first step,
    # on tensors whose values are arbitrary (a cross-entropy that may even come out finite)
    out.extend(_auxiliary([s for s in ranks[loss_rank]["steps"] if s["step"] == step_no], loss_rank))
    return out


def _seeds(ranks: dict, step_no: int) -> list[Unliftable]:
    """Ranks seeded apart: the seeds of their torch.manual_seed calls (or the step's initial seed) differ."""
    called = {r: [s["seed"] for s in part.get("seeds", [])] for r, part in ranks.items()}
    initial = {r: next((s.get("seed") for s in part["steps"] if s["step"] == step_no), None)
               for r, part in ranks.items()}
    if len({tuple(v) for v in called.values()}) <= 1 and len(set(initial.values())) <= 1:
        return []
    r0 = min(ranks)
    diff = next((r for r in sorted(ranks) if called[r] != called[r0]), None)
    stack = ()
    if diff is not None:
        i = next((i for i, (a, b) in enumerate(zip(called[r0], called[diff])) if a != b), 0)
        calls = ranks[diff].get("seeds", []) or ranks[r0].get("seeds", [])
        stack = tuple(calls[min(i, len(calls) - 1)].get("stack") or ()) if calls else ()
        shown = f"rank {r0}: {', '.join(called[r0]) or 'none'}; rank {diff}: {', '.join(called[diff]) or 'none'}"
    else:
        diff = next(r for r in sorted(ranks) if initial[r] != initial[r0])
        shown = f"rank {r0}: {initial[r0]}; rank {diff}: {initial[diff]}"
    return [Unliftable((r0, diff), -1, SEEDING,
                       f"the ranks seed the default generator differently ({shown}): what each rank then draws "
                       "(initial weights, dropout masks, data) is not lifted", stack)]


def _simple(x: float) -> bool:
    """``x`` or its inverse is a fraction of small terms (a loss divided by the micro-steps, the ranks, a token
    count), to fp32 rounding: a loss that adds another term to the cross-entropy almost never is."""
    return any(abs(float(Fraction(y).limit_denominator(64)) - y) <= 1e-6 * abs(y) for y in (x, 1 / x))


def _auxiliary(steps: list[dict], rank: int) -> list[Unliftable]:
    """On the steps given, the loss passed to backward is the cross-entropy times a constant, one cross-entropy per
    backward; else another term (an auxiliary loss) is in it, whose normalisation is not read."""
    for mine in steps:
        # a cross-entropy over no values (a schedule's shape inference runs the loss on empty tensors) is none
        nll = [n for n in mine.get("nll") or [] if math.isfinite(n.get("value", 0.0))]
        losses = mine.get("losses") or []
        if not nll or not losses:
            continue
        stack = tuple(nll[0].get("stack") or losses[0].get("stack") or ())  # where the loss is formed
        if len(nll) != len(losses):
            return [Unliftable((rank,), -1, "an auxiliary loss", f"{len(nll)} cross-entropies for {len(losses)} "
                               "backward passes: the terms of the loss and their normalisations are not lifted",
                               stack, hides=("divisor",))]
        for x, n in zip(losses, nll):
            v, c = x.get("value"), n.get("value")
            if c and v and not _simple(v / c):
                return [Unliftable((rank,), -1, "an auxiliary loss",
                                   f"the loss passed to backward ({v:.6g}) is no constant multiple of the "
                                   f"cross-entropy ({c:.6g}): another term is added, whose normalisation is not "
                                   "lifted", stack, hides=("divisor",))]
    return []


SEEDING = "per-rank RNG seeding"


def init_apart(items: list[Unliftable], initial: dict, layout: _Layout, observer: int, bindings: dict[str, str],
               first_update: list, script: str) -> tuple[tuple | None, list[Unliftable]]:
    """Replicas that start apart: along an axis bound to ``ddp`` (whole copies of every weight) plain parameters of
    one name hold different values before the first update, so nothing broadcast them (a seed per rank, a
    hand-written data-parallel loop): ``override params: no_init_broadcast over (...)`` at the seed line that set
    them apart (else at the first update). The seeding is then lifted by that override where every axis holds
    data replicas (dropout masks and batches differ between data ranks anyway; the inputs are observed); where the
    replicas start equal, or with a tensor or pipeline axis, what else each rank draws (a buffer, a mask in a
    replicated region) is not read, and the seeding stays named. (the line or None, the items left)"""
    apart = [a for a, b in bindings.items() if b == "ddp" and split_by_values(initial, layout, observer, a)]
    seeding = next((u for u in items if u.what == SEEDING), None)
    data_only = all(b == "ddp" for b in bindings.values())
    left = [u for u in items if not (u is seeding and data_only and apart)]
    if not apart:
        return None, left
    frames = _frames([seeding.stack] if seeding is not None and seeding.stack else [first_update], script)
    cause = "the ranks seeded apart" if seeding is not None else "no broadcast observed"
    return (f"  override params: no_init_broadcast over ({', '.join(apart)})  # observed: the replicas' weights "
            f"differ before the first update ({cause})", frames), left
