"""IR summary: checked ``ir.Spec`` -> plain report data (dicts) and its text form.

Used by ``placement inspect``: what the resolver made of each plan, axis by axis.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Collection

from .. import ir
from . import groups as pg
from . import heads, views
from .walker import fold


def _show_count(x: Fraction | None) -> str | None:
    if x is None:
        return None
    return f"{x.numerator:,}" if x.denominator == 1 else str(x)


def parameter_counts(spec: ir.Spec) -> dict | None:
    """Ψ, the parameters one token uses (MoE), and each parameter group's count, as exact
    numbers where the bindings make them numbers (no sympy: the groups' IR values folded)."""
    model = spec.model
    if model is None:
        return None
    bindings = dict(spec.bindings)
    groups = pg.param_groups(model)
    counts = {g.name: fold(g.count, bindings) for g in groups}
    if model.params is not None:
        psi = fold(model.params, bindings)
    elif any(counts[g.name] is None for g in groups if not g.copy):
        psi = None
    else:
        psi = sum((counts[g.name] for g in groups if not g.copy), Fraction(0))
    active = psi
    t = model.transformer
    if t is not None and psi is not None:
        E, k = fold(t.experts, bindings), fold(t.top_k, bindings)
        experts = [counts[g.name] for g in groups if g.expert]
        if E not in (None, 1) and k is not None and None not in experts:
            active = psi - sum(experts, Fraction(0)) * (1 - k / E)
    return {"params": psi, "active_params": active, "groups": counts}


def _bindings(spec: ir.Spec, sets: Collection[str] = ()) -> dict:
    """Each let and axis size: its expression and, when it folds to a number, that number (each
    binding folded once, through the numbers of the ones before it: linear in their count);
    ``set`` marks the names re-bound on the command line (``sets``)."""
    known: dict[str, ir.Value] = {}
    out = {}
    for name, v in spec.bindings:
        x = fold(v, known)
        if x is not None:
            known[name] = ir.Const(x)
        out[name] = {"value": _json_number(x), "exact": None if x is None else str(x), "formula": ir.show(v),
                     "set": name in sets}
    return out


def _json_number(x: Fraction | None) -> int | float | None:
    """An integer as itself, a fraction as the nearest double (None past a double's range)."""
    if x is None or x.denominator == 1:
        return None if x is None else x.numerator
    try:
        return x.numerator / x.denominator
    except OverflowError:
        return None


def plan_data(plan: ir.Plan) -> dict:
    return {
        "plan": plan.name,
        "location": f"{plan.span.file}:{plan.span.line}:{plan.span.column}",
        "mesh": [{"axis": a.name, "size": ir.show(a.size), "link": a.link, "role": views.view(plan).role(a.name).value}
                 for a in plan.mesh.axes],
        "bindings": [{"axes": list(b.axes), "strategy": b.strategy, **({"product": True} if b.product else {})}
                     for b in plan.bindings],
        "placements": [
            {
                "state": p.state.value,
                "modes": {a: m.value for a, m in p.modes},
                "residency": p.residency.value,
                "unit": p.unit,
                "prefetch": p.prefetch,
                "reshard_after_forward": p.reshard_after_forward,
            }
            for p in plan.placements
        ],
        "recompute": plan.recompute.value,
        "flash_attention": plan.flash_attention,
        "sequence_parallel": plan.sequence_parallel,
        "schedule": None if plan.schedule is None else {
            "kind": plan.schedule.kind.value,
            "axis": plan.schedule.axis,
            "chunks": ir.show(plan.schedule.chunks),
            "unit": ir.show(plan.schedule.unit),
        },
        "overrides": [_override_text(o) for o in plan.overrides],
        **({"optimizers": {g: c.text() for g, c in plan.optimizers}} if plan.optimizers else {}),
        "notes": [n for n in (heads.copies_note(plan),) if n]
        + [f"unobserved: {t} (line {span.line}): not stated by the plan, so what the checker would prove of it is "
           "unknown" for t, span in plan.unobserved],
    }


def _override_text(o: ir.Override) -> str:
    text = o.target + (f"[{o.group}]" if o.group else "") + f": {o.verb}"
    if o.axes is not None:
        text += f" over ({', '.join(o.axes)})"
    if o.ranks is not None:
        text += f" ranks ({', '.join(ir.show(r) for r in o.ranks)})"
    if o.by is not None:
        text += f" by {ir.show(o.by)}"
    if o.sizes is not None:
        text += f" by ({', '.join(ir.show(s) for s in o.sizes)})"
    if o.sets is not None:
        text += " ranks (" + ", ".join("[" + ", ".join(ir.show(r) for r in s) + "]" for s in o.sets) + ")"
    return text


def spec_data(spec: ir.Spec, plans: tuple[str, ...] = (), sets: Collection[str] = ()) -> dict:
    """The resolved spec as data; ``plans``: only these plans (all when empty); ``sets``: the
    names the spec was re-bound at (``ir.rebinding``), marked ``set`` among the bindings."""
    model = spec.model
    counts = parameter_counts(spec)
    return {
        "file": spec.file,
        "bindings": _bindings(spec, sets),
        "model": None if model is None else {
            "params": None if model.params is None else ir.show(model.params),
            "params_count": _show_count((counts or {}).get("params")),
            "active_params": _show_count((counts or {}).get("active_params")),
            "groups": {k: _show_count(v) for k, v in (counts or {}).get("groups", {}).items()},
            "bytes": {
                "params": ir.show(model.bytes_params),
                "grads": ir.show(model.bytes_grads),
                "optimizer": ir.show(model.bytes_optimizer),
                "activations": ir.show(model.bytes_activations),
            },
            "transformer": model.transformer is not None,
        },
        "plans": [plan_data(p) for p in spec.plans if not plans or p.name in plans],
        "questions": [
            {"kind": q.kind, "label": q.label, "test": f"{ir.show(q.left)} {q.op} {ir.show(q.right)}",
             "dim": q.dim.value}
            for q in spec.questions
        ],
    }


def _set_mark(binding: dict) -> str:
    return " (--set)" if binding["set"] else ""


def _window_lines(model) -> list[str]:
    """The model's sliding-window attention (check.cpwindow), if it states one."""
    w = model.attention_window if model is not None else None
    c = model.attention_chunk if model is not None else None  # chunked attention (check.cpchunk)
    return ([] if w is None else [f"  attention: sliding window of {ir.show(w[0])} tokens"]) + (
        [] if c is None else [f"  attention: chunks of {ir.show(c[0])} tokens"])


def spec_text(spec: ir.Spec, plans: tuple[str, ...] = (), sets: Collection[str] = ()) -> str:
    data = spec_data(spec, plans, sets)
    lines = [f"spec {data['file']}"]
    if data["bindings"]:
        lines.append("  symbols: " + ", ".join(f"{k} = {v['formula']}{_set_mark(v)}"
                                               for k, v in data["bindings"].items()))
    if data["model"]:
        m = data["model"]
        psi = m["params_count"]
        given = m["params"] or "derived from the transformer shape"
        if psi and m["params"] is None:
            shown = f"{psi} ({given})"
        elif psi and psi.replace(",", "") != given:
            shown = f"{given} = {psi}"
        else:
            shown = given
        lines.append(f"  model: params = {shown}; bytes per element: "
                     + ", ".join(f"{k} {v}" for k, v in m["bytes"].items()))
        if m["active_params"] and m["active_params"] != psi:
            lines.append(f"  active per token: {m['active_params']} parameters")
        if m["groups"]:
            lines.append("  parameter groups: " + ", ".join(f"{k} {v if v is not None else '?'}"
                                                          for k, v in m["groups"].items()))
    if spec.model is not None and spec.model.loss_terms:  # the objective's terms besides the main loss
        lines.append("  loss terms: " + ", ".join(f"{t} = {o}" for t, o, _ in spec.model.loss_terms)
                     + (f" (aux statistics: {spec.model.aux_stats[0]}"
                        + (", packed rows" if spec.model.aux_packed else "") + ")" if spec.model.aux_stats else ""))
    if spec.model is not None and spec.model.ce_terms:  # the cross entropy's label smoothing, output z-loss
        lines.append("  cross entropy: " + ", ".join(k for k, _ in spec.model.ce_terms))
    lines += _window_lines(spec.model)
    for p in data["plans"]:
        lines.append("")
        lines.append(f"plan {p['plan']}  ({p['location']})")
        axes = [a["axis"] for a in p["mesh"]]
        rows = [("axis", axes), ("size", [a["size"] for a in p["mesh"]]),
                ("role", [a["role"] for a in p["mesh"]]), ("link", [a["link"] or "-" for a in p["mesh"]])]
        extras = {}
        for pl in p["placements"]:
            extra = [f"residency={pl['residency']}"] if pl["residency"] != "device" else []
            if "S*" in pl["modes"].values():
                extra += [f"unit={pl['unit']}", f"prefetch={pl['prefetch']}",
                          f"reshard_after_forward={str(pl['reshard_after_forward']).lower()}"]
            rows.append((pl["state"], [pl["modes"][a] for a in axes]))
            extras[pl["state"]] = " ".join(extra)
        widths = [max(len(r[1][i]) for r in rows) + 2 for i in range(len(axes))]
        for label, cells in rows:
            line = "  " + label.ljust(13) + "".join(c.ljust(w) for c, w in zip(cells, widths))
            lines.append((line + extras.get(label, "")).rstrip())
        joined = [("×" if b.get("product") else "/").join(b["axes"]) for b in p["bindings"]]
        lines.append("  bindings: " + "; ".join(f"{a} <- {b['strategy']}" for a, b in zip(joined, p["bindings"])))
        settings = [f"recompute={p['recompute']}"]
        if p["flash_attention"]:
            settings.append("flash_attention")
        if p["sequence_parallel"]:
            settings.append("sequence_parallel")
        if p["schedule"]:
            s = p["schedule"]
            settings.append(f"schedule={s['kind']}(axis={s['axis']}, v={s['chunks']}, U={s['unit']})")
        lines.append("  settings: " + ", ".join(settings))
        if p.get("optimizers"):
            lines.append("  optimizer: " + ", ".join(f"{g} {a}" for g, a in p["optimizers"].items()))
        for o in p["overrides"]:
            lines.append(f"  override {o}")
        for n in p["notes"]:
            lines.append(f"  note: {n}")
    for q in data["questions"]:
        label = f' "{q["label"]}"' if q["label"] else ""
        lines.append(f"{q['kind']}{label}: {q['test']}  [{q['dim']}]")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def spec_markdown(spec: ir.Spec, plans: tuple[str, ...] = (), sets: Collection[str] = ()) -> str:
    """The same summary as ``spec_text``, as Markdown: a table of modes per plan (states by mesh axes)."""
    data = spec_data(spec, plans, sets)
    out = [f"# `{data['file']}`", ""]
    if data["bindings"]:
        out.append("Symbols: " + ", ".join(f"`{k} = {v['formula']}`{_set_mark(v)}"
                                           for k, v in data["bindings"].items()) + ".")
        out.append("")
    m = data["model"]
    if m:
        psi = m["params_count"] or "?"
        out.append(f"Model: Ψ = {psi} parameters" + (f" ({m['active_params']} active per token)"
                                                       if m["active_params"] and m["active_params"] != psi else "")
                   + "; bytes per element: " + ", ".join(f"{k} {v}" for k, v in m["bytes"].items()) + ".")
        if m["groups"]:
            out.append("")
            out.append("Parameter groups: " + ", ".join(f"{k} {v if v is not None else '?'}"
                                                        for k, v in m["groups"].items()) + ".")
        out.append("")
    for p in data["plans"]:
        axes = [a["axis"] for a in p["mesh"]]
        out += [f"## Plan `{p['plan']}`", "", f"Defined at `{p['location']}`.", ""]
        out.append("| | " + " | ".join(f"`{a}`" for a in axes) + " | |")
        out.append("|---|" + "---|" * len(axes) + "---|")
        out.append("| size | " + " | ".join(_md(a["size"]) for a in p["mesh"]) + " | |")
        out.append("| role | " + " | ".join(a["role"] for a in p["mesh"]) + " | |")
        out.append("| link | " + " | ".join(a["link"] or "–" for a in p["mesh"]) + " | |")
        for pl in p["placements"]:
            extra = [f"residency={pl['residency']}"] if pl["residency"] != "device" else []
            if "S*" in pl["modes"].values():
                extra += [f"unit={pl['unit']}", f"prefetch={pl['prefetch']}",
                          f"reshard_after_forward={str(pl['reshard_after_forward']).lower()}"]
            out.append(f"| {pl['state']} | " + " | ".join(pl["modes"][a] for a in axes) + f" | {' '.join(extra)} |")
        out.append("")
        joined = [("×" if b.get("product") else "/").join(b["axes"]) for b in p["bindings"]]
        out.append("Bindings: " + "; ".join(f"`{a}` ← `{b['strategy']}`" for a, b in zip(joined, p["bindings"])) + ".")
        settings = [f"recompute={p['recompute']}"] + (["flash_attention"] if p["flash_attention"] else []) \
            + (["sequence_parallel"] if p["sequence_parallel"] else [])
        if p["schedule"]:
            sch = p["schedule"]
            settings.append(f"schedule={sch['kind']}(axis={sch['axis']}, v={sch['chunks']}, U={sch['unit']})")
        out.append("Settings: " + ", ".join(f"`{x}`" for x in settings) + ".")
        if p.get("optimizers"):
            out.append("- optimizer: " + ", ".join(f"{g} `{a}`" for g, a in p["optimizers"].items()))
        for o in p["overrides"]:
            out.append(f"- override `{o}`")
        for n in p["notes"]:
            out.append(f"> note: {n}")
        out.append("")
    if data["questions"]:
        out += ["## Questions", ""]
        for q in data["questions"]:
            label = f" “{q['label']}”" if q["label"] else ""
            out.append(f"- {q['kind']}{label}: `{q['test']}` [{q['dim']}]")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"

