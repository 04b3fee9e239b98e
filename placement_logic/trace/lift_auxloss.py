"""The MoE load-balancing loss added to the cross-entropy, and the groups its statistics are taken over (no torch).

``recorder_terms`` records a router's probabilities (a 2-D softmax of E ≤ 256 columns: its rows T and column
sums) and the top-k chosen from them (k, each expert's count), the recorder every forward all-reduce of a vector
of at most 256 values (``vector_in``). A term added to the cross-entropy that no z-loss or smoothing reading
takes (``lift_terms``) is read here, on one rank and micro-step with one router call:

* f's group: the forward all-reduce whose input is the rank's counts (exactly); none: the rank's own tokens.
* P's group: the forward all-reduce whose input is the rank's column sums or their mean over its rows (to a
  relative 1e-5); none: the rank's own tokens.
* With those groups' ranks' own router records (not the collectives' outputs): f_i = Σ counts_i / Σ counts,
  P_i = Σ colsum_i / Σ rows, and the term's value per cross-entropy, r = term / ce · CE, is c · E · Σ_i f_i P_i
  for a coefficient c of two significant digits (``lift_terms._snap``): the balancing loss.

A group must be the ranks of a set of mesh axes (``_Layout.axes_of``; a part of an axis is none). ``aux_lines``
writes the objective of single-device training, the statistics over every token of the step (``losses { aux =
per_microbatch_mean  aux_stats = global_batch }``: one value per device averaged, as the data-parallel average
of each rank's loss gives it), the router's parameters as a group of its own (``group moe_router { like = router
}``: the parameters whose name has a ``router`` or ``gate`` part), and the path: ``override loss[aux]:
stats_per_step over (F)`` (one micro-step per optimizer step; ``stats_per_microbatch`` with several) and, where P
is taken over another group, ``probs_per_step | probs_per_microbatch over (P)`` (check.auxstats reads both).
"""

from __future__ import annotations

from dataclasses import dataclass

from .lift_layout import Unliftable, _frames
from .lift_padding import aux_padding
from .lift_step import Step


def snap(v: float) -> float | None:
    """``v`` > 0 as the coefficient with at most two significant digits it is (1e-4, 2e-3, 0.1, 5), else None."""
    if not v > 0:
        return None
    for e in range(0, 9):
        x = v * 10.0 ** e
        if 1 <= round(x) <= 99 and abs(x - round(x)) <= 1e-5 * x:  # fp32 sums: about 1e-7
            return round(x) / 10.0 ** e
    return None


@dataclass(frozen=True)
class AuxReading:
    rank: int
    step: int
    coef: float
    f_axes: tuple[str, ...]
    p_axes: tuple[str, ...]
    stack: tuple  # the counts' all-reduce (else the term's line)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b))


def _router(st: Step, rank: int, step_no: int, micro: int) -> dict | None:
    mine = next((s for s in st.ranks[rank].get("steps") or [] if s.get("step") == step_no), None)
    calls = [e for e in (mine or {}).get("router") or [] if e.get("micro", 0) == micro and "counts" in e]
    return calls[0] if len(calls) == 1 else None


def _gathered(st: Step, ranks: list[int], step_no: int, micro: int, key: str) -> list[float] | None:
    rows = [_router(st, q, step_no, micro) for q in ranks]
    if any(e is None for e in rows) or len({e["width"] for e in rows}) != 1:
        return None
    return [sum(float(e[key][i]) for e in rows) for i in range(rows[0]["width"])] + [sum(e["rows"] for e in rows)]


