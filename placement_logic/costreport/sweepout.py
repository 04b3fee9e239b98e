"""Rendering of a sweep (``SweepReport``): text, Markdown, JSON and CSV, one row per
configuration and plan.

Input: a ``SweepReport``. Output: the rendering written to a stream (``write``, which returns
the ``Tally`` of the verdicts: the footer and the exit status) or a string (``render``). The
rows are read once, as the report produces them (``SweepReport.iter_rows``), and written as
they come: CSV and Markdown line by line; JSON and a text table longer than ``TEXT_ROWS``
rows through a temporary file (JSON's exit status and a table's column widths come before the
rows but are known only after them), so that memory does not grow with the rows. Text and
Markdown show the swept values, the
device memory (total in GB and GiB, each state and the transient terms in GiB, the total
of each pipeline stage), the ring bytes sent per device per step (total and per link, in
GB) and the asserts that fail; with ``compare`` the ratio of the total to the baseline's.
JSON and CSV give the bytes themselves: exact integers (or ``n/d`` strings) from an exact
evaluation, float64 rounded to the byte from a compiled one (``evaluation`` says which).
"""

from __future__ import annotations

import csv
import json
import tempfile
from fractions import Fraction
from typing import Iterator, TextIO

from ..outcome import QuestionVerdict, envelope
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


class Tally:
    """The verdicts counted as the rows go by: per question, the configurations where it fails
    (each configuration's verdicts are those of its first row), and the asserts that fail
    over every row."""

    def __init__(self, r: SweepReport):
        self.asserts = [q.kind == "assert" for q in r.questions]
        self.fails = [0] * len(r.questions)
        self.configurations = 0
        self.rows = 0
        self.failed_asserts = 0

    def add(self, group: list[SweepRow]) -> None:
        self.configurations += 1
        for j, v in enumerate(group[0].verdicts):
            self.fails[j] += v == QuestionVerdict.FAILS
        for row in group:
            self.rows += 1
            self.failed_asserts += sum(1 for a, v in zip(self.asserts, row.verdicts) if a and v == QuestionVerdict.FAILS)

    @property
    def exit_status(self) -> int:
        """1 when an ``assert`` fails on some row, else 0 (every symbol is bound: nothing is unknown)."""
        return 1 if self.failed_asserts else 0


def configurations(r: SweepReport, tally: Tally) -> Iterator[list[SweepRow]]:
    """The report's rows, one configuration (one row per plan) at a time, counted into ``tally``."""
    group: list[SweepRow] = []
    for row in r.iter_rows():
        group.append(row)
        if len(group) == len(r.plans):
            tally.add(group)
            yield group
            group = []


def _ratio(r: SweepReport, row: SweepRow, group: list[SweepRow]) -> str:
    base = next((b for b in group if b.plan == r.baseline), None)
    if base is None or _bytes(base.get("memory.total")) == 0:
        return "—"
    x = _bytes(row.get("memory.total")) / _bytes(base.get("memory.total"))
    return units.decimal_string(x, 3)


def _failed(r: SweepReport, row: SweepRow) -> str:
    """``ok``, or ``fails`` with the numbers of the failing asserts (the footer lists them)."""
    bad = [str(k + 1) for k, (q, v) in enumerate(zip(r.questions, row.verdicts))
           if v == QuestionVerdict.FAILS and q.kind == "assert"]
    if bad:
        return "fails " + ",".join(bad)
    return "ok"


def _gib(v) -> str:
    return units.decimal_string(_bytes(v) / 2**30, 2)


def _gb(v) -> str:
    return units.decimal_string(_bytes(v) / 10**9, 2)


def header(r: SweepReport) -> list[str]:
    """The human table's headers (with their units)."""
    head = list(r.swept)
    if len(r.plans) > 1:
        head.append("plan")
    head += ["memory GiB", *(f"{s} GiB" for s in STATES)]
    if r.staged:
        head += ["first stage GiB", "last stage GiB"]
    head += ["comm GB", *(f"{k} GB" for k in r.links)]
    if r.command == "compare":
        head.append(f"× {r.baseline}")
    if any(q.kind == "assert" for q in r.questions):
        head.append("asserts")
    return head


