"""``DTensor.from_local`` from the user's code: a placement asserted, not derived; dropout masks compared
between the tensor ranks (no torch).

Each call records the placements it asserts, the ranks of each mesh dimension's group and a checksum of the
rank's local values. The calls are matched between ranks by their script line and their order there. A
``Replicate`` asserted over a group whose ranks passed different values is false whatever the step does next
(a replicated DTensor holds one value on every rank): over the tensor axis inside a layer whose name places it in
a region it is ``override activations[R]: assert_replicate over (tp)`` at the call (the region's output declared
Replicate: the checker refutes its activation integrity), anywhere else a mismatch named at the call (PL614).
An assertion the values do not contradict (``Replicate`` over equal values; ``Partial`` or ``Shard``, which
checksums cannot confirm: equal values asserted ``Partial`` are summed again on redistribution) is named at the
call too, since what the step does with the declared type is not lifted: the verdict is unknown, never proved.

Dropout (``dropout_seeds``), under a tensor axis: a dropout whose input is equal on the tensor ranks runs in a
region replicated over them, where every rank must draw the same mask; an output that differs there means the
ranks' generators were seeded (or advanced) apart: ``override dropout_seed: vary over (tp)`` at the dropout,
which the checker refutes. Equal outputs are the derivation. A dropout whose input differs between the tensor
ranks runs in a split region, whose masks must differ: its checksums cannot tell, so it is named.
"""

from __future__ import annotations

from .lift_activations import region_of
from .lift_layout import Unliftable, _frames, _Layout

REPLICATE = ("R", "Replicate()")  # str(Replicate()): the short form in recent torch


def _calls(ranks: dict, step_no: int, key: str = "asserted") -> dict[tuple, dict[int, dict]]:
    """(script file, line, occurrence) -> rank -> the record, for the analysed step's calls."""
    out: dict[tuple, dict[int, dict]] = {}
    for r, part in ranks.items():
        seen: dict[tuple, int] = {}
        for a in part.get(key) or []:
            if a.get("step", step_no) != step_no:
                continue
            top = (a["stack"] or [{}])[0]
            where = (top.get("file"), top.get("line"))
            n = seen[where] = seen.get(where, -1) + 1
            out.setdefault((*where, n), {})[r] = a
    return out


def asserted(ranks: dict, step_no: int, layout: _Layout, tp: str | None, script: str) -> tuple[
        list[Unliftable], list[tuple[str, list]]]:
    """(items named, activation override lines) for the step's ``DTensor.from_local`` calls."""
    items, lines = [], []
    for _key, per_rank in sorted(_calls(ranks, step_no).items(), key=lambda kv: (str(kv[0][0]), kv[0][1:])):
        r0 = min(per_rank)
        a = per_rank[r0]
        stack = tuple(a["stack"])
        mismatch = None
        for placement, group in zip(a["placements"], a["groups"]):
            sums = {per_rank[r].get("checksum") for r in group if r in per_rank}
            if placement in REPLICATE and len(sums) > 1 and None not in sums:
                mismatch = (placement, layout.axes_of(group, r0) or (), group)
                break
        shown = "[" + ", ".join(a["placements"]) + "]"
        if mismatch is None:
            items.append(Unliftable(tuple(sorted(per_rank)), -1, "DTensor.from_local",
                                    f"placements {shown} asserted, not derived; the ranks' values do not contradict "
                                    "them, but what the step does with the declared type is not lifted", stack))
            continue
        placement, axes, group = mismatch
        region = region_of(a.get("module") or "")
        if tp is not None and tuple(axes) == (tp,) and region is not None and a.get("phase", "forward") == "forward":
            lines.append((f"  override activations[{region}]: assert_replicate over ({tp})  # observed: "
                          f"DTensor.from_local asserts {_name(placement)} over {tp} for values that differ between its "
                          f"ranks (in {a['module']})", _frames([list(stack)], script)))
            continue
        over = ", ".join(axes) if axes else "ranks " + ", ".join(map(str, group))
        items.append(Unliftable(tuple(sorted(per_rank)), -1, "DTensor.from_local asserting Replicate",
                                f"{shown} asserts {_name(placement)} over {over}, but the ranks there passed different "
                                "values: the declared type is false; outside a tensor-axis layer of a region no plan "
                                "states it", stack))
    return items, lines


def _name(placement: str) -> str:
    return "Replicate()" if placement == "R" else placement


def dropout_seeds(ranks: dict, layout: _Layout, tp: str | None, script: str) -> tuple[
        tuple | None, list[Unliftable]]:
    """(the ``dropout_seed`` line or None, dropouts named), under a tensor axis, for the dropouts of the first step
    that drew any: later steps start from the state the earlier masks left (weights a mask set apart make every
    later input differ too)."""
    steps = [d.get("step", 0) for part in ranks.values() for d in part.get("dropouts") or []]
    if tp is None or not steps:
        return None, []
    step_no = min(steps)
    varied, items = [], []
    for _key, per_rank in sorted(_calls(ranks, step_no, "dropouts").items(),
                                 key=lambda kv: (str(kv[0][0]), kv[0][1:])):
        pairs = [(r, o) for r in sorted(per_rank) if (o := layout.neighbour(r, tp)) is not None and o in per_rank]
        if not pairs:
            continue
        d = per_rank[pairs[0][0]]
        if any(per_rank[r]["input"] != per_rank[o]["input"] for r, o in pairs):
            items.append(Unliftable(tuple(sorted(per_rank)), -1, f"a dropout in a region split over {tp}",
                                    f"its input differs between the ranks of {tp} (a split region, whose masks must "
                                    "differ between them): whether they do is not read", tuple(d["stack"])))
        elif any(per_rank[r]["output"] != per_rank[o]["output"] for r, o in pairs):
            varied.append(d)
    if not varied:
        return None, items
    where = ", ".join(sorted({d.get("module") or "?" for d in varied}))
    return (f"  override dropout_seed: vary over ({tp})  # observed: a dropout on an input equal over {tp} (a "
            f"replicated region, in {where}) drew different masks on its ranks",
            _frames([list(varied[0]["stack"])], script)), items
