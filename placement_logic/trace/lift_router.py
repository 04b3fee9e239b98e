"""The MoE router's choice on the ranks of the tensor axis, as ``override router: ...`` (no torch; check.router).

``recorder_router`` records, on each router call (``router``: a forward softmax over E columns and its ``topk``),
the router linear's input (an exact checksum, two linear checksums Σ x and Σ x·w, and Σ |x|), where the noise was
drawn, exact checksums of the top-k's indices and values and of each sampled decision of its forward (a
``multinomial``, a ``bernoulli``, a draw of R or R·E elements: ``sampled``); on every forward all-reduce of a float
tensor its input's linear checksums. A call's choice is its top-k's indices and values and its sampled decisions'
results; a call with sampled decisions and no ``topk`` is a router call too. Under a tensor axis without sequence
parallelism (its ranks hold the same tokens), the calls of the first step that routed (later steps start from the
weights earlier routings left) are paired in order between the ranks of each tensor group and compared:

* equal inputs, equal indices and values: the derivation (``router: same``), a note, no statement;
* equal inputs, different indices or values: the ranks drew different noise (a per-rank seed):
  ``override router: vary over (tp)`` at the noise draw (else the ``topk``); equal indices and values but different
  samples (a second expert sampled from a per-rank seed): the same statement at the first sampled decision that
  differs;
* different inputs whose linear checksums summed over the group are those of a forward all-reduce over exactly the
  tensor group of the same micro-step and size (to 1e-5 of Σ |x|): the router read each rank's summand of the
  all-reduced activation the rest of the layer reads (the row-parallel output before its all-reduce):
  ``override router: input_partial over (tp)`` at the router's linear.

Under sequence parallelism (its ranks hold different tokens unless the router reads an input gathered over them)
the calls are paired the same way: choices that differ on equal inputs (the same tokens), or where the input is not
observed, are named (PL614; ``router: vary`` states ranks that hold the same tokens without it); inputs that differ
are different tokens, a note.

Anything else (inputs that differ otherwise, choices that differ where the input was not observed, calls not
paired, E or k differing, sampled decisions that differ in number or op, calls of one step read both ways) is a
router call, named (PL614), never proved. Without sequence parallelism, a ``multinomial`` in forward that no router
call's forward holds (``draws``) whose results differ between the ranks of a tensor group is a sampled choice, named
(PL614). A statement lifted also explains the losses and outputs that
differ between the tensor ranks after it (``lift_activations``' ``the output of ... over tp``, ``the loss over
tp``): those items are dropped. With the statement the model gets a ``transformer`` block of E and k (where the
capacity step wrote none): the router's input width as ``hidden``, the cross-entropy's classes as ``vocab``, k the
top-k's plus the experts its ``multinomial`` draws sample.
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames, _Layout
from .lift_step import Axes, Step

SAME, VARY, PARTIAL = "same", "vary", "input_partial"


def _groups(layout: _Layout, tp: str) -> list[list[int]]:
    """The rank sets that differ along ``tp`` only."""
    i = layout.names.index(tp)
    out: dict[tuple, list[int]] = {}
    for r, c in sorted(layout.coords.items()):
        out.setdefault(c[:i] + c[i + 1:], []).append(r)
    return list(out.values())


def _routed(e: dict) -> bool:
    """A router call that chose: a ``topk`` of its probabilities, or a sampled decision."""
    return "chosen" in e or bool(e.get("sampled"))


def _calls(part: dict, step_no: int) -> list[dict]:
    mine = next((s for s in part.get("steps") or [] if s.get("step") == step_no), {})
    return [e for e in mine.get("router") or [] if _routed(e)]


def _first_step(st: Step) -> int | None:
    steps = [s["step"] for part in st.ranks.values() for s in part.get("steps") or []
             if any(_routed(e) for e in s.get("router") or [])]
    return min(steps) if steps else None


def _choice(e: dict) -> tuple:
    """What a call chose: its top-k's indices and values, and every sampled decision's result."""
    return e.get("chosen"), e.get("gates"), tuple((d["op"], d["sha"]) for d in e.get("sampled") or [])


def _where(calls: dict[int, dict]) -> list:
    """The line a choice that differs is stated at: where the top-k's choice agrees, the first sampled decision
    that differs; else the noise drawn before the softmax, else the ``topk``."""
    es = list(calls.values())
    if len({(e.get("chosen"), e.get("gates")) for e in es}) == 1:
        for i, d in enumerate(es[0].get("sampled") or []):
            if len({e["sampled"][i]["sha"] for e in es}) > 1:
                return d["stack"]
    e = es[0]
    return e.get("noise_stack") or e.get("choice_stack") or e.get("stack") or []


def _summed(st: Step, group: list[int], step_no: int, micro: int, numel: int) -> list[list[float]]:
    """The linear checksums of every all-reduced activation of ``numel`` elements over exactly ``group`` in the
    micro-step's forward: the sum over the group of its ranks' inputs (paired in order)."""
    per = [[c["sums"] for c in st.ranks[r]["collectives"] if c["step"] == step_no and c["phase"] == "forward"
            and c["kind"] == "all_reduce" and c.get("op", "sum") == "sum" and c.get("micro", 0) == micro
            and c.get("numel") == numel and sorted(c["ranks"]) == group and c.get("sums")] for r in group]
    n = min(len(x) for x in per)
    return [[sum(x[k][j] for x in per) for j in range(2)] for k in range(n)]


def _read(st: Step, group: list[int], step_no: int, calls: dict[int, dict]) -> tuple[str | None, str]:
    """(the reading of one call on ``group``: SAME, VARY, PARTIAL, or None with why)."""
    first = calls[group[0]]
    if len({tuple(d["op"] for d in e.get("sampled") or []) for e in calls.values()}) > 1:
        return None, "its sampled routing decisions differ in number or kind between the tensor ranks"
    same_choice = len({_choice(e) for e in calls.values()}) == 1
    if any("input" not in e for e in calls.values()):
        return (SAME, "") if same_choice else (None, "its choices differ between the tensor ranks and its input is not "
                                               "observed (no mm of its shape before the softmax): noise or input not read")
    if len({(e["width"], e["rows"], e.get("top_k"), e["input"]["numel"]) for e in calls.values()}) > 1:
        return None, "its experts, top-k, rows or input differ between the ranks"
    if len({e["input"]["sha"] for e in calls.values()}) == 1:
        return (SAME if same_choice else VARY), ""
    lin = [sum(e["input"]["lin"][j] for e in calls.values()) for j in range(2)]
    tol = 1e-5 * sum(e["input"]["abs"] for e in calls.values()) + 1e-9
    for sums in _summed(st, group, step_no, first.get("micro", 0), first["input"]["numel"]):
        if all(abs(a - b) <= tol for a, b in zip(lin, sums)):
            return PARTIAL, ""
    return None, ("its input differs between the tensor ranks, and its sum over them is no activation all-reduced "
                  "over the axis in that forward: what the router reads is not lifted")


def router_lines(st: Step, ax: Axes, sp: bool, hidden_lines: bool) -> tuple[list[str], list[tuple[str, list]]]:
    """(the model's ``transformer`` block lines, where ``hidden_lines`` is false and a statement is lifted; the plan's
    ``router`` line)."""
    step_no = _first_step(st)
    if ax.tp is not None and not sp:
        _draws(st, ax.tp)
    if ax.tp is None or step_no is None:
        return [], []
    if sp:
        _sequence_parallel(st, ax.tp, step_no)
        return [], []
    found: dict[str, list[dict]] = {}
    wheres: list[list] = []  # where each call read as vary differs
    for group in _groups(st.layout, ax.tp):
        per = {r: _calls(st.ranks[r], step_no) for r in group if r in st.ranks}
        if len(per) != len(group) or len({len(c) for c in per.values()}) != 1:
            _name(st, group, next(iter(per.values()), []), "the router calls are not paired between the tensor ranks "
                  "(another number of calls on some rank)")
            return [], []
        for i in range(len(per[group[0]])):
            calls = {r: per[r][i] for r in group}
            kind, why = _read(st, group, step_no, calls)
            if kind is None:
                _name(st, group, [calls[group[0]]], why)
                return [], []
            found.setdefault(kind, []).append(calls[group[0]])
            if kind == VARY:
                wheres.append(_where(calls))
    wrong = [k for k in (VARY, PARTIAL) if k in found]
    if len(wrong) > 1:
        _name(st, sorted(st.ranks), found[VARY][:1], "some router calls draw different noise on the tensor ranks and "
              "others read each rank's partial sums: one router statement cannot state both")
        return [], []
    if not wrong:
        st.notes.append(f"the router chose the same experts with the same gate weights on the ranks of {ax.tp} from "
                        "the same input (router: same): as derived, no override needed")
        return [], []
    kind = wrong[0]
    e = found[kind][0]
    if kind == VARY:
        frames = _frames([wheres[0]], st.script)
        line = (f"  override router: vary over ({ax.tp})  # observed: the router's input equal on the ranks of {ax.tp}, "
                "its top-k experts or gate weights or its sampled experts different (noise or samples drawn per rank)")
    else:
        frames = _frames([e["input"].get("stack") or e.get("stack") or []], st.script)
        line = (f"  override router: input_partial over ({ax.tp})  # observed: the router's input differs between the "
                f"ranks of {ax.tp} and sums over them to an activation all-reduced over {ax.tp}")
    # what differs between the tensor ranks after the routing: the routing's consequences
    st.items[:] = [u for u in st.items if not (u.what == f"the loss over {ax.tp}" or (
        u.what.startswith("the output of ") and u.what.endswith(f" over {ax.tp}")))]
    return ([] if hidden_lines else _model(st, e, ax.tp)), [(line, frames)]


def _sequence_parallel(st: Step, tp: str, step_no: int) -> None:
    """Under sequence parallelism the ranks of ``tp`` hold different tokens, except where a router reads an input
    gathered over them: calls with equal inputs (the same tokens) must choose alike; no statement holds a choice
    that differs on them (``router: vary`` names ranks that hold the same tokens without sequence parallelism), and
    choices that differ where the input is not observed cannot be told apart from different tokens: both named."""
    for group in _groups(st.layout, tp):
        per = {r: _calls(st.ranks[r], step_no) for r in group if r in st.ranks}
        if len(per) != len(group) or len({len(c) for c in per.values()}) != 1:
            _name(st, group, next(iter(per.values()), []), "the router calls are not paired between the tensor ranks "
                  "(another number of calls on some rank)")
            return
        for i in range(len(per[group[0]])):
            calls = {r: per[r][i] for r in group}
            if len({_choice(e) for e in calls.values()}) == 1:
                continue
            if any("input" not in e for e in calls.values()):
                why = "its input is not observed, so whether the ranks hold the same tokens is not known"
            elif len({e["input"]["sha"] for e in calls.values()}) == 1:
                why = "its input (the same tokens) is equal on the ranks"
            else:
                continue  # different tokens under sequence parallelism: different choices
            _name(st, group, [calls[group[0]]], f"under sequence parallelism over {tp} its choices differ between "
                  f"the tensor ranks and {why}: no statement holds a router that routes the same tokens differently "
                  "under sequence parallelism")
            return
    st.notes.append(f"the router's choice under sequence parallelism over {tp}: its ranks' calls read different "
                    "tokens or chose alike")


def _draws(st: Step, tp: str) -> None:
    """A ``multinomial`` in forward outside every router call's forward (``draws``), paired in order per step
    between the ranks of each tensor group (which hold the same tokens): results that differ are a sampled choice
    the lift ties to no router call, named."""
    for group in _groups(st.layout, tp):
        per = [{s["step"]: s.get("draws") or [] for s in st.ranks[r].get("steps") or []} for r in group
               if r in st.ranks]
        for step_no in sorted({n for p in per for n in p}):
            seqs = [p.get(step_no, []) for p in per]
            if len({tuple((d["op"], d["sha"], d.get("micro", 0)) for d in q) for q in seqs}) > 1:
                first = next(q for q in seqs if q)
                _name(st, group, [{"stack": first[0]["stack"]}], f"a sampled draw ({first[0]['op']}) in forward outside "
                      "every router call's forward (no softmax of the router's shape before it in its module) differs "
                      f"between the ranks of {tp}, which hold the same tokens: not tied to a router call", "a sampled choice")
                return


def _name(st: Step, ranks, calls: list[dict], why: str, what: str = "a router call") -> None:
    frames = _frames([c.get("choice_stack") or c.get("stack") or [] for c in calls], st.script)
    st.items.append(Unliftable(tuple(sorted(ranks)), -1, what, why, tuple(frames)))


def _model(st: Step, e: dict, tp: str) -> list[str]:
    """The model's ``transformer`` block: E and k observed, the router's input width, the classes."""
    vocab = next((n.get("classes") for part in st.step.values() for n in part.get("nll") or [] if n.get("classes")),
                 None)
    hidden = e["input"]["numel"] // e["rows"] if e["rows"] else None
    return ["transformer {  # the MoE router observed (lift_router)",
            f"  hidden = {hidden or 1}  # the router's input width",
            "  layers = 1  # not observed: no obligation of the router reads it (the parameters are params)",
            f"  heads = {st.layout.size([tp])}  # not observed: whole heads on each of the {tp} ranks",
            f"  vocab = {vocab or 1}  # " + ("the cross-entropy's classes" if vocab else "not observed"),
            f"  experts = {e['width']}  # the router's columns",
            f"  top_k = {_top_k(e)}",
            "}"]


def _top_k(e: dict) -> int:
    """The experts a call gives each token: its top-k's k plus the experts its ``multinomial`` draws sample."""
    k = (e.get("top_k") or 0) + sum(d.get("samples", 0) for d in e.get("sampled") or [] if d["op"] == "multinomial")
    return max(1, min(k, e["width"]))
