"""The loss's extra terms, its mask and the count it is normalised by, read from a trace (no torch).

``terms_pass`` runs before the passes that read the loss (``recorder_terms`` records what it reads):

* label smoothing passed to ``F.cross_entropy`` (``label_smoothing=a``): ``label_smoothing = true`` in the
  model block; the cross-entropy's recorded value holds the smoothing already.
* a term added to the cross-entropy in forward (``ce + other``, the two operands' values recorded): with r =
  other / ce · CE · N (CE the cross-entropy's value, N its normaliser: the labelled tokens under a mean, 1
  under a sum) the term's value per normalised token, r / Σ lse² over the labelled positions is the z-loss's
  coefficient β, and r / Σ (lse − mean logit) label smoothing's α / (1 − α) (the operand (1 − α)·CE) or
  c (CE + c·smooth): a coefficient with at most two significant digits (1e-4, 2e-3, 0.1; to a relative
  1e-5), one reading alone and the same on every rank and step, is read as that term, with lse and the
  mean logit over the whole vocabulary (``true``) or over the rank's vocabulary slice of a vocabulary-parallel
  output (``local``). Lifted as ``logit_z_loss = true`` / ``label_smoothing = true``, and under a tensor axis
  whose ranks hold vocabulary slices ``override activations[loss]: reduce_zloss | reduce_smoothing over (tp)``
  (the whole vocabulary's values: the term's sum all-reduced over the axis) or ``over ()`` (the slice's: never
  all-reduced). The loss passed to backward is then read as its cross-entropy part, total · ce / (ce + Σ
  other), for the normalisation. A term that matches neither is left to ``lift_facts`` (an auxiliary loss).
* a per-token cross-entropy (``reduction='none'``) multiplied by a 0/1 mask: read as a sum cross-entropy of
  the masked losses whose labelled tokens (``tokens``) are the positions the mask keeps and the labels do not
  ignore, of all the per-token losses' positions (``positions``).

``ignored_count`` reads the token count's all-reduce: a one-element count that equals the rank's positions
(the labels' numel, every per-token loss a mask multiplies) where they differ from its labelled tokens is
``tokens: count_ignored``.
"""

from __future__ import annotations

from .lift_auxloss import read_aux, snap
from .lift_layout import Unliftable, _frames
from .lift_step import Axes, Step

TERMS = {"label_smoothing": ("smooth", "reduce_smoothing", "label smoothing's mean logit"),
         "logit_z_loss": ("zsq", "reduce_zloss", "the z-loss's log-sum-exp")}


_snap = snap  # a coefficient of two significant digits


def _match(r: float, stats: dict, sliced: bool, weight: float = 1.0) -> list[tuple[str, str, float, float]]:
    """The (term, scope, scale, coefficient) readings of a term whose value per normalised token is ``r``: a coefficient as
    written, β in CE + β·lse² or c in CE + c·smooth (scale 1), else label smoothing's (1 − α)·CE + α·smooth,
    α = c / (1 + c) (scale 1 / (1 − α): the cross-entropy operand is 1 − α times the cross-entropy). Where both
    smoothing readings have a coefficient of two digits (c = 1 is α = 0.5, c = 0.25 is α = 0.2) the cross-entropy
    operand's own multiplier ``weight`` (the operand over the cross-entropy's recorded value) tells them apart: 1 is
    CE + c·smooth, 1 − α the other; a weight that is neither leaves both readings (no one term)."""
    out = []
    for term, (key, _, _) in TERMS.items():
        for scope in ("true", "local") if sliced else ("true",):
            s = stats.get(f"{key}_{scope}")
            if not s or not r / s > 0:
                continue
            readings = [(term, scope, 1.0, c) for c in [_snap(r / s)] if c is not None]
            alpha = _snap(r / s / (1 + r / s)) if term == "label_smoothing" else None
            if alpha is not None and alpha < 1:
                readings.append((term, scope, 1 / (1 - alpha), alpha))
            if len(readings) > 1:
                fits = [x for x in readings if abs(weight * x[2] - 1) <= 1e-5]
                readings = fits if len(fits) == 1 else readings
            out.extend(readings)
    return out


