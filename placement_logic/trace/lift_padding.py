"""The padding an attention mask marks, for the lifts that read padding (no torch).

``recorder_padding`` records the attention mask passed beside the token ids of the model's call (0 a padded
position, by micro-step). Padding marked by it alone (no label at the ignore index, no loss mask) is padding
all the same: the lifts that read padding read it here, and where they cannot relate it to what they read they
say so (PL614), never proving what the trace does not show.

* ``row_pads``: the padded rows of a router call of R rows whose cross-entropy's labels are ``target``: the rows
  whose label is negative (the ignore index) and the rows the attention mask zeroes, the call's rows being the
  mask's positions (R its numel), or the positions it keeps (R its ones: the padding dropped before the router;
  the labels then over those rows, or over every position). None: a mask with padding whose positions are not
  the call's rows, or labels over neither (``lift_capacity``: not paired; ``aux_padding``: unknown).
* ``padded_tokens``: a cross-entropy whose labels are the mask's positions and that counts a position the mask
  zeroes as a token (its label not ignored, no loss mask leaving it out: a loss mask keeping more labelled
  positions than the mask's real ones) trains on the padding: the token count the lift states would hold the
  padding as tokens. Not lifted (PL614, ``padding``), as is a mask with padding whose positions are not the
  labels' (the padding in the loss or not is not observed).
* ``aux_padding``: the balancing loss's statistics (``lift_auxloss``: read over every row of the router call)
  over padded rows are ``loss[aux]: stats_count_padding``; a router call whose padding is not located is PL614.
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames
from .lift_step import Step


def _mask(mine: dict, micro: int) -> list[int] | None:
    return next((m["values"] for m in mine.get("attention_masks") or [] if m.get("micro", 0) == micro), None)


def mask_frames(mine: dict, micro: int | None = None) -> list:
    return next((m.get("stack") or [] for m in mine.get("attention_masks") or []
                 if micro is None or m.get("micro", 0) == micro), [])


def row_pads(mine: dict, micro: int, target: list | None, rows: int) -> set[int] | None:
    """The padded rows of a router call (see the module's docstring); None where not located."""
    mask = _mask(mine, micro)
    ones = [i for i, v in enumerate(mask or []) if v]
    if mask is not None and len(ones) < len(mask) and rows not in (len(mask), len(ones)):
        return None  # padding whose positions are not the call's rows
    dropped = mask is not None and rows == len(ones) < len(mask)  # the router saw the real positions only
    zeros = set() if mask is None or dropped else {i for i, v in enumerate(mask) if not v}
    if target is None:
        return zeros
    if len(target) == rows:
        return zeros | {i for i, y in enumerate(target) if y < 0}
    if mask is not None and len(target) == len(ones) and rows == len(mask):  # labels of the real positions only
        return zeros | {ones[j] for j, y in enumerate(target) if y < 0}
    if dropped and len(target) == len(mask):  # labels over every position, the router over the real ones
        return {j for j, i in enumerate(ones) if target[i] < 0}
    return None


def padded_tokens(st: Step) -> list[Unliftable]:
    """The cross-entropies that count positions the attention mask marks as padding (PL614)."""
    bad: list[tuple[int, str, list]] = []
    for r, mine in sorted(st.step.items()):
        for i, n in enumerate(mine.get("nll") or []):
            mask = _mask(mine, i)
            if not mask or all(mask):
                continue
            target = n.get("target")
            reals = sum(1 for v in mask if v)
            if target is not None and len(target) == reals:
                continue  # the loss over the real positions only
            if target is None or len(target) != len(mask):
                bad.append((r, "an attention mask marks padded positions that are not the cross-entropy's labels: "
                            "whether the loss counts them as tokens is not observed", mask_frames(mine, i)))
                continue
            real = sum(1 for v, y in zip(mask, target) if v and y >= 0)
            counted = n["mask"].get("labelled", n["mask"]["sum"]) if n.get("mask") else n.get("tokens", real)
            if counted > real:
                bad.append((r, f"the cross-entropy counts {counted - real} position(s) the attention mask marks as "
                            "padding (their labels not ignored, no loss mask leaving them out): the padding trained "
                            "on as tokens is not lifted (label them with the ignore index, -100)",
                            n.get("stack") or mask_frames(mine, i)))
    if not bad:
        return []
    return [Unliftable(tuple(sorted({b[0] for b in bad})), -1, "padding", bad[0][1],
                       tuple(_frames([bad[0][2]], st.script)))]


def aux_padding(st: Step, readings) -> tuple[bool, str | None]:
    """(whether the balancing loss's router calls hold padded rows, why that is not known, else None)."""
    padded = False
    for reading in readings:
        mine = next((s for s in st.ranks[reading.rank].get("steps") or [] if s.get("step") == reading.step), {})
        nll = mine.get("nll") or []
        for e in mine.get("router") or []:
            micro = e.get("micro", 0)
            n = nll[micro] if micro < len(nll) else {}
            target = n.get("target")
            pads = None if target is None and n.get("tokens", 0) < n.get("positions", 0) else \
                row_pads(mine, micro, target, e["rows"])
            if pads is None:
                return padded, ("the router's rows are not paired with the cross-entropy's labels or the attention "
                                "mask: whether the balancing loss's statistics count padded positions is not observed")
            padded = padded or bool(pads)
    return padded, None