def cells(r: SweepReport, group: list[SweepRow]) -> Iterator[list[str]]:
    """The human table's rows of one configuration: cells in the units of ``header``."""
    many = len(r.plans) > 1
    asserts = any(q.kind == "assert" for q in r.questions)
    for row in group:
        out = [units.number(v) for v in row.values]
        if many:
            out.append(row.plan)
        out.append(_gib(row.get("memory.total")))
        out += [_gib(row.get(f"memory.{s}")) for s in STATES]
        if r.staged:
            out += [_gib(row.get(f"stage.{st}.total")) if row.plan in r.staged else "—" for st in ("first", "last")]
        out.append(_gb(row.get("comm.total")))
        out += [_gb(row.get(f"comm.link.{k}")) for k in r.links]
        if r.command == "compare":
            out.append(_ratio(r, row, group))
        if asserts:
            out.append(_failed(r, row))
        yield out


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


def _footer(r: SweepReport, tally: Tally) -> list[str]:
    out = []
    for j, q in enumerate(r.questions):
        fails = tally.fails[j]
        label = f' "{q.label}"' if q.label else ""
        out.append(f"{q.where}: [{j + 1}] {q.kind}{label}: holds in {tally.configurations - fails}, fails in {fails} "
                   f"of {tally.configurations} configuration(s)")
    if any(q.kind == "assert" for q in r.questions):
        out.append("FAILED" if tally.failed_asserts else "ok")
    return out


def write_markdown(r: SweepReport, out: TextIO) -> Tally:
    tally = Tally(r)
    head = header(r)
    lines = [f"# Sweep of `{r.file}`", "", *(line + "  " for line in _summary(r)), "", *(line + ".  " for line in UNITS),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out.write("\n".join(lines))
    for group in configurations(r, tally):
        for row in cells(r, group):
            out.write("\n| " + " | ".join(c.replace("|", r"\|") for c in row) + " |")
    footer = _footer(r, tally)
    if footer:
        out.write("\n" + "\n".join([""] + [f"- {line}" for line in footer]))
    out.write("\n")
    return tally


def _json_number(v):
    if isinstance(v, float):
        return round(v)
    v = Fraction(v)
    return v.numerator if v.denominator == 1 else str(v)


_ROWS = "\0rows\0"  # where the rows go in the JSON document written around them


def write_json(r: SweepReport, out: TextIO) -> Tally:
    """The document ``json.dumps(..., indent=2)`` writes, its rows spooled to a temporary file
    first (the exit status, at its top, is known only once every row is)."""
    keys = quantity_keys(r)
    tally = Tally(r)
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
        first = True
        for group in configurations(r, tally):
            for row in group:
                item = {"values": {n: _json_number(v) for n, v in zip(r.swept, row.values)}, "plan": row.plan,
                        "bytes": {k: _json_number(row.numbers[k]) for k in keys if k in row.numbers},
                        "verdicts": list(row.verdicts)}
                text = json.dumps(item, indent=2, ensure_ascii=False).replace("\n", "\n    ")
                spool.write(("" if first else ",\n") + "    " + text)
                first = False
        doc = {
            **envelope(r.command, tally.exit_status),
            "file": r.file,
            "evaluation": r.evaluation,
            "backend": r.backend,
            "swept": list(r.swept),
            "fixed": {n: str(v) for n, v in r.fixed},
            "plans": [{"plan": p} for p in r.plans],
            "baseline": r.baseline,
            "questions": [{"kind": q.kind, "label": q.label, "op": q.op, "where": q.where} for q in r.questions],
            "rows": [] if first else [_ROWS],
            "notes": list(r.notes),
            "summary": {"configurations": r.configurations(), "rows": tally.rows,
                        "asserts_failed": tally.failed_asserts},
        }
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        if first:
            out.write(text)
            return tally
        before, after = text.split("    " + json.dumps(_ROWS), 1)
        out.write(before)
        spool.seek(0)
        while block := spool.read(1 << 16):
            out.write(block)
        out.write(after)
    return tally


def write_csv(r: SweepReport, out: TextIO) -> Tally:
    """One line per configuration and plan; quantities in bytes, named ``<quantity>_bytes``."""
    keys = quantity_keys(r)
    tally = Tally(r)
    w = csv.writer(out, lineterminator="\n")
    labels = [q.label or q.where for q in r.questions]
    w.writerow([*r.swept, "plan", *(k.replace(".", "_") + "_bytes" for k in keys), *labels])
    compiled = r.evaluation == "compiled"  # every number a float: rounded to the byte
    for group in configurations(r, tally):
        for row in group:
            get = row.numbers.get
            numbers = [round(get(k, 0.0)) for k in keys] if compiled else [_json_number(get(k, 0)) for k in keys]
            w.writerow([*(_json_number(v) for v in row.values), row.plan, *numbers, *row.verdicts])
    return tally
