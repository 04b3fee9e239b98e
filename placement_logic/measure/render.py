"""Renderers of measurement reports: ``MeasureReport``s in, text / Markdown / JSON out.

Knows nothing of torch, sympy or lark; returns strings and dicts (only the CLI prints).
"""

from __future__ import annotations

from fractions import Fraction

from ..outcome import SCHEMA_VERSION, envelope  # noqa: F401 - SCHEMA_VERSION re-exported for readers
from .report import CounterexampleView, MeasureReport, Outcome, Row, RowStatus


def _num(x: Fraction | None) -> str:
    if x is None:
        return "—"
    if x.denominator == 1:
        return f"{x.numerator:,}"
    return f"{float(x):,.4g}"


def _rel(row: Row) -> str:
    r = row.rel_diff
    if r is None:
        return "—" if row.abs_diff is None or row.abs_diff == 0 else "∞"
    return f"{float(r):+.2%}" if r else "0"


def _diff(row: Row) -> str:
    d = row.abs_diff
    if d is None:
        return "—"
    return ("+" if d > 0 else "") + _num(d) if d else "0"


def _headline(rep: MeasureReport) -> str:
    mesh = ", ".join(f"{a}={n}" for a, n in rep.mesh)
    return f"{rep.file}: plan {rep.plan} on {rep.devices} processes ({mesh}), {rep.steps} steps: {rep.outcome}"


def counterexample_lines(cex: CounterexampleView) -> list[str]:
    """The checker's counterexample in the checker's own words (``placement check``'s text form)."""
    out = ["sizes: " + ", ".join(f"{k}={v}" for k, v in cex.sizes)]
    out += [f"{label}: {value}" for label, value in cex.lines]
    out.append(f"fails: {cex.equation}")
    out += [f"because: {d}" for d in cex.diagnosis]
    out += [f"note: {n}" for n in cex.notes]
    out.append(f"re-run: {cex.command}")
    return out


def _divergence(rep: MeasureReport) -> str:
    eq = rep.equivalence
    return (f"parameters {eq.param_rel:.3g} relative to one process ({eq.param_worst}), loss {eq.loss_rel:.3g} "
            f"relative, {eq.gradient_text()}, replicas {'agree' if eq.replicas_agree else 'disagree'} "
            f"({'within' if eq.within else 'outside'} {eq.tolerance:g})")


def _checker_text(rep: MeasureReport) -> list[str]:
    c = rep.checker
    if not c.available:
        return ["  checker: not installed (placement_logic.check)"]
    out = [f"  checker at these sizes: {c.verdict}"]
    if not c.counterexamples:
        return out + [f"    {line}" for line in c.summary]
    first, rest = c.counterexamples[0], c.counterexamples[1:]
    if rep.equivalence is not None:
        out.append(f"    measured divergence: {_divergence(rep)}")
    out.append(f"    checker's counterexample ({first.obligation} refuted, re-checked by concrete replay):")
    out += [f"      {line}" for line in counterexample_lines(first)]
    out += [f"    also refuted: {x.obligation} — {x.equation}" for x in rest]
    return out


def _reason_word(rep: MeasureReport) -> str:
    return {Outcome.UNREALISED: "not realised", Outcome.MISMATCH: "not a match"}.get(rep.outcome, "error")


def text(reports: list[MeasureReport]) -> str:
    out = []
    for rep in reports:
        out.append(_headline(rep))
        if rep.implementation:
            out.append(f"  realised as: {rep.implementation}")
        for a in rep.approximations:
            out.append(f"  approximation: {a}")
        for reason in rep.reasons:
            out.append(f"  {_reason_word(rep)}: {reason}")
        if rep.rows:
            out.append(f"  predicted by {rep.prediction_source} for the scaled-down model "
                       f"({', '.join(f'{k}={v}' for k, v in rep.shape)})")
            w = max(len(r.quantity) for r in rep.rows)
            out.append(f"  {'quantity':<{w}}  {'predicted':>12}  {'measured':>12}  {'abs diff':>10}  {'rel diff':>9}  status")
            for r in rep.rows:
                out.append(f"  {r.quantity:<{w}}  {_num(r.predicted):>12}  {_num(r.measured):>12}  "
                           f"{_diff(r):>10}  {_rel(r):>9}  {r.status}")
                if r.per_rank:
                    out.append(f"  {'':<{w}}  per rank: {', '.join(f'{x:,}' for x in r.per_rank)}")
                if r.predicted_per_rank:
                    out.append(f"  {'':<{w}}  predicted per rank: {', '.join(_num(x) for x in r.predicted_per_rank)}")
                if r.note:
                    out.append(f"  {'':<{w}}  ({r.mechanism + ': ' if r.mechanism else ''}{r.note})")
        eq = rep.equivalence
        if eq is not None:
            word = "within" if eq.within else "OUTSIDE"
            out.append(f"  equivalence over {eq.steps} steps vs 1 process: largest parameter difference "
                       f"{eq.param_abs:.3g} ({eq.param_rel:.3g} relative, {eq.param_worst}), loss difference "
                       f"{eq.loss_abs:.3g} ({eq.loss_rel:.3g} relative); {eq.gradient_text()}; replicas "
                       f"{'agree' if eq.replicas_agree else 'DISAGREE'}; {word} tolerance {eq.tolerance:g}")
            out.extend(f"  note: {n}" for n in rep.notes if n.startswith(("valid tokens", "byte widths", "one-time", "allocator peak")))
        if rep.checker is not None:
            out.extend(_checker_text(rep))
        if rep.rows:
            c = rep.counts()
            out.append(f"  {c[RowStatus.MATCH]} match, {c[RowStatus.EXPLAINED]} explained, {c[RowStatus.DIFFERS]} differ")
        out.append("")
    counts = {o.value: sum(1 for r in reports if r.outcome is o) for o in Outcome}
    out.append(", ".join(f"{n} {o}" for o, n in counts.items()))
    return "\n".join(out) + "\n"


