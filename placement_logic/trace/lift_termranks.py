"""A loss term, and the grad norm's epsilon, on some ranks only (no torch).

``rank_set``: the ranks that do something, among the ranks that could, as a rank set of the checker: the ranks
of one mesh axis (membership read from the coordinate on that axis alone), else of the process group over every
axis the candidates differ on (a rank's index its coordinates there, the first axis most significant, as
``check.rankset`` numbers them); None where neither holds.

``term_ranks`` (before ``lift_auxloss.aux_lines``): per step, the ranks that compute a cross-entropy and those
whose balancing-loss reading (``lift_auxloss.read_aux``) holds the term. The term read on some of them only, the
same coefficient wherever it is read and on the same ranks every step: ``override loss[aux]: on_ranks over (AXES)
ranks (R, ...)`` at the line that adds it (``if rank == 0: loss = loss + aux``); read on every one of them with
two coefficients a factor X apart: the side of the smaller divides, ``divide_on_ranks over (AXES) ranks (R, ...)
by X`` (the larger the term's coefficient as written). The readings are then passed on with that coefficient.
Any other pattern (ranks that change between steps, more than two coefficients, a term absent on some ranks and
scaled on others, a set no rank set holds) is named at the term's line (PL614). A term added to the
cross-entropy on some ranks only that is no balancing loss (a z-loss, smoothing by hand, a penalty), and label
smoothing passed to ``F.cross_entropy`` on some ranks only, are named too: no statement holds a cross-entropy
term on some ranks.

``norm_eps`` (in place of ``lift_perrank.norm_epsilon``): the norm all-reduce's constant offset (the recorder's
``offset``) read on every rank that runs it. The same ε on every rank: ``eps_before_reduce`` as before; on some
ranks only, the same ε: ``override clip_norm: eps_on_ranks over (AXES) ranks (R, ...) by EPS`` at the addition,
AXES among the all-reduce's axes (the norm's own); other offsets, or ranks that differ along an axis the
all-reduce does not sum over, named (PL614).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from .lift_layout import Unliftable, _frames, _Layout
from .lift_perrank import norm_epsilon
from .lift_sets_axes import flat

AUX = "an auxiliary loss"


def rank_set(layout: _Layout, present: set[int], among: set[int], allowed=None
             ) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """(axes, indices) of the rank set holding ``present`` and none of the other ranks of ``among``."""
    among = {r for r in among if r in layout.coords}
    vary = [i for i in range(len(layout.names)) if len({layout.coords[r][i] for r in among}) > 1]
    for axes in [(i,) for i in vary] + ([tuple(vary)] if len(vary) > 1 else []):
        if allowed is not None and any(layout.names[i] not in allowed for i in axes):
            continue
        inside = {flat(layout, axes, r) for r in present}
        if inside & {flat(layout, axes, r) for r in among - present}:
            continue
        return tuple(layout.names[i] for i in axes), tuple(sorted(inside))
    return None


def _show(axes, ranks) -> str:
    return f"over ({', '.join(axes)}) ranks ({', '.join(map(str, ranks))})"


def _ce_steps(st) -> dict[int, dict[int, dict]]:
    """step -> rank -> its record, for the ranks that compute a cross-entropy on that step."""
    out: dict[int, dict[int, dict]] = {}
    for r, part in st.ranks.items():
        for s in part.get("steps") or []:
            if any(n.get("reduction") in ("mean", "sum") for n in s.get("nll") or []):
                out.setdefault(s.get("step", -1), {})[r] = s
    return out


def _name(st, ranks, why: str, stack) -> None:
    st.items.append(Unliftable(tuple(sorted(ranks)), -1, AUX, why, tuple(stack), hides=("divisor",)))


def _plain_terms(st, steps: dict[int, dict[int, dict]], read: set[tuple[int, int]]) -> None:
    """A term no balancing-loss reading holds, or label smoothing, on some of the loss's ranks only: named."""
    for k, recs in sorted(steps.items()):
        added = {r for r, s in recs.items() if any((r, k) not in read for _ in s.get("terms") or [])}
        smooth = {r for r, s in recs.items() if any(n.get("label_smoothing") for n in s.get("nll") or [])}
        for what, on in (("a term added to the cross-entropy", added), ("label smoothing", smooth)):
            if on and on != set(recs):
                r = min(on)
                s = recs[r]
                stack = (s.get("terms") or [{}])[0].get("stack") if what != "label smoothing" else \
                    next(n.get("stack") for n in s["nll"] if n.get("label_smoothing"))
                _name(st, on, f"{what} on ranks {sorted(on)} of the {len(recs)} that compute the loss (step {k}), "
                      "not on the others: no statement holds a cross-entropy term on some ranks",
                      _frames([stack or []], st.script)[:1])
                return


def _ratio(big: float, small: float) -> Fraction | None:
    x = Fraction(big / small).limit_denominator(100)
    return x if abs(float(x) - big / small) <= 1e-5 * big / small else None


