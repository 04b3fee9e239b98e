"""Terminal rendering of a cost report (tables drawn as rich draws them), returned as a string.

Input: a ``CostReport``. Output: text with, per plan, a memory table (device and host,
each number in GB and GiB with its formula underneath; with a pipeline also the first and
the last stage and the stage that decides the peak), a communication table per
collective with totals per axis, then the asserts and claims and a summary line. With
``compare`` a side-by-side table of every plan with its ratio to the baseline.
"""

from __future__ import annotations

from ..outcome import QuestionVerdict
from . import units
from .model import DEVICE_ROWS, CostReport, PlanReport, Quantity, compare_rows, stage_title
from .pieces import of_plan, text_lines
from .tables import Table
from .tables import render as render_items


def _cell(q: Quantity, bytes_: bool = True) -> str:
    head = units.labelled(q.exact) if bytes_ else units.number(q.exact)
    if q.exact is not None and q.formula == q.value:
        return head
    return f"{head}\n[dim]= {q.shown or q.formula}[/dim]"


def _memory_table(p: PlanReport) -> Table:
    title = f"plan {p.name}: memory per device"
    if p.stages:
        title += f" ({stage_title(p.peak_stage)})"
    t = Table(title)
    t.add_column("term")
    t.add_column("device (max over stages)" if p.stages else "device")
    for st in p.stages:
        t.add_column(f"{st.stage} stage")
    t.add_column("host")
    for row in DEVICE_ROWS:
        host = p.host.get(row)
        t.add_row(row, _cell(p.device[row]), *(_cell(st.device[row]) for st in p.stages),
                  _cell(host) if host is not None else "")
    for label, q in p.transient_terms.items():
        t.add_row(f"  └ {label}", _cell(q), *("" for _ in p.stages), "")
    if p.stages:
        t.add_row("in flight (layer × microbatch)", "",
                  *(_cell(st.in_flight["layer_microbatches"], False) for st in p.stages), "")
    return t


def _groups_table(p: PlanReport) -> Table:
    t = Table(f"plan {p.name}: parameter groups (persistent bytes per device"
              + (", on a stage holding the group" if p.stages else "") + ")")
    for col in ("group", "parameters", "tensor axis", "stage", "params", "optimizer", "grads"):
        t.add_column(col)
    for g in p.param_groups:
        where = g.stage + (", experts" if g.expert else "") + (", own" if g.user else "")
        t.add_row(g.name, _cell(g.count, False), g.tensor, where,
                  *(_cell(g.per_device[s]) for s in ("params", "optimizer", "grads")))
    return t


def _comm_table(p: PlanReport) -> Table:
    t = Table(f"plan {p.name}: communication per step (ring bytes sent per device; ZeRO volume)")
    for col in ("collective", "group", "link", "phase", "count", "bytes/device", "volume"):
        t.add_column(col)
    for c in p.collectives:
        t.add_row(f"{c.kind} ({c.state})", c.axis, c.link or "", c.phase, _cell(c.count, False),
                  _cell(c.bytes_per_device), _cell(c.volume))
    for axis, g in p.per_axis.items():
        if g.bytes_per_device.formula != "0":
            t.add_row(f"[bold]total on {axis}[/bold]", axis, g.link or "", "", "", _cell(g.bytes_per_device),
                      _cell(g.volume))
    t.add_row("[bold]total (network)[/bold]", "", "", "", "", _cell(p.comm_total), _cell(p.volume_total))
    return t


def fit_line(p: PlanReport) -> str | None:
    f = p.fit
    if f is None:
        return None
    if f.fits is None:
        return f"fit: undecided on {f.device} ({units.both(f.capacity.exact)}): symbols unbound"
    word = "fits" if f.fits else "DOES NOT FIT"
    head = f.headroom.exact
    room = f"headroom {units.both(head)}" if f.fits else f"over by {units.both(-head)}"
    return (f"fit: {word} on {f.device}: peak {units.both(f.peak.exact)} of {units.both(f.capacity.exact)}, "
            f"{room}")