def read_aux(st: Step, rank: int, mine: dict, micro: int, term: dict, ce: dict, base: float) -> AuxReading | None:
    """The balancing-loss reading of ``term`` on ``rank``'s step ``mine`` (None: not one)."""
    step_no = mine.get("step", -1)
    own = _router(st, rank, step_no, micro)
    if own is None or not own.get("rows"):
        return None
    colls = [c for c in st.ranks[rank]["collectives"] if c["step"] == step_no and c["phase"] == "forward"
             and c["kind"] == "all_reduce" and c.get("micro", 0) == micro and c.get("op", "sum") == "sum"
             and len(c.get("vector_in") or []) == own["width"]]
    counts = [c for c in colls if c["vector_in"] == [float(x) for x in own["counts"]]]
    probs = [c for c in colls if _close(c["vector_in"], own["colsum"])
             or _close(c["vector_in"], [x / own["rows"] for x in own["colsum"]])]
    if len(counts) > 1 or len(probs) > 1:
        return None
    groups = [sorted(c[0]["ranks"]) if c else [rank] for c in (counts, probs)]
    axes = [st.layout.axes_of(g, rank) for g in groups]
    if any(a is None or st.layout.size(a) != len(g) for a, g in zip(axes, groups)):
        return None  # a group over part of an axis: no statistics statement holds it
    f, p = _gathered(st, groups[0], step_no, micro, "counts"), _gathered(st, groups[1], step_no, micro, "colsum")
    if f is None or p is None or not sum(f[:-1]) or not p[-1]:
        return None
    value = own["width"] * sum(fi / sum(f[:-1]) * pi / p[-1] for fi, pi in zip(f[:-1], p[:-1]))
    coef = snap(term["other"] / base * ce["value"] / value) if value > 0 and base and ce.get("value") else None
    if coef is None:
        return None
    stack = tuple(counts[0]["stack"] if counts else term.get("stack") or ())
    return AuxReading(rank, step_no, coef, axes[0], axes[1], stack)


def aux_lines(st: Step, readings: list[AuxReading], named, loss_kind: str, accum: int, stated: str | None = None
              ) -> tuple[list[str], list[str], list[tuple[str, list]]]:
    """(the model block's ``losses`` lines, its group lines, the plan's ``loss[aux]`` lines) of the readings;
    ``stated``: the objective the user states (``--objective aux_stats=...``), else single-device training's."""
    if not readings:
        if stated:
            st.notes.append(f"--objective aux_stats={stated}: no balancing loss was lifted, no objective written")
        return [], [], []
    kinds = {(r.f_axes, r.p_axes) for r in readings}
    frames = _frames([readings[0].stack], st.script)
    dense = next((members for g, _, members in named if g == "dense"), [])
    router = [e for _, _, members in named for e in members
              if {"router", "gate"} & set(e[0]["name"].split("."))]
    why = None
    if len(kinds) > 1:
        why = "the balancing loss's statistics are gathered over other groups on other ranks or steps"
    elif len({r.coef for r in readings}) > 1:
        why = "the balancing loss's coefficient differs between ranks or steps"
    elif not router or any(e not in dense for e in router):
        why = "no parameter of the plain (dense) group has a 'router' or 'gate' part in its name: the router is not read"
    elif loss_kind != "per_device_mean":
        why = f"the cross-entropy is read as {loss_kind.replace('_', ' ')}: the balancing loss's weight is not read"
    padded, unknown = aux_padding(st, readings)  # padded rows among the statistics' (lift_padding)
    why = why or unknown
    if why is not None:
        st.items.append(Unliftable(tuple(sorted({r.rank for r in readings})), -1, "an auxiliary loss", why,
                                   tuple(frames), hides=("divisor",)))
        return [], [], []
    (f_axes, p_axes), = kinds
    at = f"{frames[0]['file']}:{frames[0]['line']}: " if frames else ""
    model = [f"aux = per_microbatch_mean  # {at}the balancing loss, {readings[0].coef:g} · E · Σ f·P",
             f"aux_stats = {stated}  # stated (--objective): the objective the script means" if stated else
             "aux_stats = global_batch  # single-device training: the statistics of every token of the step"]
    names = ", ".join(e[0]["name"] for e in router[:4]) + (", ..." if len(router) > 4 else "")
    groups = [f"group moe_router {{ count = {sum(e[5] for e in router)}  like = router  tensor = whole }}  # {names}"]
    # one micro-step: the statistics of the step are its microbatch's, read as the objective stated means them
    scope = "per_step" if accum == 1 and stated != "per_microbatch" else "per_microbatch"
    lines = [(f"  override loss[aux]: stats_{scope} over ({', '.join(f_axes)})  # observed: the expert counts "
              + (f"all-reduced over ({', '.join(f_axes)})" if f_axes else "never all-reduced"), frames)]
    if p_axes != f_axes:
        lines.append((f"  override loss[aux]: probs_{scope} over ({', '.join(p_axes)})  # observed: the mean router "
                      + (f"probabilities all-reduced over ({', '.join(p_axes)})" if p_axes else
                         "probabilities of each rank's own tokens"), frames))
    if padded:
        lines.append(("  override loss[aux]: stats_count_padding  # observed: the router's statistics over every "
                      "row, padded positions included", frames))
    return model, groups, lines
