"""Rendering of a sweep (``SweepReport``): text, Markdown, JSON and CSV, one row per
configuration and plan.

Input: a ``SweepReport``. Output: a string. Text and Markdown show the swept values, the
device memory (total in GB and GiB, each state and the transient terms in GiB, the total
of each pipeline stage), the ring bytes sent per device per step (total and per link, in
GB) and the asserts that fail; with ``compare`` the ratio of the total to the baseline's.
JSON and CSV give the bytes themselves: exact integers (or ``n/d`` strings) from an exact
evaluation, float64 rounded to the byte from a compiled one (``evaluation`` says which).
"""

from __future__ import annotations

import csv
import io
import json
from fractions import Fraction

from ..outcome import envelope
from . import units
from .sweep import SweepReport, SweepRow

STATES = ("params", "optimizer", "grads", "activations", "transient")


def quantity_keys(r: SweepReport) -> list[str]:
    """Every quantity of the report, in a stable order."""
    keys = ["memory.total", *(f"memory.{s}" for s in STATES), "memory.host", "memory.model_state"]
    if r.staged:
        for st in ("first", "last"):
            keys += [f"stage.{st}.total", *(f"stage.{st}.{s}" for s in STATES)]
    keys += ["comm.total", "volume.total", *(f"comm.link.{k}" for k in r.links)]
    return keys + [k for k in r.quantities if k.startswith("comm.group.")]


def _bytes(v) -> Fraction:
    """A row's number as an exact Fraction: exact values as they are, compiled floats to the byte."""
    if isinstance(v, float):
        return Fraction(round(v))
    return Fraction(v)


def _ratio(r: SweepReport, row: SweepRow) -> str:
    base = next((b for b in r.rows if b.values == row.values and b.plan == r.baseline), None)
    if base is None or _bytes(base.get("memory.total")) == 0:
        return "—"
    x = _bytes(row.get("memory.total")) / _bytes(base.get("memory.total"))
    return units.decimal_string(x, 3)


def _failed(r: SweepReport, row: SweepRow) -> str:
    """``ok``, or ``fails`` with the numbers of the failing asserts (the footer lists them)."""
    bad = [str(k + 1) for k, (q, v) in enumerate(zip(r.questions, row.verdicts))
           if v == "fails" and q.kind == "assert"]
    if bad:
        return "fails " + ",".join(bad)
    return "ok"


def _gib(v) -> str:
    return units.decimal_string(_bytes(v) / 2**30, 2)


def _gb(v) -> str:
    return units.decimal_string(_bytes(v) / 10**9, 2)


def table(r: SweepReport) -> tuple[list[str], list[list[str]]]:
    """The human table: headers (with their units) and rows of cells (numbers in those units)."""
    head = list(r.swept)
    many = len(r.plans) > 1
    if many:
        head.append("plan")
    head += ["memory GiB", *(f"{s} GiB" for s in STATES)]
    if r.staged:
        head += ["first stage GiB", "last stage GiB"]
    head += ["comm GB", *(f"{k} GB" for k in r.links)]
    if r.command == "compare":
        head.append(f"× {r.baseline}")
    asserts = any(q.kind == "assert" for q in r.questions)
    if asserts:
        head.append("asserts")
    rows = []
    for row in r.rows:
        cells = [units.number(v) for v in row.values]
        if many:
            cells.append(row.plan)
        cells.append(_gib(row.get("memory.total")))
        cells += [_gib(row.get(f"memory.{s}")) for s in STATES]
        if r.staged:
            cells += [_gib(row.get(f"stage.{st}.total")) if row.plan in r.staged else "—"
                      for st in ("first", "last")]
        cells.append(_gb(row.get("comm.total")))
        cells += [_gb(row.get(f"comm.link.{k}")) for k in r.links]
        if r.command == "compare":
            cells.append(_ratio(r, row))
        if asserts:
            cells.append(_failed(r, row))
        rows.append(cells)
    return head, rows


_SHORT = {"memory": "total", "optimizer": "optim.", "activations": "activ.", "transient": "trans.",
          "first stage": "first", "last stage": "last", "comm": "comm"}
UNITS = ("memory per device in GiB (2^30 B): the peak, each state (its largest over the stages), each stage's total",
         "communication in GB (10^9 B): ring bytes sent per device per step, in total and per link")


def _summary(r: SweepReport) -> list[str]:
    how = ("exact rationals, each configuration derived as by a single --set" if r.evaluation == "exact" else
           "compiled closed forms (float64, bytes rounded to the byte; --exact re-derives every row)")
    out = [f"{r.file}: {r.configurations():,} configuration(s) × {len(r.plans)} plan(s)", f"evaluation: {how}"]
    if r.fixed:
        out.append("fixed: " + ", ".join(f"{n} = {units.number(v)} (--set)" for n, v in r.fixed))
    out += [f"note: {n}" for n in r.notes]
    return out


def _footer(r: SweepReport) -> list[str]:
    out = []
    for j, q in enumerate(r.questions):
        verdicts = [row.verdicts[j] for row in r.rows[::max(1, len(r.plans))]]
        fails = verdicts.count("fails")
        label = f' "{q.label}"' if q.label else ""
        out.append(f"{q.where}: [{j + 1}] {q.kind}{label}: holds in {len(verdicts) - fails}, fails in {fails} "
                   f"of {len(verdicts)} configuration(s)")
    if any(q.kind == "assert" for q in r.questions):
        out.append("FAILED" if r.failed_asserts else "ok")
    return out


