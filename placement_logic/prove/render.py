"""Renderers of a ``ProveReport``: text, markdown and JSON (plain data in, text out).

Input: a ``ProveReport``. Output: a string (text, markdown) or a JSON-ready dict. No
solver, no parser: only the report data.
"""

from __future__ import annotations

from ..outcome import SCHEMA_VERSION, envelope  # noqa: F401 - SCHEMA_VERSION re-exported for readers
from .report import ClaimHolds, ClaimResult, ProveReport, ProveStatus, Result

SMT2_DIR = "proofs/smt2"


def _solvers(r: Result) -> str:
    return ", ".join(f"{s.solver} {s.verdict.word}" for s in r.solvers)


def _summary(rep: ProveReport) -> str:
    c = rep.counts()
    n = len(rep.results)
    return (f"{n} obligations: {c[ProveStatus.PROVED]} proved, {c[ProveStatus.WITNESS_FOUND]} witnesses found, "
            f"{c[ProveStatus.REFUTED]} refuted, {c[ProveStatus.UNKNOWN]} unknown, {c[ProveStatus.ERROR]} errors")


def _claim_line(c: ClaimResult) -> str:
    if c.holds == ClaimHolds.CONDITIONAL:
        return f"holds exactly when {c.condition}"
    if c.holds == ClaimHolds.ALWAYS:
        return "holds for all values" + (f" — {c.condition}" if c.condition else "")
    if c.holds == ClaimHolds.NEVER:
        return "holds for no values"
    return c.condition


def text(rep: ProveReport) -> str:
    solvers = sorted({s.solver for r in rep.results for s in r.solvers})
    out = [f"placement prove: {len(rep.results)} obligations, solvers {' + '.join(solvers) or 'none'}, "
           f"timeout {rep.timeout:g} s per query", ""]
    if rep.claims:
        out.append("Claims (the exact condition under which each holds)")
        for c in rep.claims:
            out.append(f"  {c.file}: \"{c.label}\"  ({c.text})")
            out.append(f"      {_claim_line(c)}; {c.at_values}")
        out.append("")
    theorem = None
    for r in rep.results:
        if r.theorem != theorem:
            theorem = r.theorem
            out.append(theorem)
        out.append(f"  {r.status:<14} {r.name}  [{_solvers(r)}; {r.seconds:.2f} s]")
        if r.error:
            out.append(f"      error: {r.error}")
        if r.status in (ProveStatus.WITNESS_FOUND, ProveStatus.REFUTED):
            for label, value in r.detail:
                out.append(f"      {label}: {value}")
            for label, value in r.witness:
                out.append(f"      {label}: {value}")
    out += ["", _summary(rep), rep.verdict_word]
    return "\n".join(out) + "\n"


def markdown(rep: ProveReport) -> str:
    out = ["| theorem | obligation | verdict | z3 | cvc5 | time (s) |", "|---|---|---|---|---|---|"]
    for r in rep.results:
        verdicts = {s.solver: s.verdict.word for s in r.solvers}
        out.append(f"| {r.theorem} | {r.name} | {r.status} | {verdicts.get('z3', '–')} | "
                   f"{verdicts.get('cvc5', '–')} | {r.seconds:.2f} |")
    witnesses = [r for r in rep.results if r.witness]
    for r in witnesses:
        out += ["", f"**{r.name}** ({r.status})", ""]
        out += [f"- {label}: {value}" for label, value in r.detail + r.witness]
    if rep.claims:
        out += ["", "| spec | claim | holds | at the spec's values |", "|---|---|---|---|"]
        for c in rep.claims:
            out.append(f"| {c.file} | {c.label}: `{c.text}` | {_claim_line(c)} | {c.at_values} |")
    out += ["", _summary(rep) + f" — **{rep.verdict_word}**"]
    return "\n".join(out) + "\n"


def to_json(rep: ProveReport) -> dict:
    return {
        **envelope("prove", rep.exit_status),
        "timeout": rep.timeout,
        "verdict": rep.verdict_word,
        "counts": rep.counts(),
        "obligations": [
            {
                "key": r.key,
                "theorem": r.theorem,
                "name": r.name,
                "statement": r.statement,
                "kind": r.kind,
                "expect": r.expect.word,
                "verdict": r.verdict.word,
                "status": r.status,
                "ok": r.ok,
                "solvers": [{"solver": s.solver, "verdict": s.verdict.word, "seconds": round(s.seconds, 4),
                             "reason": s.reason} for s in r.solvers],
                "witness": [{"label": a, "value": b} for a, b in r.witness],
                "detail": [{"label": a, "value": b} for a, b in r.detail],
                "source": r.source,
                "error": r.error,
                "smt2": f"{SMT2_DIR}/{r.key}.smt2",
            }
            for r in rep.results
        ],
        "claims": [
            {"file": c.file, "label": c.label, "claim": c.text, "holds": c.holds, "condition": c.condition,
             "at_values": c.at_values, "obligations": list(c.keys)}
            for c in rep.claims
        ],
    }


# Jupyter shows a prove report as its Markdown rendering (attached here, so the report data
# imports no renderer; the package, which makes the reports, imports this module)
ProveReport._repr_markdown_ = markdown
