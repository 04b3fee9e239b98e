"""Operations a traced step runs on some ranks of an axis only, and buckets laid out in another order (no torch).

- ``per_rank_pass``: rank 0 of an axis and the other ranks along it hold the same parameter; where rank 0's gradient
  went through a data-dependent scale (a clip coefficient: ``clip_grad_norm_``, ``p.grad.mul_(coef)``) the
  neighbour's did not, that is ``override grads[g]: clip_rank0_only over (axis)``; where the product of their
  constant scales differs (``p.grad.div_(2)`` under ``if rank == 0``), ``override grads[g]: divide_rank0_only over
  (axis) by X`` with X the neighbour's product over rank 0's. The gradient programs are then read with the
  neighbour's constant scales (what the plan's derivation applies everywhere, rank 0's departure stated by the
  override). Over three or more ranks, a constant scale on every rank of the axis but the last (their scales holding
  a script line the last's lack) is ``override grads[g]: divide_except_last over (axis) by X``, one on the last
  rank only ``divide_last_only`` (X the other side's product over the departing side's; on two ranks the former
  is rank 0's). A clip on a set of ranks other than rank 0, a scale on another set of ranks, or ranks that
  disagree otherwise have no statement: named, never proved.
- ``rank0_lines``: those departures as plan lines, per group (``grads`` where they cover every parameter).
- ``bucket_order``: the parameters of a DistributedDataParallel module registered in another order on another
  rank than on rank 0 along a data axis (names and shapes alike, the order not): DDP pairs its buckets'
  elements by offset, so ``override grads: bucket_order over (axis)`` at the DDP construction line.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from fractions import Fraction

from .lift_layout import Unliftable, _frames
from .lift_programs import _factor

CLIP, DIVIDE = "clip_rank0_only", "divide_rank0_only"
EXCEPT_LAST, LAST_ONLY = "divide_except_last", "divide_last_only"
DIVIDES = (DIVIDE, EXCEPT_LAST, LAST_ONLY)


@dataclass
class Departure:
    """One per-rank departure: the verb, its divisor (``divide_rank0_only``), the axes and parameters it holds on."""
    verb: str
    factor: Fraction | None
    axes: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    frames: list[dict] = field(default_factory=list)


def _product(grad: dict) -> Fraction:
    out = Fraction(1)
    for sc in grad.get("scales") or []:
        out *= _factor(sc)
    return out


def _at(entries, other) -> list[dict]:
    """The frames of ``entries`` that ``other`` lacks (by line), else all of them."""
    theirs = {(f.get("file"), f.get("line")) for f in other}
    mine = [f for f in entries if (f.get("file"), f.get("line")) not in theirs]
    return mine or list(entries)


def _along(layout, rank: int, axis: str) -> list[int]:
    """Every other rank that differs from ``rank`` along ``axis`` only."""
    i = layout.names.index(axis)
    me = layout.coords[rank]
    return sorted(r for r, c in layout.coords.items()
                  if c[i] != me[i] and all(c[j] == me[j] for j in range(len(me)) if j != i))


def per_rank_pass(st, ax, params: list[dict]) -> list[Departure]:
    """The rank-0-only clips and divisors between rank 0 of each non-pipeline axis and its neighbour; rewrites the
    departing gradients' constant scales in ``params`` and the observer's record to the neighbour's. A departure
    on the neighbour only is added to ``st.items``."""
    found: dict[tuple, Departure] = {}
    rewrite: dict[tuple, list] = {}  # (rank, parameter) -> the neighbour's constant scales
    views = {r: {p["name"]: p for p in (st.step[r].get("optimizer") or {}).get("params", [])} for r in st.ranks}
    for p in params:
        me, own, g = p["rank"], p["own"], p.get("grad")
        if g is None:
            continue
        for a in st.layout.names:
            others = _along(st.layout, me, a)
            if a == ax.pp or not others:
                continue
            held = [(r, (views.get(r, {}).get(own) or {}).get("grad")) for r in others]
            held = [(r, x) for r, x in held if x is not None]
            if not held:
                continue
            other, theirs = held[0]
            alike = {(len(x.get("dynamic_scales") or []), _product(x)) for _, x in held}
            if len(alike) > 1 and _last_set(st, p, a, held, found, rewrite):
                continue
            if len(alike) > 1:  # the other ranks disagree among themselves: no rank-0-only statement
                st.items.append(Unliftable(tuple(r for r, _ in held), -1, f"the per-rank scaling of {own} over {a}",
                                           f"the ranks of {a} other than rank {me} apply different clip coefficients "
                                           "or constant scales to its gradient: an operation on a rank other than "
                                           "rank 0 of an axis is not lifted", ()))
                continue
            n0, n1 = len(g.get("dynamic_scales") or []), len(theirs.get("dynamic_scales") or [])
            c0, c1 = _product(g), _product(theirs)
            if n0 > n1:
                frames = _at(g.get("dynamic_at") or [], theirs.get("dynamic_at") or [])
                d = found.setdefault((CLIP, None, a), Departure(CLIP, None, [a], frames=frames))
                d.names.append(p["name"])
            elif n1 > n0:
                st.items.append(Unliftable((other,), -1, f"a clip coefficient on {own} over {a}",
                                           f"rank {other} scales the gradient by a data-dependent coefficient (a clip) "
                                           f"rank {me} does not apply: an operation on a rank other than rank 0 of "
                                           "an axis is not lifted", tuple(_at(theirs.get("dynamic_at") or [],
                                                                               g.get("dynamic_at") or [])[:1])))
            if c0 != c1 and c0 != 0:
                x = c1 / c0
                ats = [s["at"] for s in g.get("scales") or []]
                frames = _at(ats, [s["at"] for s in theirs.get("scales") or []])
                d = found.setdefault((DIVIDE, x, a), Departure(DIVIDE, x, [a], frames=frames))
                d.names.append(p["name"])
                rewrite[(me, own)] = theirs.get("scales") or []
    if rewrite:
        _rewrite(st, params, rewrite)
    # one departure over several axes (the same parameters) is one statement over them
    merged: dict[tuple, Departure] = {}
    for (verb, x, a), d in found.items():
        key = (verb, x, tuple(sorted(set(d.names))))
        if key in merged:
            merged[key].axes.append(a)
        else:
            merged[key] = d
    return list(merged.values())


def _last_set(st, p: dict, a: str, held: list, found: dict, rewrite: dict) -> bool:
    """A divisor on every rank of ``a`` but the last, or on the last only: the ranks but the last (rank ``p``'s
    among them) agree, the last applies another constant scale (no other clip), and the side that departs is the
    one whose scales hold a script line the other's lack. Recorded in ``found`` (its gradient programs read with
    the other side's scales in ``rewrite``); False where the ranks fall otherwise."""
    i = st.layout.names.index(a)
    n = st.layout.sizes[i]
    mine = [(p["rank"], p["grad"])] + list(held)
    last = [(r, x) for r, x in mine if st.layout.coords[r][i] == n - 1]
    rest = [(r, x) for r, x in mine if st.layout.coords[r][i] != n - 1]
    if len(last) != 1 or not rest or len({(len(x.get("dynamic_scales") or []), _product(x)) for _, x in rest}) != 1 \
            or len({len(x.get("dynamic_scales") or []) for _, x in mine}) != 1:
        return False
    (_, lx), (_, rx) = last[0], rest[0]
    c_last, c_rest = _product(lx), _product(rx)
    lines = {s: {(sc["at"].get("file"), sc["at"].get("line")) for sc in x.get("scales") or []} for s, x in
             (("last", lx), ("rest", rx))}
    extra_last, extra_rest = lines["last"] - lines["rest"], lines["rest"] - lines["last"]
    if c_last == c_rest or 0 in (c_last, c_rest) or bool(extra_last) == bool(extra_rest):
        return False
    if extra_rest:  # every rank but the last divides again
        verb, x, dep, ref = EXCEPT_LAST, c_last / c_rest, rest, lx
    else:
        verb, x, dep, ref = LAST_ONLY, c_rest / c_last, last, rx
    frames = _at([sc["at"] for sc in dep[0][1].get("scales") or []], [sc["at"] for sc in ref.get("scales") or []])
    d = found.setdefault((verb, x, a), Departure(verb, x, [a], frames=frames))
    d.names.append(p["name"])
    for r, _ in dep:
        rewrite[(r, p["own"])] = ref.get("scales") or []
    return True


