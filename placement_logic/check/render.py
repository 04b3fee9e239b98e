"""Renderers of a check report: ``CheckReport`` in, text / Markdown / JSON out (LaTeX: ``check.render_latex``).

Input: the plain report data of ``check.report``. Output: strings (the CLI prints them).
Text follows Ivy/TLC: one verdict line per obligation with its location, the trace of a
refutation, a count summary and one final word. Unknown is never shown as a pass.
"""

from __future__ import annotations

import json

from ..diagnostics import NO_SPAN, Span
from ..outcome import Verdict, envelope
from .report import CheckReport, ObligationResult
from .rules import CONDITIONS, RULES


def _loc(span: Span, file: str) -> str:
    if span == NO_SPAN:
        return file
    return f"{span.file}:{span.line}:{span.column}"


def _summary(report: CheckReport) -> str:
    c = report.counts()
    return f"{c[Verdict.PROVED]} proved, {c[Verdict.REFUTED]} refuted, {c[Verdict.UNKNOWN]} unknown"


def _condition_text(o: ObligationResult) -> str:
    if o.condition in RULES:
        return f"rule {o.condition}"
    return o.condition.replace("_", " ")


def text(report: CheckReport) -> str:
    lines = [f"checking {report.file} (time limit {report.timeout:g} s per query)"]
    if report.pinned:
        lines.append("pinned: " + ", ".join(f"{k}={v}" for k, v in report.pinned))
    for p in report.plans:
        lines.append("")
        lines.append(f"plan {p.plan}")
        lines.append("  assumed: " + "; ".join(p.assumed))
        for o in p.obligations:
            lines.append(f"  {_loc(o.location, report.file)}: {o.verdict.word} {o.name} [{_condition_text(o)}] "
                         f"({o.scope})")
            if o.verdict is Verdict.PROVED:
                lines.extend(f"      note: {n}" for n in o.notes if not n.startswith("vacuous"))
                continue
            lines.append(f"      checked: {o.checked}")
            if o.verdict is Verdict.UNKNOWN:
                lines.append(f"      unknown: {o.reason} (not a pass)")
                continue
            cex = o.counterexample
            found = p.finding_of(o.name)
            if found is not None and found[1].root != o.name:
                lines.append(f"      part of finding {found[0]} (root cause: {found[1].root}); counterexample: "
                             f"{cex.equation}")
                continue
            lines.append("      counterexample (re-checked by concrete replay):")
            lines.append("        sizes: " + ", ".join(f"{k}={v}" for k, v in cex.sizes))
            lines.extend(f"        {label}: {value}" for label, value in cex.devices)
            lines.extend(f"        {label}: {value}" for label, value in cex.values)
            lines.append(f"        fails: {cex.equation}")
            lines.extend(f"        because: {d}" for d in cex.diagnosis)
            lines.extend(f"        note: {n}" for n in cex.notes)
            if o.why:
                lines.append(f"        why it matters: {o.why}")
            if o.fix:
                lines.append(f"        suggested fix: {o.fix}")
            lines.append(f"        re-run: {cex.command}")
        if p.findings:
            n = len(p.findings)
            lines.append(f"  findings: {n} defect{'s' if n != 1 else ''}")
            for i, f in enumerate(p.findings, 1):
                lines.append(f"    {i}. {_loc(f.location, report.file)}: {f.cause}")
                lines.append(f"       root cause: {f.root}; breaks: {', '.join(f.breaks)}")
    lines.append("")
    lines.append(_summary(report))
    lines.append(report.verdict.word.upper())
    return "\n".join(lines) + "\n"


