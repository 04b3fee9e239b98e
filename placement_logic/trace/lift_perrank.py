"""Operations a traced step runs on some ranks of an axis only, and buckets laid out in another order (no torch).

- ``per_rank_pass``: every rank along a non-pipeline axis holds the same parameter; the ranks are split by the
  number of data-dependent scales on its gradient (a clip coefficient: ``clip_grad_norm_``, ``p.grad.mul_(coef)``)
  and the product of its constant scales, every rank compared with every other. Two sets: the side with more clip
  coefficients is a clip on its ranks (``override grads[g]: clip_rank0_only over (axis)`` for rank 0 alone, else
  ``clip_on_ranks over (axis) ranks (R, ...)``); where the products differ, the side whose scales hold a script
  line the other's lack (else rank 0 alone) divides by X, the other side's product over its own:
  ``divide_rank0_only`` (rank 0), ``divide_except_last`` (every rank but the last), ``divide_last_only`` (the last
  rank), else ``divide_on_ranks over (axis) ranks (R, ...) by X`` (``if rank in (1, 3): p.grad.div_(2)``). The
  gradient programs are then read with the other side's constant scales (what the plan's derivation applies
  everywhere, the departure stated by the override). Ranks that fall into three or more sets, or two sets with
  different products where neither side is read as the departing one, have no statement: named, never proved.
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
CLIP_ON, DIVIDE_ON = "clip_on_ranks", "divide_on_ranks"
DIVIDES = (DIVIDE, EXCEPT_LAST, LAST_ONLY, DIVIDE_ON)


@dataclass
class Departure:
    """One per-rank departure: the verb, its divisor (the ``divide_*`` verbs), the axes and parameters it holds on,
    and for the ``*_on_ranks`` verbs the rank indices along its one axis."""
    verb: str
    factor: Fraction | None
    axes: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    frames: list[dict] = field(default_factory=list)
    ranks: tuple[int, ...] | None = None


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
    """The clips and divisors on a set of ranks of each non-pipeline axis: every rank along the axis compared with
    every other (``_axis_departures``); rewrites the departing gradients' constant scales in ``params`` and in the
    departing ranks' records to the other side's. What no statement expresses is added to ``st.items``."""
    found: dict[tuple, Departure] = {}
    rewrite: dict[tuple, list] = {}  # (rank, parameter) -> the other side's constant scales
    pending: dict[tuple, dict] = {}  # (axis, reason) -> the ranks, parameters and script line named
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
            if held:
                _axis_departures(st, p, a, [(me, g)] + held, found, rewrite, pending)
    for (a, reason), e in pending.items():
        more = f" and {len(e['names']) - 1} more" if len(e["names"]) > 1 else ""
        st.items.append(Unliftable(e["ranks"], -1, f"the per-rank scaling of {e['names'][0]}{more} over {a}", reason,
                                   tuple(e["frames"])))
    if rewrite:
        _rewrite(st, params, rewrite)
    # one departure over several axes (the same parameters) is one statement over them; a rank set names one axis
    merged: dict[tuple, Departure] = {}
    for (verb, x, a, ranks), d in found.items():
        key = (verb, x, tuple(sorted(set(d.names))), (a, ranks) if ranks is not None else None)
        if key in merged:
            merged[key].axes.append(a)
        else:
            merged[key] = d
    return list(merged.values())


def _key(x: dict) -> tuple[int, Fraction]:
    return len(x.get("dynamic_scales") or []), _product(x)


def _lines(x: dict) -> set:
    return {(sc["at"].get("file"), sc["at"].get("line")) for sc in x.get("scales") or []}


def _name(pending: dict, st, a: str, mine: list[tuple[int, dict]], name: str, reason: str) -> None:
    """A disagreement no statement expresses, gathered per axis and reason (one report for every parameter it
    holds), at the first script line where the ranks' scales differ."""
    entry = pending.setdefault((a, reason), {"ranks": tuple(r for r, _ in mine[1:]), "names": [], "frames": []})
    entry["names"].append(name)
    if not entry["frames"]:
        seen = [{(sc["at"].get("file"), sc["at"].get("line"), str(sc.get("factor"))) for sc in x.get("scales") or []}
                | {(f.get("file"), f.get("line"), "clip") for f in x.get("dynamic_at") or []} for _, x in mine]
        apart = set.union(*seen) - set.intersection(*seen)
        frames = [f for _, x in mine for f in [sc["at"] for sc in x.get("scales") or []] + list(x.get("dynamic_at")
                                                                                              or [])
                  if any((f.get("file"), f.get("line")) == k[:2] for k in apart)]
        entry["frames"] = frames[:1]