def _rewrite(st, params: list[dict], rewrite: dict[tuple, list]) -> None:
    """The departing gradients read with the neighbour's constant scales (a copy: the trace is left as given)."""
    for p in params:
        if (p["rank"], p["own"]) in rewrite and p.get("grad") is not None:
            p["grad"] = dict(p["grad"], scales=copy.deepcopy(rewrite[(p["rank"], p["own"])]))
    for r in sorted({r for r, _ in rewrite}):
        opt = st.step[r].get("optimizer")
        if opt:
            new = [dict(q, grad=dict(q["grad"], scales=copy.deepcopy(rewrite[(r, q["name"])])))
                   if (r, q["name"]) in rewrite and q.get("grad") is not None else q for q in opt.get("params", [])]
            st.step[r] = dict(st.step[r], optimizer=dict(opt, params=new))


def _by(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator} / {x.denominator}"


def rank0_lines(st, departures: list[Departure], named: list) -> list[tuple[str, list]]:
    """The plan lines of the departures: over every parameter ``grads``, else per group whose every member
    departs alike; a group only some of whose parameters depart is named."""
    lines = []
    every = {e[0]["name"] for _, _, members in named for e in members}
    for d in departures:
        axes = ", ".join(d.axes)
        tail = f" by {_by(d.factor)}" if d.verb in DIVIDES else ""
        what = ("the clip coefficient applied on rank 0 only" if d.verb == CLIP else
                f"a division by {_by(d.factor)} on " + {DIVIDE: "rank 0 only", EXCEPT_LAST: "every rank but the last",
                                                        LAST_ONLY: "the last rank only"}[d.verb])
        frames = _frames([[f] for f in d.frames[:1]], st.script)
        names = set(d.names)
        if names >= every:
            lines.append((f"  override grads: {d.verb} over ({axes}){tail}  # observed: {what}", frames))
            continue
        for g, _, members in named:
            mine = {e[0]["name"] for e in members}
            if mine <= names:
                lines.append((f"  override grads[{g}]: {d.verb} over ({axes}){tail}  # observed: {what}", frames))
            elif mine & names:
                st.items.append(Unliftable((st.observer,), -1, f"a per-rank {d.verb.split('_')[0]} of group {g}",
                                           f"{len(mine & names)} of its {len(mine)} parameters have {what} over "
                                           f"({axes}), the others not: one statement per group, not lifted",
                                           tuple(d.frames[:1])))
    return lines


