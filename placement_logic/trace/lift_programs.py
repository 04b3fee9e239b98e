"""Gradient programs of a trace: the reductions and constant scales a parameter's gradient went
through between its computation and the optimizer step (no torch).

Input: the step records, the collectives by call number, each call's micro-step and the mesh
layout. Output: per parameter, the axes it was reduced over (an axis twice: reduced twice), the
constant it was scaled by and the calls behind them, with the parameters whose gradient was
all-reduced after every accumulated micro-step (``override grads: reduce_every_microbatch``).

A reduction made once on each of the k micro-steps of an accumulated step is one reduction of
the summed gradient when it is linear in the new micro-step's gradient: a reduce-scatter into a
shard that the micro-steps add up in (FSDP2, ZeRO-2), an all-reduce of the new micro-step's
gradient only (its input carried no earlier reduction of the same group: DTensor's reductions
of a partial gradient), or an all-reduce of the accumulated buffer that averages over its group
(DDP without ``no_sync``: the earlier micro-steps' part is already equal on every rank, so an
average leaves it as it is). A sum of the accumulated buffer multiplies the earlier part by the
group's size, and a copy of the accumulating buffer reduced again counts it again: ``lift_rereduce``
states them where the recorder read the buffers, else they stay repeated reductions, which ``lift``
reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

from .lift_layout import REDUCE_OPS, REDUCTIONS, _Layout
from .lift_rereduce import COPIED, SUMMED, UNKNOWN, rereduced


@dataclass
class Programs:
    step: dict  # rank -> the lifted step's record
    by_seq: dict  # rank -> call number -> collective
    micro: dict  # rank -> call number -> accumulated micro-step (0-based)
    layout: _Layout
    data_axes: tuple[str, ...]
    observer: int
    every_of: dict[str, list] = field(default_factory=dict)  # parameter -> the stack of its every-micro-step all-reduce
    # lift_rereduce's kind -> parameter -> (why, the stack of its call): an accumulating buffer reduced again
    again_of: dict[str, dict[str, tuple]] = field(default_factory=dict)

    def _axes(self, c: dict, r: int) -> tuple[str, ...]:
        return self.layout.axes_of(c["ranks"], r) or ()

    def of(self, p: dict, r: int | None = None) -> tuple[tuple[str, ...], Fraction, list]:
        """(axes reduced over, sorted; the constant scale; the calls' stacks) of ``p``'s gradient on rank ``r``."""
        r = self.observer if r is None else r
        g = p.get("grad") or {}
        calls = [self.by_seq[r][s] for s in g.get("collectives", [])]
        n_micro = max(1, len(self.step[r].get("losses", [])))
        scales = list(g.get("scales", []))
        why: dict[tuple, str] = {}
        once = _once_per_micro_step(calls, lambda c: self._axes(c, r), self.micro[r], n_micro, scales, self.layout,
                                    (self.step[r].get("grads_between"), why))
        reds: list[str] = []
        frames: list = []
        const = Fraction(1)
        seen: set[tuple] = set()
        for c in calls:
            if c["kind"] not in REDUCTIONS or c["op"] not in REDUCE_OPS:
                continue
            ax = self._axes(c, r)
            key = (c["kind"], ax, c["op"])
            kind = once.get(key)
            if kind in (SUMMED, COPIED, UNKNOWN):
                # one reduction of the summed gradient stated by lift_rereduce, or named there (UNKNOWN: kept
                # as the repeated reductions they are)
                self.again_of.setdefault(kind, {}).setdefault(p["name"], (why.get(key, ""), c["stack"]))
            if kind not in (None, UNKNOWN):
                if key in seen:
                    continue
                seen.add(key)
                if kind == "accumulated" or (kind == "fresh" and set(ax) & set(self.data_axes)):
                    self.every_of[p["name"]] = c["stack"]
            reds.extend(ax)
            frames.append(c["stack"])
            if c["op"] == "avg":
                const /= self.layout.size(ax)
        # a gradient still Partial at the step (DTensor): the optimizer's first use all-reduces it
        for dim, pl in zip(p.get("mesh_dims") or [], g.get("placements") or []):
            if pl.startswith(("P(", "Partial")):
                name = re.sub(r"\W", "_", dim)
                names = self.layout.names
                axis = name if name in names else (names[0] if len(names) == 1 else None)
                if axis is not None:
                    reds.append(axis)
                    frames.append(self.step[r]["optimizer"].get("stack", []))
        if once and set(once.values()) - {UNKNOWN} and scales and len(scales) % n_micro == 0:
            # the scaling that goes with each micro-step's reduction: applied to each summand once
            per = len(scales) // n_micro
            chunks = [scales[i * per:(i + 1) * per] for i in range(n_micro)]
            if all([_factor(x) for x in ch] == [_factor(x) for x in chunks[0]] for ch in chunks):
                scales = chunks[0]
        for sc in scales:
            factor, at = (sc["factor"], sc.get("at")) if isinstance(sc, dict) else (sc, None)
            const *= Fraction(factor)
            if at:
                frames.append([at])
        return tuple(sorted(reds)), const, frames


def _once_per_micro_step(calls: list[dict], axes, micro: dict, n_micro: int, scales: list,
                         layout: _Layout, between: tuple = (None, {})) -> dict[tuple, str]:
    """The reductions (kind, axes, op) made on every one of the ``n_micro`` micro-steps that are one
    reduction of the summed gradient (the module docstring): ``linear`` (reduce-scatters on every
    micro-step), ``fresh`` (one all-reduce a micro-step, each of the new gradient only) or
    ``accumulated`` (one all-reduce a micro-step of the accumulated buffer, each an average: the
    scales with the same micro-step times the reduce op give 1 / the group's size); ``lift_rereduce``'s kinds
    where the calls read the accumulating buffer after backward (``between``: the step's ``grads_between`` and
    the dict that receives an unknown one's reason)."""
    if n_micro < 2:
        return {}
    at: dict[tuple, list[dict]] = {}
    for c in calls:
        if c["kind"] in REDUCTIONS and c["op"] in REDUCE_OPS:
            at.setdefault((c["kind"], axes(c), c["op"]), []).append(c)
    per: list[list[Fraction]] | None = [[] for _ in range(n_micro)]
    for sc in scales:
        m = sc.get("micro") if isinstance(sc, dict) else None
        if m is None or not 0 <= m < n_micro:
            per = None
            break
        per[m].append(_factor(sc))
    out: dict[tuple, str] = {}
    for key, cs in at.items():
        kind, ax, op = key
        steps = [micro.get(c["seq"], 0) for c in cs]
        if kind == "reduce_scatter":
            if set(steps) == set(range(n_micro)):
                out[key] = "linear"
            continue
        if sorted(steps) != list(range(n_micro)):
            continue
        averages = _averages(per, op, layout.size(ax))
        again = rereduced(cs, micro, between[0], {k for k, x in enumerate(per or []) if x}, averages)
        if again is not None:
            out[key], between[1][key] = again
            continue
        seqs = {c["seq"] for c in cs}
        if all("inputs_reduced" in c and not seqs & set(c["inputs_reduced"]) for c in cs):
            out[key] = "fresh"
        elif averages:
            out[key] = "accumulated"
    return out


def _averages(per: list[list[Fraction]] | None, op: str, size: int) -> bool:
    """The scales of every micro-step are the same and, times the reduce op, give 1 / the group's size."""
    if per is None or any(sorted(x) != sorted(per[0]) for x in per):
        return False
    scale = Fraction(1)
    for f in per[0]:
        scale *= f
    return scale * (Fraction(1, size) if op == "avg" else 1) * size == 1


def _factor(sc) -> Fraction:
    return Fraction(sc["factor"] if isinstance(sc, dict) else sc)
