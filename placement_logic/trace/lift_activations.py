"""The activation collectives of a traced step over the tensor axis, as the plan's activation overrides (no torch).

A tensor-parallel layer region (docs/semantics.md "Activations and their gradients": ``attention``, ``mlp``,
``head``) has Megatron-LM's f and g: the row-parallel linear's partial outputs all-reduced in forward, the
column-parallel linear's input gradient all-reduced in backward. The recorder attributes every collective to the
module whose forward issued it and checksums each layer's input and output on every rank, so:

- ``unreduced_outputs``: a layer whose input and output both differ between the tensor ranks, inside whose
  forward no collective ran over the axis, while the ranks compute different losses from the same inputs, is a
  row-parallel layer whose partial sums are never all-reduced: ``override activations[R]: reduce over ()`` at its
  ``def forward`` (R the region its name places it in), else reported (PL614) naming it.
- ``unreduced_input_grads``: under tensor parallelism (not sequence parallelism), parameters whole on the axis
  held by layers that run before a column-parallel layer (equal input, different outputs on the tensor ranks, in
  the first step), whose gradients differ between the tensor ranks with no reduction over it, while the losses
  agree: the column-parallel layer's input gradient is never all-reduced: ``override activation_grads[R]:
  no_reduce`` at that layer's ``def forward``; with more than one column-parallel layer (which one is not read)
  reported naming them.
- ``input_grad_reductions``: an all-reduce (sum) over exactly the tensor axis issued in the backward of a custom
  autograd function, carrying no parameter's gradient, is the column-parallel input gradient's reduction that
  ``megatron_tp`` derives (Megatron's copy-to-tensor-parallel region): not reported.

A module is placed in a region by the components of its qualified name and its class (the innermost that
names one: ``attn``, ``o_proj`` ...: attention; ``mlp``, ``fc2``, ``down_proj`` ...: mlp; ``lm_head``, ``head``,
``output``: head), else its class; a name that places it in no region is not guessed: the fact is reported naming the module.
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames, _Layout

_WORDS = {
    "attention": ("attn", "attention", "self_attn", "self_attention", "o_proj", "out_proj", "q_proj", "k_proj",
                  "v_proj", "qkv", "qkv_proj", "wq", "wk", "wv", "wo", "c_attn", "query_key_value"),
    "mlp": ("mlp", "ffn", "feed_forward", "feedforward", "fc1", "fc2", "up_proj", "down_proj", "gate_proj", "w1",
            "w2", "w3", "c_fc", "dense_h_to_4h", "dense_4h_to_h"),
    "head": ("lm_head", "head", "output", "classifier"),
}
_CLASS = {"attention": ("attention", "attn"), "mlp": ("mlp", "feedforward")}


def region_of(name: str, cls: str = "") -> str | None:
    """The region a module belongs to: the innermost name component that names one (``layers.0.mlp.c_proj``:
    mlp), else its class; None when nothing or two regions do."""
    parts = [p.lower() for p in name.split(".") if p and not p.isdigit()]
    for part in reversed(parts):
        hits = {r for r, words in _WORDS.items() if part in words}
        if len(hits) == 1:
            return hits.pop()
    hits = {r for r, words in _CLASS.items() if any(w in cls.lower() for w in words)}
    return hits.pop() if len(hits) == 1 else None


def _losses(step: dict, r) -> list:
    return [x.get("value") for x in step.get(r, {}).get("losses", [])]


def _over(m: dict, by_seq: dict, layout: _Layout, tp: str, r: int) -> list[int]:
    return [s for s in m.get("collectives", []) if s in by_seq and tp in (layout.axes_of(by_seq[s]["ranks"], r) or ())]


def _where(m: dict, script: str) -> list[dict]:
    return [m["at"]] if m.get("at") else _frames([m.get("stack", [])], script)


def unreduced_outputs(ranks: dict, step: dict, layout: _Layout, tp: str, stage_ranks: list[int],
                      loss_rank: int, script: str) -> tuple[list[Unliftable], list[tuple[str, list]]]:
    """(what is reported, the override lines) for a row-parallel output never reduced over ``tp``."""
    other = layout.neighbour(loss_rank, tp)
    if other is None or not _losses(step, loss_rank) or _losses(step, loss_rank) == _losses(step, other):
        return [], []
    by_seq = {r: {c["seq"]: c for c in ranks[r]["collectives"]} for r in ranks}
    for r in stage_ranks:
        o = layout.neighbour(r, tp)
        theirs = {m.get("name"): m for m in step.get(o, {}).get("modules", [])}
        for m in step.get(r, {}).get("modules", []):
            t = theirs.get(m.get("name"))
            if t is None or None in (m.get("input"), m.get("output")):
                continue
            if m["input"] != t.get("input") and m["output"] != t.get("output") and not _over(m, by_seq[r], layout,
                                                                                                tp, r):
                region = region_of(m.get("name", ""), m.get("class", ""))
                if region in ("attention", "mlp"):
                    return [], [(f"  override activations[{region}]: reduce over ()  # observed: the partial sums of "
                                 f"{m.get('name')} ({m.get('class')}) never all-reduced over {tp} in its forward",
                                 _where(m, script))]
                return [Unliftable(
                    (r, o), -1, f"the output of {m.get('name')} ({m.get('class')}) over {tp}",
                    f"its input and its weights are split over {tp} (row-parallel) and its output differs between "
                    f"the tensor ranks: a partial sum never all-reduced over {tp} in its forward, so the tensor "
                    "ranks compute different losses from the same inputs; its name places it in no layer region "
                    "(attention, mlp) whose activation override would state it", tuple(_where(m, script)))], []
    frames = tuple((step[loss_rank].get("losses") or [{}])[0].get("stack") or ())
    return [Unliftable((loss_rank, other), -1, f"the loss over {tp}",
                       f"the tensor ranks along {tp} compute different losses ({_losses(step, loss_rank)[0]:.6g} and "
                       f"{_losses(step, other)[0]:.6g}) from the same inputs: some forward output is never reduced "
                       f"over {tp}; which one is not lifted", frames)], []


def unreduced_input_grads(ranks: dict, first: dict, step: dict, layout: _Layout, tp: str, observer: int,
                          script: str) -> tuple[list[Unliftable], list[tuple[str, list]]]:
    """(what is reported, the override lines) for a column-parallel input gradient never reduced over ``tp`` (``first``: each rank's first step)."""
    other = layout.neighbour(observer, tp)
    if other is None or not _losses(step, observer) or _losses(step, observer) != _losses(step, other):
        return [], []
    by_seq = {c["seq"]: c for c in ranks[observer]["collectives"]}
    theirs = {m.get("name"): m for m in first.get(other, {}).get("modules", [])}
    mods = first.get(observer, {}).get("modules", [])
    column = [i for i, m in enumerate(mods) if m.get("name") in theirs and None not in (m.get("input"), m.get("output"))
              and m["input"] == theirs[m["name"]].get("input") and m["output"] != theirs[m["name"]].get("output")
              and not _over(m, by_seq, layout, tp, observer)]
    if not column:
        return [], []
    before = {m.get("name") for m in mods[:column[0]]}
    grads = {r: {p["name"]: p for p in (step.get(r, {}).get("optimizer") or {}).get("params", [])}
             for r in (observer, other)}
    wrong = []
    for name, p in grads[observer].items():
        q = grads[other].get(name)
        if q is None or p.get("placements") or name.rpartition(".")[0] not in before:
            continue
        g, h = p.get("grad") or {}, q.get("grad") or {}
        reduced = any(tp in (layout.axes_of(by_seq[s]["ranks"], observer) or ()) for s in g.get("collectives", [])
                      if s in by_seq)
        if g.get("checksum") and h.get("checksum") and g["checksum"] != h["checksum"] and not reduced:
            wrong.append(name)
    if not wrong:
        return [], []
    cols = [mods[i] for i in column]
    region = region_of(cols[0].get("name", ""), cols[0].get("class", "")) if len(cols) == 1 else None
    if region is not None:
        return [], [(f"  override activation_grads[{region}]: no_reduce  # observed: the input gradient of "
                     f"{cols[0].get('name')} ({cols[0].get('class')}) never all-reduced over {tp} ({', '.join(wrong[:3])}"
                     " differ between the tensor ranks)", _where(cols[0], script))]
    names = ", ".join(f"{m.get('name')} ({m.get('class')})" for m in cols[:4])
    return [Unliftable((observer, other), -1, f"the input gradient of {names} over {tp}",
                       f"the gradients of {', '.join(wrong[:3])}, whole on {tp}, differ between the tensor ranks and "
                       f"are never reduced over {tp}: a column-parallel input gradient never all-reduced in backward; "
                       "which layer's (and its region) is not lifted", tuple(_where(cols[0], script)))], []


def input_grad_reductions(ranks: dict, layout: _Layout, tp: str, sp: bool) -> set[str]:
    """The custom autograd functions whose backward collectives are all sums over exactly ``tp`` of no parameter's
    gradient: the column-parallel input gradient's reduction (none under sequence parallelism, whose backward
    reduce-scatters)."""
    fns: dict[str, bool] = {}
    for r, part in ranks.items():
        for c in part["collectives"]:
            fn = c.get("custom_backward")
            if fn is None:
                continue
            ok = (not sp and c["kind"] == "all_reduce" and c.get("op", "sum") == "sum" and not c.get("carried")
                  and layout.axes_of(c["ranks"], r) == (tp,))
            fns[fn] = fns.get(fn, True) and ok
    return {fn for fn, ok in fns.items() if ok}