def _time_table(p: PlanReport) -> Table:
    tm = p.time

    def show(q: Quantity, fmt) -> str:
        return fmt(q.exact) if q.exact is not None else f"[dim]= {q.formula}[/dim]"

    t = Table(f"plan {p.name}: step time (model: docs/time.md)", show_lines=False)
    t.add_column("quantity")
    t.add_column("value")
    rows = [("step", show(tm.step, units.seconds)), ("compute (bubble included)", show(tm.compute, units.seconds)),
            ("  └ pipeline bubble", show(tm.bubble, units.seconds)),
            ("communication hidden behind compute", show(tm.overlapped, units.seconds)),
            ("communication exposed", show(tm.exposed, units.seconds))]
    rows += [(f"  └ on {k}", show(v, units.seconds)) for k, v in tm.per_link.items()]
    if tm.optimizer is not None and tm.optimizer.exact != 0:
        rows.append(("optimizer step", show(tm.optimizer, units.seconds)))
    rows += [("tokens per step", show(tm.tokens, units.number)),
             ("tokens per second", show(tm.tokens_per_second, units.scaled)),
             ("model FLOPs per step", show(tm.model_flops, lambda x: units.scaled(x, "FLOP"))),
             ("MFU (model FLOPs / peak)", show(tm.mfu, units.percent))]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _compare_table(r: CostReport) -> Table:
    t = Table(f"plans compared (ratio to {r.baseline})")
    t.add_column("quantity")
    for p in r.plans:
        t.add_column(p.name)
    for key, get in compare_rows(r):
        cells = []
        for p in r.plans:
            ratio = r.ratios.get(p.name, {}).get(key)
            text = units.of_row(key, get(p).exact)
            if ratio is not None:
                text += f"\n×{units.ratio(ratio.exact) if ratio.exact is not None else ratio.formula}"
            cells.append(text)
        t.add_row(key, *cells)
    return t


def _params_line(r: CostReport) -> str:
    psi, active = r.params, r.active_params
    text = f"model: Ψ = {units.number(psi.exact) if psi.exact is not None else psi.formula} parameters"
    if active is not None and active.formula != psi.formula:
        text += f" ({units.number(active.exact) if active.exact is not None else active.formula} active per token)"
    return text


VERDICT_STYLE = {QuestionVerdict.HOLDS: "green", QuestionVerdict.FAILS: "bold red", QuestionVerdict.UNKNOWN: "yellow"}


def render(r: CostReport, width: int = 120, color: bool = False) -> str:
    """The report as text ``width`` columns wide; with ``color``, ANSI colour for a terminal."""
    out: list[str | Table] = [f"{r.file}"]
    bound = ", ".join(f"{b.name} = {units.number(b.exact) if b.exact is not None else b.formula}"
                      + (" (--set)" if b.overridden else "") for b in r.bindings)
    if bound:
        out.append(f"bindings: {bound}")
    if r.params is not None:
        out.append(_params_line(r))
    if r.command == "compare":
        out.append(_compare_table(r))
    else:
        for p in r.plans:
            out.append(_memory_table(p))
            if r.show_groups:
                out.append(_groups_table(p))
            out.append(_comm_table(p))
            if p.time is not None:
                out.append(_time_table(p))
                for a in p.time.assumptions:
                    out.append(f"assumes: {a}")
            line = fit_line(p)
            if line is not None:
                out.append(line if not color else
                           f"[{'green' if p.fit.fits else 'bold red'}]{line}[/]" if p.fit.fits is not None else line)
            for n in p.notes:
                out.append(f"note: {n}")
            out += [f"where {line}" for line in text_lines(of_plan(p))]
    _questions(out, r, color)
    return render_items(out, width, color)


def _questions(out: list[str | Table], r: CostReport, color: bool) -> None:
    counts = dict.fromkeys(QuestionVerdict, 0)
    for q in r.questions:
        counts[q.verdict] += 1
        label = f' "{q.label}"' if q.label else ""
        sym = {True: " (holds for every value)", False: " (fails for every value)"}.get(q.identity, "")
        verdict = f"[{VERDICT_STYLE[q.verdict]}]{q.shown}[/]" if color else q.shown
        out.append(f"{q.where}: {q.kind}{label}: {verdict}: "
                   f"{q.left.formula} = {units.number(q.left.exact)} {q.op} {units.number(q.right.exact)}{sym}")
    if r.questions:
        failed = r.failed_asserts or r.unmet_expectations
        word = "FAILED" if failed else "ok" if not r.unknown_asserts else "UNKNOWN"
        if color:
            word = f"[{ {'FAILED': 'bold red', 'ok': 'green', 'UNKNOWN': 'yellow'}[word] }]{word}[/]"
        expected = sum(1 for q in r.questions if q.met)
        fails = f"{counts[QuestionVerdict.FAILS]} fail" + (f" ({expected} as expected)" if expected else "")
        unmet = f", {r.unmet_expectations} not as expected" if r.unmet_expectations else ""
        out.append(f"{counts[QuestionVerdict.HOLDS]} hold, {fails}, {counts[QuestionVerdict.UNKNOWN]} unknown{unmet}; " + word)
