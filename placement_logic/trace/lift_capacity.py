"""The MoE dispatch's capacity step: whether the padded positions take expert slots (no torch).

``recorder_capacity`` records, on a router call (``router``: its R rows, E experts, k and counts), the capacity
step's C, each expert's kept count and the rows routed into it (``entered``: a positive score in some column).
The padded positions of a call are the rows whose cross-entropy label is negative (the ignore index, -100 by
default), the rows a 0/1 mask multiplied into the call's routing zeroes (``masked``) and the positions the model
call's attention mask zeroes (``lift_padding.row_pads``: padding marked by it alone): the step's router calls
with a capacity step and its cross-entropies with labels are paired in order, each call's rows the labels'
positions (equal counts). Over the analysed step of every rank:

* a padded row entered in every call that has padding: ``override capacity: counts_padding`` (the padding
  routed, taking slots by its scores), N of each call its R positions;
* no padded row entered in any call: ``override capacity: masks_padding`` (the padding masked before the step:
  as derived, with a note), N the call's real tokens;
* the capacity factor the C of every call is ⌈capacity_factor · k · N / E⌉ of: the shortest decimal in the
  interval all the calls allow (``capacity_factor``), written with E and k in the model's ``transformer`` block
  (the router's input width as ``hidden``, the cross-entropy's classes as ``vocab``; ``layers`` and ``heads`` are
  not observed and written as 1, read by no obligation of the capacity step: the parameter count stays
  ``params``).

It cannot tell (PL614, ``a capacity step``): padded rows routed in some calls and masked in others, calls not
paired with labels of their positions, E or k differing between calls, a C that no one capacity factor gives
for the N the padding reading implies (the capacity computed from another count than the one routed). No
padded position in any call: nothing to tell, a note and no statement, unless a loss mask leaves out positions
(they may be padding: PL614). ``counts_padding`` at a factor that drops
nothing (capacity_factor · k ≥ E: the checker's PL274) is a note and no statement too.
"""

from __future__ import annotations

from fractions import Fraction

from .lift_layout import Unliftable, _frames
from .lift_padding import row_pads
from .lift_step import Step


def _calls(st: Step, rank: int) -> list[tuple[dict, list[int]]] | None:
    """The rank's capacity steps of the analysed step, each with its padded rows; None where not paired."""
    mine = st.step.get(rank) or {}
    calls = [e for e in mine.get("router") or [] if "capacity" in e]
    labels = [n["target"] for n in mine.get("nll") or [] if n.get("target")]
    if len(calls) != len(labels):
        return None
    # the rows labelled -100 and those an attention mask zeroes (lift_padding)
    pads = [row_pads(mine, e.get("micro", 0), t, e["rows"]) for e, t in zip(calls, labels)]
    if any(p is None for p in pads):
        return None
    return [(e, sorted(p | set(e.get("masked") or []))) for e, p in zip(calls, pads)]


def shortest(lo: Fraction, hi: Fraction) -> Fraction | None:
    """The number of fewest decimals in (lo, hi], else None."""
    for d in range(0, 7):
        x = Fraction(int(hi * 10 ** d), 10 ** d)  # hi rounded down to d decimals
        if lo < x <= hi:
            return x
    return None


def _factor(calls, counts_padding: bool) -> Fraction | None:
    """The capacity factor of every call's C = ⌈cf · k · N / E⌉, N its rows or its real tokens."""
    lo, hi = Fraction(0), None
    for e, pads in calls:
        n = e["rows"] if counts_padding else e["rows"] - len(pads)
        if n <= 0:
            continue
        unit = Fraction(e["width"], e["top_k"] * n)
        lo, hi = max(lo, (e["capacity"] - 1) * unit), min(hi or e["capacity"] * unit, e["capacity"] * unit)
    return shortest(lo, hi) if hi is not None and lo < hi else None


def router_width(named) -> int | None:
    """The input width of the parameter whose name has a ``router`` or ``gate`` part (2-D, E × hidden)."""
    shapes = {tuple(e[0]["shape"]) for _, _, members in named for e in members
              if {"router", "gate"} & set(e[0]["name"].split(".")) and len(e[0]["shape"]) == 2}
    return next(iter(shapes))[1] if len(shapes) == 1 else None


