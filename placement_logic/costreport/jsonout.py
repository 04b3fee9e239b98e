"""JSON rendering of a cost report (docs/json.md and docs/schema/cost.schema.json, ``schema_version`` 2).

Input: a ``CostReport``. Output: a JSON-ready dict (``to_json``) and its text (``render``).
Every quantity is ``{bytes, exact, formula, latex}``: ``bytes`` a JSON number when every
symbol is bound (else null), ``exact`` the exact rational as a string (else null).
"""

from __future__ import annotations

import json
from fractions import Fraction

from ..outcome import envelope
from .model import CostReport, PlanReport, Quantity


def _num(x: Fraction | None):
    """An integer as itself, a fraction as the nearest double; None when unbound, or when a
    fraction is beyond a double's range (``exact`` always carries the value)."""
    if x is None:
        return None
    if x.denominator == 1:
        return x.numerator
    try:
        return x.numerator / x.denominator
    except OverflowError:
        return None


def _exact(x: Fraction | None) -> str | None:
    return None if x is None else str(x)


def quantity(q: Quantity, key: str = "bytes") -> dict:
    return {key: _num(q.exact), "exact": _exact(q.exact), "formula": q.formula, "latex": q.latex,
            "unbound": list(q.unbound)}


def _plan(p: PlanReport) -> dict:
    return {
        "plan": p.name,
        "strategies": list(p.strategies),
        "memory": {
            "device": {k: quantity(v) for k, v in p.device.items()},
            "host": {k: quantity(v) for k, v in p.host.items()},
            "transient_terms": {k: quantity(v) for k, v in p.transient_terms.items()},
            "model_state": quantity(p.model_state),
            **_stages(p),
            "param_groups": [
                {"name": g.name, "parameters": quantity(g.count, "count"), "tensor": g.tensor, "stage": g.stage,
                 "expert": g.expert, "user": g.user,
                 "per_device": {k: quantity(v) for k, v in g.per_device.items()}}
                for g in p.param_groups
            ],
        },
        "communication": {
            "total": {
                "bytes_per_device": _num(p.comm_total.exact), "volume": _num(p.volume_total.exact),
                "exact": _exact(p.comm_total.exact), "volume_exact": _exact(p.volume_total.exact),
                "formula": p.comm_total.formula, "volume_formula": p.volume_total.formula,
                "latex": p.comm_total.latex,
            },
            "per_axis": {a: {"link": g.link, "bytes_per_device": _num(g.bytes_per_device.exact),
                             "volume": _num(g.volume.exact), "formula": g.bytes_per_device.formula}
                         for a, g in p.per_axis.items()},
            "per_link": {k: {"bytes_per_device": _num(g.bytes_per_device.exact), "volume": _num(g.volume.exact),
                             "formula": g.bytes_per_device.formula} for k, g in p.per_link.items()},
            "collectives": [
                {"kind": c.kind, "state": c.state, "axis": c.axis, "axes": list(c.axes), "link": c.link,
                 "phase": c.phase, "count": _num(c.count.exact), "count_formula": c.count.formula,
                 "bytes_per_device": _num(c.bytes_per_device.exact), "volume": _num(c.volume.exact),
                 "formula": c.bytes_per_device.formula, "payload": c.payload, "rule": c.rule}
                for c in p.collectives
            ],
        },
        "notes": list(p.notes),
        **_fit_time(p),
    }


def _fit_time(p: PlanReport) -> dict:
    """``fit`` and ``time``, only with a device (keys added in schema 1)."""
    out: dict = {}
    if p.fit is not None:
        f = p.fit
        out["fit"] = {"device": f.device, "fits": f.fits, "capacity": quantity(f.capacity),
                      "peak": quantity(f.peak), "headroom": quantity(f.headroom)}
    if p.time is not None:
        t = p.time
        out["time"] = {**{k: quantity(getattr(t, k), "value") for k in (
            "step", "compute", "bubble", "overlapped", "exposed", "tokens", "tokens_per_second", "model_flops", "mfu")},
            "optimizer": quantity(t.optimizer, "value") if t.optimizer is not None else None,
            "per_link_seconds": {k: quantity(v, "value") for k, v in t.per_link.items()},
            "assumptions": list(t.assumptions)}
    return out


def _stages(p: PlanReport) -> dict:
    """``stages`` and ``peak_stage``, only for plans with a pipeline (keys added in schema 1)."""
    if not p.stages:
        return {}
    return {
        "stages": [{"stage": st.stage, "device": {k: quantity(v) for k, v in st.device.items()},
                    "in_flight": {k: quantity(v, "value") for k, v in st.in_flight.items()}}
                   for st in p.stages],
        "peak_stage": p.peak_stage,
    }


def _ratios(rows: dict) -> dict:
    return {k: (None if v is None else {"value": _num(v.exact), "exact": _exact(v.exact), "formula": v.formula})
            for k, v in rows.items()}


def to_json(r: CostReport) -> dict:
    plans = [_plan(p) for p in r.plans]
    if r.command == "compare":
        for p, data in zip(r.plans, plans):
            data["ratios"] = _ratios(r.ratios.get(p.name, {}))
    out = {
        **envelope(r.command, r.exit_status),
        "file": r.file,
        "bindings": {b.name: {"value": _num(b.exact), "exact": _exact(b.exact), "formula": b.formula,
                              "set": b.overridden}
                     for b in r.bindings},
        "mesh": [{"axis": a, "link": link} for a, link in r.axes],
        "model": {"params": quantity(r.params, "count") if r.params else None,
                  "active_params": quantity(r.active_params, "count") if r.active_params else None},
        "plans": plans,
        "questions": [
            {"kind": q.kind, "label": q.label, "op": q.op, "verdict": q.verdict, "identity": q.identity,
             "where": q.where, "expected": q.expected, "met": q.met,
             "left": quantity(q.left, "value"), "right": quantity(q.right, "value")}
            for q in r.questions
        ],
        "summary": {
            "plans": len(r.plans),
            "asserts_failed": r.failed_asserts,
            "asserts_unknown": r.unknown_asserts,
            "unfit": list(r.unfit),
            "expectations_unmet": r.unmet_expectations,
        },
    }
    if r.command == "compare":
        out["baseline"] = r.baseline
    return out


def render(r: CostReport) -> str:
    return json.dumps(to_json(r), indent=2, ensure_ascii=False) + "\n"