def _masked(n: dict) -> dict:
    """A per-token cross-entropy multiplied by a mask, as the sum cross-entropy it is."""
    m = n.get("mask")
    if n.get("reduction") not in ("none", "sum") or not m:
        return n
    return dict(n, reduction="sum", value=m["value"], tokens=m.get("labelled", m["sum"]),
                stack=n.get("stack") or m.get("stack") or [])


def _reading(x: tuple[str, str, float, float]) -> str:
    term, _, scale, coef = x
    if term == "logit_z_loss":
        return f"CE + {coef:g}·lse²"
    return f"CE + {coef:g}·smooth" if scale == 1.0 else f"(1 − {coef:g})·CE + {coef:g}·smooth"


def _step_terms(mine: dict, found: dict, coefs: dict, script: str, aux=None) -> tuple[list[dict], str] | None:
    """One rank's step: the readings of its terms into ``found`` ((term, scope) -> frames) and ``coefs`` (term
    -> coefficients); its losses read as their cross-entropy part. (the stack of a term read as no term, or as
    two; what the two readings are, or ""), else None. ``aux(micro, term, cross-entropy, operand)``: whether a term
    is the balancing loss (``lift_auxloss``), asked before the one-number readings of the other terms."""
    mine["nll"] = [_masked(n) for n in mine.get("nll") or []]
    nll, losses = mine["nll"], mine.get("losses") or []
    for n in nll:
        if n.get("label_smoothing"):
            found.setdefault(("label_smoothing", "true"), _frames([n.get("stack")], script))
    by_micro: dict[int, list[dict]] = {}
    for t in mine.get("terms") or []:
        by_micro.setdefault(t.get("micro", 0), []).append(t)
    for i, loss in enumerate(losses):
        terms = by_micro.get(i) or []
        n = nll[i] if i < len(nll) else None
        if not terms or n is None or "stats" not in n or n.get("reduction") not in ("mean", "sum"):
            continue
        base = terms[0]["ce"]
        total = loss.setdefault("total", loss.get("value", 0.0))
        if not base or not n.get("value"):
            continue
        norm = n.get("tokens", 0) if n["reduction"] == "mean" else 1
        sliced = n.get("width", 0) < n.get("classes", 0)
        readings = []
        for t in terms:
            # the balancing loss first: its reading is checked against the router's own records, where a z-loss's
            # or smoothing's reading is a match of one number (a balancing loss can match one by chance)
            if aux is not None and aux(i, t, n, base):
                continue  # the balancing loss: read with its groups, the cross-entropy part as the operand
            got = _match(t["other"] / base * n["value"] * norm, n["stats"], sliced, base / n["value"])
            if len(got) != 1:  # no reading, or more than one: an auxiliary loss
                both = " and as ".join(_reading(x) for x in got)
                return t.get("stack") or [], (f"the term added to the cross-entropy reads as {both}, and the "
                                              f"cross-entropy operand's multiplier ({base / n['value']:.6g}) "
                                              "tells neither" if len(got) > 1 else "")
            readings.append((got[0], t))
        scale = 1.0
        for (term, scope, factor, coef), t in readings:
            found.setdefault((term, scope), _frames([t.get("stack")], script))
            coefs.setdefault(term, set()).add(round(coef, 12))
            scale *= factor  # the cross-entropy part is the operand over 1 − α where it is (1 − α)·CE
        part = total * base / (base + sum(t["other"] for t in terms)) * scale
        # the cross-entropy part; the operand itself where nothing scaled the sum (no rounding between ranks)
        loss["value"] = base * scale if abs(part - base * scale) <= 1e-6 * abs(base * scale) else part
    return None