def markdown(reports: list[MeasureReport]) -> str:
    out = []
    for rep in reports:
        out.append(f"### `{rep.plan}` ({rep.file}) — {rep.outcome}\n")
        mesh = ", ".join(f"{a}={n}" for a, n in rep.mesh)
        out.append(f"{rep.devices} processes ({mesh}), {rep.steps} steps. Realised as: {rep.implementation or '—'}.\n")
        for a in rep.approximations:
            out.append(f"- approximation: {a}")
        for reason in rep.reasons:
            out.append(f"- {_reason_word(rep)}: {reason}")
        if rep.approximations or rep.reasons:
            out.append("")
        if rep.rows:
            out.append("| quantity | predicted | measured | abs diff | rel diff | status |")
            out.append("|---|---:|---:|---:|---:|---|")
            for r in rep.rows:
                status = r.status + (f" [{r.mechanism}]" if r.mechanism else "") + (f": {r.note}" if r.note else "")
                if r.per_rank:
                    status += f" (per rank: {', '.join(f'{x:,}' for x in r.per_rank)})"
                if r.predicted_per_rank:
                    status += f" (predicted per rank: {', '.join(_num(x) for x in r.predicted_per_rank)})"
                out.append(f"| {r.quantity} | {_num(r.predicted)} | {_num(r.measured)} | {_diff(r)} | {_rel(r)} | {status} |")
            out.append("")
        eq = rep.equivalence
        if eq is not None:
            out.append(f"Equivalence ({eq.steps} steps vs 1 process): parameters {eq.param_rel:.3g} relative "
                       f"({eq.param_abs:.3g} absolute), loss {eq.loss_rel:.3g} relative; {eq.gradient_text()}; replicas "
                       f"{'agree' if eq.replicas_agree else 'disagree'}; "
                       f"{'within' if eq.within else 'outside'} {eq.tolerance:g}.\n")
            out.extend(f"Note: {n}.\n" for n in rep.notes if n.startswith(("valid tokens", "byte widths", "one-time", "allocator peak")))
        if rep.checker is not None and rep.checker.available:
            out.append(f"Checker at these sizes: **{rep.checker.verdict}**\n")
            cexs = rep.checker.counterexamples
            if cexs:
                if eq is not None:
                    out.append(f"Measured divergence: {_divergence(rep)}.\n")
                out.append(f"Checker's counterexample ({cexs[0].obligation} refuted, re-checked by concrete replay):\n")
                out.extend(f"    {line}" for line in counterexample_lines(cexs[0]))
                out.append("")
                out.extend(f"- also refuted: {x.obligation} — {x.equation}" for x in cexs[1:])
                if cexs[1:]:
                    out.append("")
            else:
                out.extend(f"    {line}" for line in rep.checker.summary)
                if rep.checker.summary:
                    out.append("")
    return "\n".join(out) + "\n"


def _frac(x: Fraction | None):
    if x is None:
        return None
    return x.numerator if x.denominator == 1 else str(x)


def to_json(reports: list[MeasureReport]) -> dict:
    plans = []
    for rep in reports:
        eq = rep.equivalence
        plans.append({
            "file": rep.file,
            "plan": rep.plan,
            "outcome": rep.outcome.value,
            "mesh": dict(rep.mesh),
            "devices": rep.devices,
            "steps": rep.steps,
            "implementation": rep.implementation,
            "approximations": list(rep.approximations),
            "notes": list(rep.notes),
            "reasons": list(rep.reasons),
            "prediction_source": rep.prediction_source,
            "shape": dict(rep.shape),
            "rows": [{
                "group": r.group,
                "quantity": r.quantity,
                "predicted": _frac(r.predicted),
                "measured": _frac(r.measured),
                "abs_diff": _frac(r.abs_diff),
                "rel_diff": _frac(r.rel_diff),
                "status": r.status,
                "note": r.note,
                "per_rank": list(r.per_rank),
                "mechanism": r.mechanism,
                "predicted_per_rank": [_frac(x) for x in r.predicted_per_rank],
            } for r in rep.rows],
            "equivalence": None if eq is None else {
                "steps": eq.steps, "param_abs": eq.param_abs, "param_rel": eq.param_rel, "param_worst": eq.param_worst,
                "loss_abs": eq.loss_abs, "loss_rel": eq.loss_rel, "replicas_agree": eq.replicas_agree,
                "tolerance": eq.tolerance, "within": eq.within,
                "grad_abs": eq.grad_abs, "grad_rel": eq.grad_rel, "grad_worst": eq.grad_worst or None,
                "grad_unavailable": eq.grad_unavailable or None, "grad_tolerance": eq.grad_tolerance,
            },
            "checker": None if rep.checker is None else {
                "available": rep.checker.available, "verdict": rep.checker.verdict or None,
                "summary": list(rep.checker.summary),
                "counterexamples": [{
                    "obligation": x.obligation, "sizes": dict(x.sizes), "values": dict(x.lines),
                    "equation": x.equation, "diagnosis": list(x.diagnosis), "notes": list(x.notes),
                    "command": x.command,
                } for x in rep.checker.counterexamples],
            },
        })
    return envelope("measure", plans=plans)