def _axis_departures(st, p: dict, a: str, mine: list[tuple[int, dict]], found: dict, rewrite: dict,
                     pending: dict) -> None:
    """The ranks along ``a`` (``mine``: each rank and its gradient record of ``p``) split by their clip count and
    constant product. Two sets: the side with more clip coefficients is a clip on its ranks; where the products
    differ, the side whose scales hold a script line the other's lack (else rank 0 alone) divides by the other's
    product over its own. Named where the ranks fall into three or more sets, or where no side is the departing one."""
    i = st.layout.names.index(a)
    n = st.layout.sizes[i]
    idx = {r: st.layout.coords[r][i] for r, _ in mine}
    sides: dict[tuple, list] = {}
    for r, x in mine:
        sides.setdefault(_key(x), []).append((r, x))
    if len(sides) == 1:
        return
    own, name = p["own"], p["name"]
    if len(sides) > 2:
        sets = ", ".join(str(tuple(sorted(idx[r] for r, _ in side))) for side in sides.values())
        _name(pending, st, a, mine, name, f"the ranks of {a} fall into {len(sides)} sets by the clip coefficients "
              f"and constant scales they apply to its gradient (ranks {sets}): one set of ranks departing from the "
              "others is stated per group, not more")
        return
    (ka, sa), (kb, sb) = sorted(sides.items(), key=lambda kv: min(idx[r] for r, _ in kv[1]))
    ranks = {id(sa): tuple(sorted(idx[r] for r, _ in sa)), id(sb): tuple(sorted(idx[r] for r, _ in sb))}
    if ka[0] != kb[0]:  # a clip coefficient on one side only
        dep, ref = (sa, sb) if ka[0] > kb[0] else (sb, sa)
        frames = _at(dep[0][1].get("dynamic_at") or [], ref[0][1].get("dynamic_at") or [])
        on = ranks[id(dep)]
        verb, set_ = (CLIP, None) if on == (0,) else (CLIP_ON, on)
        d = found.setdefault((verb, None, a, set_), Departure(verb, None, [a], frames=frames, ranks=set_))
        d.names.append(name)
    if ka[1] == kb[1]:
        return
    extra_a, extra_b = _lines(sa[0][1]) - _lines(sb[0][1]), _lines(sb[0][1]) - _lines(sa[0][1])
    if bool(extra_a) != bool(extra_b):
        dep, ref = (sa, sb) if extra_a else (sb, sa)
    elif (0,) in (ranks[id(sa)], ranks[id(sb)]):
        dep, ref = (sa, sb) if ranks[id(sa)] == (0,) else (sb, sa)
    else:
        _name(pending, st, a, mine, name, f"ranks {ranks[id(sa)]} and ranks {ranks[id(sb)]} of {a} scale its "
              "gradient by different constants and neither side's scales hold a script line the other's lack: which "
              "side departs is not read (a scale read from the rank at one line, a loss scale that differs between "
              "the ranks)")
        return
    c_dep, c_ref = _product(dep[0][1]), _product(ref[0][1])
    if c_dep == 0:
        return
    on = ranks[id(dep)]
    verb, set_ = ((DIVIDE, None) if on == (0,) else (EXCEPT_LAST, None) if on == tuple(range(n - 1)) else
                  (LAST_ONLY, None) if on == (n - 1,) else (DIVIDE_ON, on))
    x = c_ref / c_dep
    frames = _at([sc["at"] for sc in dep[0][1].get("scales") or []], [sc["at"] for sc in ref[0][1].get("scales") or []])
    d = found.setdefault((verb, x, a, set_), Departure(verb, x, [a], frames=frames, ranks=set_))
    d.names.append(name)
    for r, _ in dep:
        rewrite[(r, own)] = ref[0][1].get("scales") or []


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
    departs alike; a group only some of whose parameters depart is named, and so is a group that two statements
    of one verb would cover (the checker applies both statements, where one operation seen along two axes
    is one operation). Divisors of different verbs for one group are each stated: the checker multiplies them on
    each device, over one axis or different ones (check.encode_rankproduct)."""
    lines: list[tuple[str, list, str, set]] = []  # the line, its frames, its kind, the groups it covers
    groups = [g for g, _, _ in named]
    every = {e[0]["name"] for _, _, members in named for e in members}
    for d in departures:
        axes = ", ".join(d.axes)
        on = f"ranks ({', '.join(map(str, d.ranks))})" if d.ranks is not None else ""
        tail = (f" {on}" if on else "") + (f" by {_by(d.factor)}" if d.verb in DIVIDES else "")
        where = {CLIP: "rank 0 only", DIVIDE: "rank 0 only", EXCEPT_LAST: "every rank but the last",
                 LAST_ONLY: "the last rank only"}.get(d.verb, f"{on} of {axes} only")
        what = (f"the clip coefficient applied on {where}" if d.verb in (CLIP, CLIP_ON) else
                f"a division by {_by(d.factor)} on {where}")
        frames = _frames([[f] for f in d.frames[:1]], st.script)
        kind = d.verb
        names = set(d.names)
        if names >= every:
            lines.append((f"  override grads: {d.verb} over ({axes}){tail}  # observed: {what}", frames, kind,
                          set(groups)))
            continue
        for g, _, members in named:
            mine = {e[0]["name"] for e in members}
            if mine <= names:
                lines.append((f"  override grads[{g}]: {d.verb} over ({axes}){tail}  # observed: {what}", frames,
                              kind, {g}))
            elif mine & names:
                st.items.append(Unliftable((st.observer,), -1, f"a per-rank {d.verb.split('_')[0]} of group {g}",
                                           f"{len(mine & names)} of its {len(mine)} parameters have {what} over "
                                           f"({axes}), the others not: one statement per group, not lifted",
                                           tuple(d.frames[:1])))
    out = []
    for text, frames, kind, covers in lines:
        clash = [g for g in sorted(covers) if sum(1 for _, _, k, c in lines if k == kind and g in c) > 1]
        if clash:
            st.items.append(Unliftable((st.observer,), -1, f"{kind} on sets of ranks for group {clash[0]}",
                                       f"two statements of {kind} on sets of ranks cover the {clash[0]} gradient "
                                       "(one per axis or per set): one per group, not lifted", tuple(frames[:1])))
            continue
        out.append((text, frames))
    return out


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