def markdown(report: CheckReport) -> str:
    lines = [f"# Safety check of `{report.file}`", ""]
    if report.pinned:
        lines += ["Pinned: " + ", ".join(f"`{k}={v}`" for k, v in report.pinned), ""]
    for p in report.plans:
        lines += [f"## Plan `{p.plan}`: {p.verdict.word}", "", "Assumed: " + "; ".join(p.assumed) + ".", "",
                  "| verdict | obligation | condition | scope | location |", "|---|---|---|---|---|"]
        for o in p.obligations:
            lines.append(f"| **{o.verdict.word}** | {o.name} | {_condition_text(o)} | {o.scope} | "
                         f"`{_loc(o.location, report.file)}` |")
        lines.append("")
        if p.findings:
            lines += [f"Findings ({len(p.findings)} defect{'s' if len(p.findings) != 1 else ''}):", ""]
            for i, f in enumerate(p.findings, 1):
                lines.append(f"{i}. `{_loc(f.location, report.file)}`: {f.cause} (root cause: {f.root}; "
                             f"breaks: {', '.join(f.breaks)})")
            lines.append("")
        for o in p.obligations:
            if o.verdict is Verdict.PROVED:
                continue
            lines += [f"### {o.verdict.word}: {o.name}", "", f"Checked: {o.checked}", ""]
            if o.verdict is Verdict.UNKNOWN:
                lines += [f"Unknown (not a pass): {o.reason}", ""]
                continue
            cex = o.counterexample
            lines.append("Counterexample, re-checked by concrete replay:")
            lines.append("")
            lines.append("- sizes: " + ", ".join(f"`{k}={v}`" for k, v in cex.sizes))
            lines.extend(f"- {label}: {value}" for label, value in cex.devices + cex.values)
            lines.append(f"- fails: {cex.equation}")
            lines.extend(f"- because: {d}" for d in cex.diagnosis)
            lines.extend(f"- note: {n}" for n in cex.notes)
            if o.why:
                lines.append(f"- why it matters: {o.why}")
            if o.fix:
                lines.append(f"- suggested fix: {o.fix}")
            lines += ["", "```console", f"$ {cex.command}", "```", ""]
    lines += [f"**{_summary(report)}: {report.verdict.word}**", ""]
    return "\n".join(lines)


def _span_json(span: Span, file: str) -> dict:
    if span == NO_SPAN:
        return {"file": file, "line": None, "column": None, "end_line": None, "end_column": None}
    return {"file": span.file, "line": span.line, "column": span.column, "end_line": span.end_line,
            "end_column": span.end_column}


def to_json(report: CheckReport) -> dict:
    c = report.counts()
    return envelope(
        "check", report.exit_status,
        file=report.file,
        timeout=report.timeout,
        pinned=dict(report.pinned),
        plans=[
            {
                "plan": p.plan,
                "verdict": p.verdict.word,
                "assumed": list(p.assumed),
                "obligations": [
                    {
                        "name": o.name,
                        "condition": o.condition,
                        "description": RULES[o.condition].description if o.condition in RULES
                        else CONDITIONS.get(o.condition, ""),
                        "verdict": o.verdict.word,
                        "scope": o.scope,
                        "location": _span_json(o.location, report.file),
                        "checked": o.checked,
                        "reason": o.reason or None,
                        "notes": list(o.notes),
                        "why": o.why or None,
                        "fix": o.fix or None,
                        "counterexample": o.counterexample.to_json() if o.counterexample else None,
                    }
                    for o in p.obligations
                ],
                "findings": [
                    {"root": f.root, "cause": f.cause, "location": _span_json(f.location, report.file),
                     "breaks": list(f.breaks)}
                    for f in p.findings
                ],
            }
            for p in report.plans
        ],
        summary={v.word: c[v] for v in (Verdict.PROVED, Verdict.REFUTED, Verdict.UNKNOWN)},
        verdict=report.verdict.word,
    )


def render(report: CheckReport, fmt: str, width: int | None = None) -> str:
    """The report; text lines wider than ``width`` (a terminal's, or asked for) are wrapped at
    spaces with their indentation kept; ``None`` leaves them whole (piped output)."""
    if fmt == "json":
        return json.dumps(to_json(report), indent=2) + "\n"
    if fmt == "markdown":
        return markdown(report)
    out = text(report)
    return out if width is None else wrap(out, width)


def wrap(out: str, width: int) -> str:
    import textwrap

    lines = []
    for line in out.splitlines():
        if len(line) <= width:
            lines.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        lines += textwrap.wrap(line, width=width, subsequent_indent=indent + "    ", break_long_words=False,
                               break_on_hyphens=False) or [line]
    return "\n".join(lines) + "\n"


# Jupyter shows a check report as its Markdown rendering (attached here, so the report data
# imports no renderer; check.run, which makes the reports, imports this module)
CheckReport._repr_markdown_ = markdown
