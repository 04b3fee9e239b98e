"""Markdown rendering of a cost report: GitHub-flavoured tables, formulas in code spans.

Input: a ``CostReport``. Output: Markdown text (one section per plan, with the first and the
last pipeline stage beside the device column when there is a pipeline, or one comparison
table for ``compare``, then the asserts and claims).
"""

from __future__ import annotations

from . import units
from .model import DEVICE_ROWS, CostReport, PlanReport, Quantity, compare_rows, stage_title
from .pieces import of_plan, text_lines


def _esc(text: str) -> str:
    return text.replace("|", r"\|")


def _cell(q: Quantity) -> str:
    head = units.labelled(q.exact, "<br>")
    if q.exact is not None and q.formula == q.value:
        return head
    return f"{head}<br>`{_esc(q.shown or q.formula)}`"


def _count(q: Quantity) -> str:
    head = units.number(q.exact)
    return head if q.exact is not None and q.formula == q.value else f"{head}<br>`{_esc(q.formula)}`"


def _groups(p: PlanReport) -> list[str]:
    out = ["", "| parameter group | parameters | tensor axis | stage | params | optimizer | grads |",
           "|---|---|---|---|---|---|---|"]
    for g in p.param_groups:
        where = g.stage + (", experts" if g.expert else "") + (", own" if g.user else "")
        out.append(f"| {g.name} | {_count(g.count)} | {g.tensor} | {where} | "
                   + " | ".join(_cell(g.per_device[s]) for s in ("params", "optimizer", "grads")) + " |")
    return out


def _plan(p: PlanReport, show_groups: bool = False) -> list[str]:
    out = [f"## Plan `{p.name}`", "", f"Strategies: {', '.join(f'`{s}`' for s in p.strategies)}", ""]
    if p.stages:
        out += [f"Pipeline: {stage_title(p.peak_stage)}.", ""]
    heads = ["memory term", "device (max over stages)" if p.stages else "device"]
    heads += [f"{st.stage} stage" for st in p.stages] + ["host"]
    out += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in DEVICE_ROWS:
        host = p.host.get(row)
        cells = [row, _cell(p.device[row])] + [_cell(st.device[row]) for st in p.stages]
        out.append("| " + " | ".join(cells + [_cell(host) if host is not None else ""]) + " |")
    for label, q in p.transient_terms.items():
        out.append("| " + " | ".join([f"↳ {_esc(label)}", _cell(q)] + [""] * len(p.stages) + [""]) + " |")
    if p.stages:
        cells = ["in flight (layer × microbatch)", ""]
        cells += [_count(st.in_flight["layer_microbatches"]) for st in p.stages]
        out.append("| " + " | ".join(cells + [""]) + " |")
    if show_groups:
        out += _groups(p)
    out += ["", "| collective | group | link | phase | count | bytes per device | volume |", "|---|---|---|---|---|---|---|"]
    for c in p.collectives:
        out.append(f"| {c.kind} ({c.state}) | {c.axis} | {c.link or ''} | {c.phase} | `{_esc(c.count.formula)}` "
                   f"| {_cell(c.bytes_per_device)} | {_cell(c.volume)} |")
    out.append(f"| **total (network)** | | | | | {_cell(p.comm_total)} | {_cell(p.volume_total)} |")
    out.append("")
    out += _time(p)
    out += [f"> where `{_esc(line)}`" for line in text_lines(of_plan(p))]
    out += [f"> note: {_esc(n)}" for n in p.notes]
    return out + [""] if p.notes else out


def _time(p: PlanReport) -> list[str]:
    from .text import fit_line

    out = []
    tm = p.time
    if tm is not None:
        out += ["| step time | value |", "|---|---:|",
                f"| step | {units.seconds(tm.step.exact)} |",
                f"| compute (bubble included) | {units.seconds(tm.compute.exact)} |",
                f"| pipeline bubble | {units.seconds(tm.bubble.exact)} |",
                f"| communication hidden behind compute | {units.seconds(tm.overlapped.exact)} |",
                f"| communication exposed | {units.seconds(tm.exposed.exact)} |",
                *([f"| optimizer step | {units.seconds(tm.optimizer.exact)} |"]
                  if tm.optimizer is not None and tm.optimizer.exact else []),
                f"| tokens per second | {units.scaled(tm.tokens_per_second.exact)} |",
                f"| MFU | {units.percent(tm.mfu.exact)} |", ""]
        out += [f"> assumes: {_esc(a)}" for a in tm.assumptions] + [""]
    line = fit_line(p)
    if line is not None:
        out += [f"**{_esc(line)}**", ""]
    return out


def _compare(r: CostReport) -> list[str]:
    out = [f"## Plans compared (ratio to `{r.baseline}`)", "",
           "| quantity | " + " | ".join(f"`{p.name}`" for p in r.plans) + " |",
           "|---|" + "---|" * len(r.plans)]
    for key, get in compare_rows(r):
        cells = []
        for p in r.plans:
            ratio = r.ratios.get(p.name, {}).get(key)
            text = units.of_row(key, get(p).exact, "<br>")
            if ratio is not None:
                text += f" (×{units.ratio(ratio.exact) if ratio.exact is not None else _esc(ratio.formula)})"
            cells.append(text)
        out.append(f"| {key} | " + " | ".join(cells) + " |")
    return out + [""]


def render(r: CostReport) -> str:
    out = [f"# Cost report: `{r.file}`", ""]
    if r.bindings:
        out += ["Bindings: " + ", ".join(
            f"`{b.name}` = {units.number(b.exact) if b.exact is not None else f'`{b.formula}`'}"
            + (" (set)" if b.overridden else "") for b in r.bindings), ""]
    if r.params is not None:
        from .text import _params_line

        out += [_params_line(r).replace("model: ", "Model: ", 1), ""]
    if r.command == "compare":
        out += _compare(r)
    else:
        for p in r.plans:
            out += _plan(p, r.show_groups)
    if r.questions:
        out += ["## Asserts and claims", "", "| | statement | value | verdict |", "|---|---|---|---|"]
        for q in r.questions:
            stmt = f"`{_esc(q.left.formula)} {q.op} {_esc(q.right.formula)}`"
            val = f"{units.number(q.left.exact)} {q.op} {units.number(q.right.exact)}"
            out.append(f"| {q.kind} | {_esc(q.label or '')} {stmt} | {val} | **{_esc(q.shown)}** |")
        out.append("")
    return "\n".join(out)