def term_ranks(st, readings: list) -> tuple[list, list[tuple[str, list]]]:
    """(the readings to pass to ``aux_lines``, the plan's ``loss[aux]`` rank-set line) of the steps' readings."""
    steps = _ce_steps(st)
    read = {(x.rank, x.step) for x in readings}
    _plain_terms(st, steps, read)
    if not readings:
        return readings, []
    coefs: dict[int, set[float]] = {}
    for x in readings:
        coefs.setdefault(x.rank, set()).add(x.coef)
    stack = _term_stack(st, readings[0])
    sets = {k: frozenset(r for r in recs if (r, k) in read) for k, recs in steps.items() if any(
        (r, k) in read for r in recs)}
    among = set().union(*(set(steps[k]) for k in sets))
    why = None
    if len(set(sets.values())) > 1 or any(set(steps[k]) != among for k in sets):
        why = "the balancing loss is added on other ranks on other steps"
    elif any(len(v) > 1 for v in coefs.values()):
        why = "the balancing loss's coefficient differs between steps"
    values = sorted({c for v in coefs.values() for c in v})
    present = set(next(iter(sets.values()))) if sets else set()
    if why is None and present == among and len(values) == 1:
        return readings, []
    if why is None and (len(values) > 2 or (present != among and len(values) > 1)):
        why = f"the balancing loss's coefficients on the ranks ({', '.join(f'{v:g}' for v in values)}) are " + \
            ("more than two" if present == among else "not one where it is added") + ": no one term"
    by = _ratio(values[-1], values[0]) if why is None and present == among else None
    if why is None and present == among and by is None:
        why = f"the balancing loss's coefficients {values[0]:g} and {values[-1]:g} are not a simple factor apart"
    on = present if present != among else {r for r in among if values[0] in coefs[r]}
    where = rank_set(st.layout, on, among) if why is None else None
    if why is None and where is None:
        why = f"the ranks {sorted(on)} that {'add' if present != among else 'scale'} the balancing loss are no rank " \
              "set of one mesh axis or of the process group over the axes the loss's ranks differ on"
    if why is not None:
        _name(st, coefs, why, stack)
        return [], []
    if present != among:
        text = f"  override loss[aux]: on_ranks {_show(*where)}  # observed: the balancing loss added on ranks " \
               f"{sorted(on)} only"
    else:
        shown = str(by.numerator) if by.denominator == 1 else f"{by.numerator} / {by.denominator}"
        text = f"  override loss[aux]: divide_on_ranks {_show(*where)} by {shown}  # observed: the balancing loss's " \
               f"coefficient {values[0]:g} on ranks {sorted(on)}, {values[-1]:g} on the others"
    return [dataclasses.replace(x, coef=values[-1]) for x in readings], [(text, stack)]


def _term_stack(st, reading) -> list:
    """The frames of the line that adds the term on the reading's rank and step."""
    mine = next((s for s in st.ranks[reading.rank].get("steps") or [] if s.get("step") == reading.step), {})
    terms = mine.get("terms") or [{}]
    return _frames([terms[0].get("stack") or list(reading.stack)], st.script)


def norm_eps(st, info: list) -> tuple | None:
    """The norm's epsilon: on every rank (``lift_perrank.norm_epsilon``) or on a rank set (see above)."""
    if not any((e[0].get("grad") or {}).get("dynamic_scales") for e in info):
        return None
    in_programs = {s for e in info for s in ((e[0].get("grad") or {}).get("collectives") or [])}
    for c in st.colls:
        if c["phase"] != "after_backward" or c["kind"] != "all_reduce" or c.get("op", "sum") != "sum" \
                or c["seq"] in in_programs:
            continue
        mine = {r: (st.by_seq.get(r) or {}).get(c["seq"]) for r in st.ranks}
        if not any(((m or {}).get("offset") or {}).get("value") for m in mine.values()):
            continue
        if any(m is None or (m["kind"], m["phase"], m["step"]) != (c["kind"], c["phase"], c["step"])
               for m in mine.values()):
            _name_eps(st, c, "the ranks' collectives of the step do not pair up")
            return None
        offs = {r: ((m.get("offset") or {}).get("value") or 0.0) for r, m in mine.items()}
        on = {r for r, v in offs.items() if v}
        if on == set(offs) and len(set(offs.values())) == 1:
            return norm_epsilon(st.colls, info, st.script) if c.get("offset") else None
        eps = {offs[r] for r in on}
        allowed = st.layout.axes_of(c["ranks"], st.observer)
        where = rank_set(st.layout, on, set(offs), allowed) if len(eps) == 1 and allowed else None
        if where is None:
            _name_eps(st, c, f"epsilons {sorted(set(offs.values()))} added on the ranks before it (ranks {sorted(on)}"
                      " add one): one epsilon on a rank set of the axes it sums over is stated, not these")
            return None
        (value,) = eps
        at = mine[min(on)]["offset"]["at"]
        return (f"  override clip_norm: eps_on_ranks {_show(*where)} by {value:g}  # observed: {value:g} added to the "
                f"norm piece of ranks {sorted(on)} only before its all-reduce", _frames([[at]], st.script))
    return None


def _name_eps(st, c: dict, why: str) -> None:
    st.items.append(Unliftable(tuple(sorted(st.ranks)), c["seq"], "the grad norm's epsilon",
                               f"the norm's all-reduce ({c['api']}): {why}", tuple(c["stack"]), (c["seq"],)))
