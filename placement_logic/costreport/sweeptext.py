"""A sweep as a text table (``rich``), written as its rows come, in memory that does not grow with them.

Input: a ``SweepReport``, a stream, the width and whether to colour. Output: the summary, the
table and the footer written to the stream; the ``Tally`` of the verdicts back.

A table of at most ``TEXT_ROWS`` rows is laid out whole by rich. A longer one goes through a
temporary file: its cells are written there while each column's widest cell is noted; the
columns that fit the width are chosen from those widest cells (rich measures a column by its
widest cell), and the rows are then read back and laid out ``BLOCK`` at a time at those widths
(every block's columns given the widths of the whole table), the header with the first block
and the closing border after the last: the same table rich lays out whole. Once the first
block's rows are seen to be rich's plain lines (no cell wrapped), the others are written as
such lines directly, at a small fraction of rich's cost.
"""

from __future__ import annotations

import io
import tempfile
from typing import TextIO

from .sweep import SweepReport
from .sweepout import (
    _SHORT,
    UNITS,
    Tally,
    _footer,
    _summary,
    cells,
    configurations,
    header,
    write_csv,
    write_json,
    write_markdown,
)

TEXT_ROWS = 2000  # a table laid out whole up to this many rows
BLOCK = 1000  # rows laid out at a time beyond it
_SEP = "\x1f"

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


def _label(h: str) -> str:
    words = h.rsplit(" ", 1)
    short = _SHORT.get(words[0], words[0])
    return f"{short}\n{words[1]}" if len(words) == 2 and words[1] in ("GiB", "GB") else h


def _text_table(r: SweepReport, head: list[str], rows: list[list[str]], keep: list[int],
                widths: dict[int, int] | None = None, show_header: bool = True):
    from rich.table import Table

    t = Table(show_header=show_header)
    for k in keep:
        h = head[k]
        t.add_column(_label(h), justify="left" if h in ("asserts", "plan") else "right", no_wrap=h != "asserts",
                     width=None if widths is None else widths[k])
    for row in rows:
        t.add_row(*(row[k] for k in keep))
    return t


def _console(buf, width: int, color: bool):
    from rich.console import Console

    return Console(file=buf, width=width, force_terminal=color, no_color=not color, highlight=False,
                   color_system="standard" if color else None)


def _fit(r: SweepReport, head: list[str], rows: list[list[str]], width: int) -> list[int]:
    """The columns kept: the per-link ones, then the states, are left out until the table fits."""
    from rich.console import Console

    keep = list(range(len(head)))
    wide = Console(file=io.StringIO(), width=10_000)
    while True:
        t = _text_table(r, head, rows, keep)
        if wide.measure(t).maximum <= width or len(keep) <= len(r.swept) + 2:
            return keep
        keep.remove(max(keep, key=lambda k: (_rank(r, head[k]), k)))


def write_text(r: SweepReport, out: TextIO, width: int = 120, color: bool = False) -> Tally:
    """The rows as a table ``width`` columns wide: columns that do not fit are left out (the
    per-link ones first, then the states), and a note names them."""
    tally = Tally(r)
    buf = io.StringIO()
    con = _console(buf, width, color)
    for line in _summary(r) + list(UNITS):
        con.print(line)
    out.write(buf.getvalue())
    head = header(r)
    rows: list[list[str]] = []
    groups = configurations(r, tally)
    for group in groups:
        rows += cells(r, group)
        if len(rows) > TEXT_ROWS:
            break
    if len(rows) <= TEXT_ROWS:
        keep = _fit(r, head, rows, width)
        buf = io.StringIO()
        _console(buf, width, color).print(_text_table(r, head, rows, keep))
        out.write(buf.getvalue())
    else:
        keep = _spooled(r, head, rows, groups, out, width, color)
    buf = io.StringIO()
    con = _console(buf, width, color)
    left = [head[k] for k in range(len(head)) if k not in keep]
    if left:
        con.print(f"note: {width} columns leave out {', '.join(left)} (--width, --format csv or json show them)")
    for line in _footer(r, tally):
        con.print(line)
    out.write(buf.getvalue())
    return tally


def _spooled(r: SweepReport, head: list[str], rows: list[list[str]], groups, out: TextIO, width: int,
             color: bool) -> list[int]:
    """A table longer than ``TEXT_ROWS``: ``rows`` (the first ones) and the rest of ``groups``
    through a temporary file, laid out ``BLOCK`` rows at a time at the whole table's widths."""
    from rich.cells import cell_len

    widest = list(rows[0])
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:

        def keep_row(row: list[str]) -> None:
            for k, c in enumerate(row):
                if cell_len(c) > cell_len(widest[k]):
                    widest[k] = c
            spool.write(_SEP.join(row) + "\n")

        for row in rows:
            keep_row(row)
        rows.clear()
        for group in groups:
            for row in cells(r, group):
                keep_row(row)
        keep = _fit(r, head, [widest], width)
        widths = {k: max(cell_len(widest[k]), *(cell_len(line) for line in _label(head[k]).split("\n")))
                  for k in keep}
        spool.seek(0)
        closing, first, plain = "", True, False
        while True:
            block = [line.rstrip("\n").split(_SEP) for _, line in zip(range(BLOCK), spool)]
            if not block:
                break
            if plain:
                out.write("".join(_plain(head, block, keep, widths)))
                continue
            buf = io.StringIO()
            _console(buf, width, color).print(_text_table(r, head, block, keep, widths, show_header=first))
            lines = buf.getvalue().splitlines(keepends=True)
            closing = lines[-1]
            out.write("".join(lines[:-1] if first else lines[1:-1]))
            # rich's rows are the plain lines below when no cell wraps: the rest written so, much faster
            plain = lines[-1 - len(block):-1] == _plain(head, block, keep, widths)
            first = False
        out.write(closing)
    return keep


def _plain(head: list[str], block: list[list[str]], keep: list[int], widths: dict[int, int]) -> list[str]:
    """The body lines rich lays out for ``block`` at ``widths`` when no cell wraps (checked
    against rich's own on the first block before they are used)."""
    from rich.cells import cell_len

    left = {k for k in keep if head[k] in ("asserts", "plan")}
    out = []
    for row in block:
        parts = []
        for k in keep:
            pad = " " * (widths[k] - cell_len(row[k]))
            parts.append(f" {row[k]}{pad} " if k in left else f" {pad}{row[k]} ")
        out.append("│" + "│".join(parts) + "│\n")
    return out


def write(r: SweepReport, fmt: str, out: TextIO, width: int = 120, color: bool = False) -> Tally:
    """The report in ``fmt`` written to ``out`` as its rows are produced; the verdicts' tally back."""
    if fmt == "text":
        return write_text(r, out, width, color)
    if fmt == "markdown":
        return write_markdown(r, out)
    if fmt == "json":
        return write_json(r, out)
    if fmt == "csv":
        return write_csv(r, out)
    raise ValueError(f"a sweep has no {fmt} rendering")


def render(r: SweepReport, fmt: str, width: int = 120, color: bool = False) -> str:
    buf = io.StringIO()
    write(r, fmt, buf, width, color)
    return buf.getvalue()