def bucket_order(st, bindings: dict[str, str]) -> tuple[tuple | None, list[Unliftable]]:
    """``override grads: bucket_order over (AXES)`` where a DDP module's parameters are registered in another order
    on another rank along a ddp axis than on the observer (same names and shapes); other differences between the
    ranks' registrations (other names or shapes) are named."""
    regs = {r: [tuple((n, tuple(s)) for n, s in m["params"]) for m in part.get("registration") or []]
            for r, part in st.ranks.items()}
    mine = regs.get(st.observer) or []
    if not mine:
        return None, []
    axes, items = [], []
    second = None
    for a, b in bindings.items():
        if b != "ddp" or a not in st.layout.names:
            continue
        for other in _along(st.layout, st.observer, a):
            theirs = regs.get(other) or []
            if theirs == mine:
                continue
            if len(theirs) == len(mine) and all(sorted(x) == sorted(y) for x, y in zip(mine, theirs)):
                axes.append(a)
                second = second or theirs[0]
            else:
                items.append(Unliftable((other,), -1, f"the parameters DDP holds over {a}",
                                        f"rank {other} registers other parameters (names or shapes) in its DDP module "
                                        f"than rank {st.observer}: its buckets are not lifted", ()))
            break
    if not axes:
        return None, items
    # the DDP constructor's set-up collectives (its parameter shape check and broadcast) give its line
    setup = [c["stack"] for c in st.ranks[st.observer]["collectives"] if c.get("phase") == "setup" and c["stack"]]
    first = mine[0]
    i = next((i for i, (x, y) in enumerate(zip(first, second)) if x != y), 0)
    why = (f"rank {st.observer} registers {first[i][0]} where another rank registers {second[i][0]}: DDP's buckets "
           "pair their elements by offset")
    return (f"  override grads: bucket_order over ({', '.join(axes)})  # observed: {why}",
            _frames(setup[:1], st.script)), items


def norm_epsilon(step_colls: list[dict], info: list, script: str) -> tuple | None:
    """``override clip_norm: eps_before_reduce by EPS`` where the gradients are clipped and a constant was added to
    the one-element value a norm all-reduce (after backward, carrying no gradient) then summed: each rank's
    squared norm plus an epsilon before the reduction (the recorder's ``offset``, read on the observer)."""
    if not any((e[0].get("grad") or {}).get("dynamic_scales") for e in info):
        return None
    in_programs = {s for e in info for s in ((e[0].get("grad") or {}).get("collectives") or [])}
    for c in step_colls:
        off = c.get("offset")
        if off and c["phase"] == "after_backward" and c["kind"] == "all_reduce" and c.get("op", "sum") == "sum" \
                and c["seq"] not in in_programs and off.get("value"):
            return (f"  override clip_norm: eps_before_reduce by {off['value']:g}  # observed: {off['value']:g} added "
                    "to each rank's norm piece before its all-reduce", _frames([[off["at"]]], script))
    return None