def capacity_lines(st: Step, hidden: int | None) -> tuple[list[str], list[tuple[str, list]]]:
    """(the model's ``transformer`` block lines, the plan's ``capacity`` line) of the observed capacity steps."""
    per_rank = {r: _calls(st, r) for r in sorted(st.step)}
    found = [(r, e, pads) for r, calls in per_rank.items() for e, pads in calls or []]
    unpaired = [r for r, calls in per_rank.items() if calls is None]
    stepped = [e for r in unpaired for e in (st.step.get(r) or {}).get("router") or [] if "capacity" in e]
    if not found and not stepped:
        return [], []
    frames = _frames([e.get("capacity_stack") or e.get("stack") for _, e, _ in found]
                     + [e.get("capacity_stack") for e in stepped], st.script)
    padded = [(e, pads) for _, e, pads in found if pads]
    entered = [bool(set(pads) & set(e["entered"])) for e, pads in padded]
    shapes = {(e["width"], e.get("top_k")) for _, e, _ in found}
    why = None
    if stepped:
        why = ("the router calls with a capacity step are not paired with cross-entropies over their positions "
               "(or an attention mask's padded positions are not their rows)")
    elif len(shapes) > 1 or None in {k for _, k in shapes}:
        why = "the experts or the top-k differ between router calls"
    elif not padded and any(n["mask"]["sum"] < n.get("positions", 0) for r, _, _ in found
                            for n in (st.step.get(r) or {}).get("nll") or [] if n.get("mask")):
        why = ("a loss mask leaves out positions whose labels are not ignored and no padding mask reaches the router: "
               "whether they are padding, routed into the capacity step, is not observed")
    elif not padded:
        st.notes.append("the capacity step saw no padded position (no label at the ignore index): whether padding "
                        "takes expert slots is not observed, no capacity statement")
        return [], []
    elif len(set(entered)) > 1:
        why = "padded positions are routed into the capacity step in some router calls and masked in others"
    if why is None:
        counts = entered[0]
        cf = _factor([(e, pads) for _, e, pads in found], counts)
        if cf is None:
            why = ("no one capacity factor gives every router call's capacity C = ⌈capacity_factor·k·N/E⌉ of its "
                   + ("positions, padded ones included" if counts else "real tokens")
                   + (", the padded positions routed" if counts else ", the padded positions masked"))
    if why is not None:
        st.items.append(Unliftable(tuple(sorted({r for r, _, _ in found} | set(unpaired))), -1, "a capacity step", why,
                                   tuple(frames)))
        return [], []
    (experts, top_k), = shapes
    e0, pads0 = padded[0]
    if counts and cf * top_k >= experts:
        st.notes.append(f"the capacity step routes the padded positions, but its capacity factor {cf} is at least "
                        f"experts / top_k = {experts}/{top_k}: it drops no token, no capacity statement")
        return [], []
    n0 = e0["rows"] if counts else e0["rows"] - len(pads0)
    vocab = next((n.get("classes") for n in (st.step.get(found[0][0]) or {}).get("nll") or [] if n.get("classes")),
                 None)
    model = ["transformer {  # the MoE router's capacity step observed (lift_capacity)",
             f"  hidden = {hidden or 1}  # " + ("the router's input width" if hidden else "not observed"),
             "  layers = 1  # not observed: no obligation of the capacity step reads it (the parameters are params)",
             "  heads = 1  # not observed",
             f"  vocab = {vocab or 1}  # " + ("the cross-entropy's classes" if vocab else "not observed"),
             f"  experts = {experts}  # the router's columns",
             f"  top_k = {top_k}",
             f"  capacity_factor = {int(cf) if cf.denominator == 1 else repr(float(cf))}  # observed: C = {e0['capacity']} of "
             f"N = {n0} {'positions' if counts else 'real tokens'}",
             "}"]
    routed = sum(len(set(pads) & set(e["entered"])) for e, pads in padded)
    if counts:
        line = (f"  override capacity: counts_padding  # observed: {routed} padded position(s) routed into the capacity "
                f"step, C from the {e0['rows']} positions")
    else:
        st.notes.append("the padded positions are masked before the capacity step (capacity: masks_padding): as "
                        "derived, no override needed")
        line = (f"  override capacity: masks_padding  # observed: the padded positions masked before the capacity "
                f"step, C from the {n0} real tokens")
    return model, [(line, frames)]