def terms_pass(st: Step, ax: Axes) -> tuple[list[str], list[tuple[str, list]]]:
    """(the model block's ``losses`` lines, the plan's ``activations[loss]`` lines)."""
    found: dict[tuple[str, str], list] = {}
    coefs: dict[str, set[float]] = {}
    unread: list[tuple[int, int, list]] = []
    both: list[tuple[int, int, list, str]] = []  # a term read two ways: named whatever the other steps read
    for r, part in sorted(st.ranks.items()):
        for mine in part.get("steps") or []:
            def aux(i, t, n, base, r=r, mine=mine):
                reading = read_aux(st, r, mine, i, t, n, base)
                st.aux_readings.extend([reading] if reading is not None else [])
                return reading is not None

            got = _step_terms(mine, found, coefs, st.script, aux)
            if got is not None:
                unread.append((r, mine.get("step", -1), got[0]))
                both.extend([(r, mine.get("step", -1), *got)] if got[1] else [])
    if both:
        r, k, stack, reason = both[0]
        st.items.append(Unliftable(tuple(sorted({b[0] for b in both})), -1, "an auxiliary loss",
                                   f"{reason} (rank {r}, step {k}): no one term", tuple(stack), hides=("divisor",)))
    if unread and found:  # read on some ranks or steps, not on these (else lift_facts names the loss itself)
        r, k, stack = unread[0]
        st.items.append(Unliftable(tuple(sorted({u[0] for u in unread})), -1, "an auxiliary loss",
                                   f"the term added to the cross-entropy reads as a z-loss or label smoothing on some "
                                   f"ranks or steps and as none of them (or as both) on rank {r}, step {k}",
                                   tuple(stack), hides=("divisor",)))
    for term, values in coefs.items():
        if len(values) > 1:
            st.items.append(Unliftable((st.observer,), -1, "an auxiliary loss",
                                       f"the {term.replace('_', ' ')} term's coefficient differs between ranks or "
                                       f"steps ({', '.join(f'{v:g}' for v in sorted(values))}): no one term",
                                       tuple(found.get((term, "true")) or found.get((term, "local")) or ()),
                                       hides=("divisor",)))
    model, lines = [], []
    for term, (_, verb, what) in TERMS.items():
        scopes = sorted(s for (t, s) in found if t == term)
        if not scopes:
            continue
        frames = [f for s in scopes for f in found[(term, s)]]
        model.append(f"{term} = true" + "".join(f"  # {f['file']}:{f['line']}" for f in frames[:1]))
        if len(scopes) > 1:
            st.items.append(Unliftable((st.observer,), -1, f"the {term.replace('_', ' ')} term",
                                       f"{what} read over the whole vocabulary on some ranks or steps and over the "
                                       "rank's slice on others", tuple(frames[:1])))
            continue
        sliced = any((n.get("width", 0) < n.get("classes", 0)) for p in st.ranks.values()
                     for s in p.get("steps") or [] for n in s.get("nll") or [])
        if not sliced:
            continue
        if ax.tp is None:
            st.items.append(Unliftable((st.observer,), -1, f"the {term.replace('_', ' ')} term",
                                       "the logits are vocabulary slices but no tensor axis is lifted",
                                       tuple(frames[:1])))
            continue
        if scopes[0] == "local":
            lines.append((f"  override activations[loss]: {verb} over ()  # observed: {what} over each rank's "
                          "vocabulary slice, never all-reduced", frames))
        else:
            lines.append((f"  override activations[loss]: {verb} over ({ax.tp})  # observed: {what} over the "
                          "whole vocabulary", frames))
    return model, lines


def ignored_count(st: Step, loss_rank: int) -> list[dict] | None:
    """The frames of a one-element all-reduce before the loss whose value on some data rank is that rank's
    positions (the labels' numel) and not its labelled tokens; None when the count is the tokens."""
    frames = None
    for r, mine in st.step.items():
        nll = mine.get("nll") or []
        if not nll:
            continue
        tokens = {float(nll[0].get("tokens", -1)), float(sum(n.get("tokens", 0) for n in nll))}
        positions = {float(nll[0].get("positions", -1)), float(sum(n.get("positions", 0) for n in nll))}
        for c in st.ranks[r]["collectives"]:
            if c["step"] != st.step_no or c["phase"] not in ("before_forward", "forward") \
                    or c["kind"] != "all_reduce" or c["numel"] != 1:
                continue
            v = c.get("value_in")
            if v in positions and v not in tokens:
                frames = frames or _frames([c["stack"]], st.script)
    return frames