# columns a narrow text table leaves out first (the last of this list goes first)
_KEEP = ("plan", "memory GiB", "comm GB", "asserts", "× ", "first stage GiB", "last stage GiB", "params GiB",
         "optimizer GiB", "grads GiB", "activations GiB", "transient GiB")


def _rank(r: SweepReport, h: str) -> int:
    if h in r.swept:
        return -1
    for k, key in enumerate(_KEEP):
        if h == key or (key == "× " and h.startswith(key)):
            return k
    return len(_KEEP)  # per-link columns


def _text_table(r: SweepReport, head: list[str], rows: list[list[str]], keep: list[int]):
    from rich.table import Table

    t = Table()
    for k in keep:
        h = head[k]
        words = h.rsplit(" ", 1)
        short = _SHORT.get(words[0], words[0])
        label = f"{short}\n{words[1]}" if len(words) == 2 and words[1] in ("GiB", "GB") else h
        t.add_column(label, justify="left" if h in ("asserts", "plan") else "right", no_wrap=h != "asserts")
    for cells in rows:
        t.add_row(*(cells[k] for k in keep))
    return t


def render_text(r: SweepReport, width: int = 120, color: bool = False) -> str:
    """The rows as a table ``width`` columns wide: columns that do not fit are left out (the
    per-link ones first, then the states), and a note names them."""
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, no_color=not color, highlight=False,
                  color_system="standard" if color else None)
    for line in _summary(r):
        con.print(line)
    for line in UNITS:
        con.print(line)
    head, rows = table(r)
    keep = list(range(len(head)))
    wide = Console(file=io.StringIO(), width=10_000)
    while True:
        t = _text_table(r, head, rows, keep)
        if wide.measure(t).maximum <= width or len(keep) <= len(r.swept) + 2:
            break
        keep.remove(max(keep, key=lambda k: (_rank(r, head[k]), k)))
    con.print(t)
    left = [head[k] for k in range(len(head)) if k not in keep]
    if left:
        con.print(f"note: {width} columns leave out {', '.join(left)} (--width, --format csv or json show them)")
    for line in _footer(r):
        con.print(line)
    return buf.getvalue()


def render_markdown(r: SweepReport) -> str:
    head, rows = table(r)
    out = [f"# Sweep of `{r.file}`", "", *(line + "  " for line in _summary(r)), "", *(line + ".  " for line in UNITS), "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", r"\|") for c in cells) + " |" for cells in rows]
    footer = _footer(r)
    if footer:
        out += [""] + [f"- {line}" for line in footer]
    return "\n".join(out) + "\n"


def _json_number(v):
    if isinstance(v, float):
        return round(v)
    v = Fraction(v)
    return v.numerator if v.denominator == 1 else str(v)


def to_json(r: SweepReport) -> dict:
    keys = quantity_keys(r)
    return {
        **envelope(r.command, r.exit_status),
        "file": r.file,
        "evaluation": r.evaluation,
        "backend": r.backend,
        "swept": list(r.swept),
        "fixed": {n: str(v) for n, v in r.fixed},
        "plans": [{"plan": p} for p in r.plans],
        "baseline": r.baseline,
        "questions": [{"kind": q.kind, "label": q.label, "op": q.op, "where": q.where} for q in r.questions],
        "rows": [
            {"values": {n: _json_number(v) for n, v in zip(r.swept, row.values)}, "plan": row.plan,
             "bytes": {k: _json_number(row.numbers[k]) for k in keys if k in row.numbers},
             "verdicts": list(row.verdicts)}
            for row in r.rows
        ],
        "notes": list(r.notes),
        "summary": {"configurations": r.configurations(), "rows": len(r.rows), "asserts_failed": r.failed_asserts},
    }


def render_json(r: SweepReport) -> str:
    return json.dumps(to_json(r), indent=2, ensure_ascii=False) + "\n"


def render_csv(r: SweepReport) -> str:
    """One line per configuration and plan; quantities in bytes, named ``<quantity>_bytes``."""
    keys = quantity_keys(r)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    labels = [q.label or q.where for q in r.questions]
    w.writerow([*r.swept, "plan", *(k.replace(".", "_") + "_bytes" for k in keys), *labels])
    compiled = r.evaluation == "compiled"  # every number a float: rounded to the byte
    for row in r.rows:
        get = row.numbers.get
        numbers = [round(get(k, 0.0)) for k in keys] if compiled else [_json_number(get(k, 0)) for k in keys]
        w.writerow([*(_json_number(v) for v in row.values), row.plan, *numbers, *row.verdicts])
    return buf.getvalue()


def render(r: SweepReport, fmt: str, width: int = 120, color: bool = False) -> str:
    if fmt == "text":
        return render_text(r, width, color)
    if fmt == "markdown":
        return render_markdown(r)
    if fmt == "json":
        return render_json(r)
    if fmt == "csv":
        return render_csv(r)
    raise ValueError(f"a sweep has no {fmt} rendering")
