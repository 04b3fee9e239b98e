"""Text tables of the cost report: tables and lines in, the text a terminal shows out.

Input: a sequence of items, each a line of text (rich's console markup: ``[dim]``, ``[bold]``,
colours) or a ``Table`` (title, column headers, rows of cells, whether lines separate the rows).
Output: the text ``width`` columns wide. With colour the items go through rich's console and
tables. Without colour (a file, a pipe, a script: the common case) the same layout is computed
here, with rich's own measuring, wrapping and dividing helpers (``rich.cells``, ``rich._wrap``,
``rich._ratio``): the output is byte for byte what rich prints (tests/test_text_tables.py
renders every example both ways), at a fraction of the import and render time (rich's console
and table modules cost a cold ``placement cost`` about 0.05 s). Markup or a layout this module
does not reproduce (escaped brackets, ``[@...]`` tags, a column narrower than three cells,
control characters) goes through rich instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rich._ratio import ratio_reduce
from rich._wrap import divide_line
from rich.cells import cell_len, set_cell_size

# rich's markup tags (rich.markup.RE_TAGS) and its emoji codes (rich._emoji_replace)
_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_EMOJI = re.compile(r":\S*?:")
_TRAILING_SPACE = re.compile(r"\s+$")
# closing tags whose style name rich's Style.normalize leaves as written
_CLOSABLE = {"dim", "bold", "italic", "green", "red", "yellow"}
# what str.splitlines splits on besides "\n", and control characters: left to rich
_UNUSUAL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f\x85\u2028\u2029]")

# rich's box.HEAVY_HEAD, the default box of rich.table.Table
_TOP, _HEAD_ROW, _ROW, _BOTTOM = "┏━┳┓", "┡━╇┩", "├─┼┤", "└─┴┘"
_HEAD_EDGE, _BODY_EDGE = "┃", "│"


@dataclass
class Table:
    """A table as the report draws it: rich.table.Table's defaults (heavy header box, one
    space of padding, columns as wide as their cells allow, word wrap, ``…`` for a word wider
    than its column), a title justified left."""

    title: str
    show_lines: bool = True
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add_column(self, header: str) -> None:
        self.columns.append(header)

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)


class _NotPlain(Exception):
    """Markup or a layout that this module leaves to rich."""


def render(items: list[str | Table], width: int, color: bool) -> str:
    """The items printed one after another, as rich's console prints them ``width`` wide."""
    if not color:
        try:
            return "".join(_plain_item(item, width) for item in items)
        except _NotPlain:
            pass
    return _rich(items, width, color)


def _rich(items: list[str | Table], width: int, color: bool) -> str:
    import io

    from rich.console import Console
    from rich.table import Table as RichTable

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, no_color=not color, highlight=False,
                  color_system="standard" if color else None)
    for item in items:
        if isinstance(item, Table):
            t = RichTable(title=item.title, title_justify="left", show_lines=item.show_lines)
            for header in item.columns:
                t.add_column(header)
            for row in item.rows:
                t.add_row(*row)
            item = t
        con.print(item)
    return buf.getvalue()


# --------------------------------------------------------------------------- markup


def _emoji(text: str) -> str:
    if _EMOJI.search(text) is None:
        return text
    from rich._emoji_replace import _emoji_replace

    return _emoji_replace(text)


def _plain(markup: str) -> str:
    """The text of console markup: tags dropped, emoji codes replaced (rich.markup.render)."""
    if _UNUSUAL.search(markup):
        raise _NotPlain
    if "[" not in markup:
        return _emoji(markup)
    if "\\" in markup:
        raise _NotPlain
    out: list[str] = []
    open_tags: list[str] = []
    position = 0
    for match in _TAG.finditer(markup):
        start, end = match.span()
        if start > position:
            out.append(_emoji(markup[position:start]))
        name = match.group(3).partition("=")[0]
        if name.startswith("@"):
            raise _NotPlain
        if name.startswith("/"):
            closing = name[1:].strip()
            if not open_tags or (closing and (closing not in _CLOSABLE or closing not in open_tags)):
                raise _NotPlain  # a closing tag rich rejects (MarkupError) or normalises
            if closing:
                del open_tags[len(open_tags) - 1 - open_tags[::-1].index(closing)]
            else:
                open_tags.pop()
        else:
            open_tags.append(name)
        position = end
    if position < len(markup):
        out.append(_emoji(markup[position:]))
    return "".join(out)


# --------------------------------------------------------------------------- wrapping


def _rstrip_end(text: str, size: int) -> str:
    """rich.text.Text.rstrip_end: trailing whitespace beyond ``size`` removed."""
    if len(text) > size:
        match = _TRAILING_SPACE.search(text)
        if match is not None:
            return text[:-min(len(match.group(0)), len(text) - size)]
    return text


def _pieces(line: str, width: int, fold: bool) -> list[str]:
    offsets = divide_line(line, width, fold=fold)
    bounds = [0, *offsets, len(line)]
    return [_rstrip_end(line[a:b], width) for a, b in zip(bounds, bounds[1:])]


def _wrap_cell(text: str, width: int) -> list[str]:
    """A cell's lines, each ``width`` cells: word wrap, justified left, ``…`` for an overflow."""
    lines = []
    for line in text.split("\n"):
        for piece in _pieces(line, width, fold=False):
            length = cell_len(piece)
            if length > width:
                piece = set_cell_size(piece, width - 1) + "…"
            elif length < width:
                piece += " " * (width - length)
            lines.append(set_cell_size(piece, width))
    return lines


def _print_line(markup: str, width: int) -> str:
    """Console.print of a string: word wrap, words longer than a line folded."""
    lines = []
    for line in _plain(markup).split("\n"):
        for piece in _pieces(line, width, fold=True):
            lines.append(set_cell_size(piece, width) if cell_len(piece) > width else piece)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- tables


def _normalize(low: int, high: int) -> tuple[int, int]:
    low = min(max(0, low), high)
    return max(0, low), max(0, max(low, high))


def _measure(low: int, high: int, width: int) -> tuple[int, int]:
    """rich.measure.Measurement.get of a padded cell (one space each side) ``width`` wide,
    from the text's longest word and longest line."""
    if width < 1:
        return 0, 0
    if width - 2 < 1:
        low = high = width
    else:
        low, high = _normalize(low, high)
        low, high = min(low, width), min(high, width)
        low, high = (0, 0) if high < 1 else _normalize(low, high)
        low, high = min(low + 2, width), min(high + 2, width)
    low, high = _normalize(low, high)
    low, high = min(low, width), min(high, width)
    return (0, 0) if high < 1 else _normalize(low, high)


def _column(cells: list[tuple[int, int]], width: int) -> tuple[int, int]:
    if width < 1:
        return 0, 0
    ranges = [_measure(low, high, width) for low, high in cells]
    return min(max(r[0] for r in ranges), width), min(max(r[1] for r in ranges), width)


def _collapse(widths: list[int], max_width: int) -> list[int]:
    """rich.table.Table._collapse_widths with every column wrappable."""
    total = sum(widths)
    excess = total - max_width
    while total and excess > 0:
        top = max(widths)
        second = max((w if w != top else 0) for w in widths)
        difference = top - second
        ratios = [1 if w == top else 0 for w in widths]
        if not any(ratios) or not difference:
            break
        widths = ratio_reduce(excess, ratios, [min(excess, difference)] * len(widths), widths)
        total = sum(widths)
        excess = total - max_width
    return widths


def _widths(cells: list[list[tuple[int, int]]], max_width: int) -> list[int]:
    """rich.table.Table._calculate_column_widths (no fixed widths, not expanded)."""
    widths = [_column(col, max_width)[1] or 1 for col in cells]
    if sum(widths) > max_width:
        widths = _collapse(widths, max_width)
        if sum(widths) > max_width:
            widths = ratio_reduce(sum(widths) - max_width, [1] * len(widths), widths, widths)
        widths = [_column(col, w)[1] or 0 for col, w in zip(cells, widths)]
    return widths


def _extent(text: str) -> tuple[int, int]:
    """The longest word and the longest line of a cell (rich.text.Text.__rich_measure__)."""
    lines = text.splitlines()
    high = max(cell_len(line) for line in lines) if lines else 0
    words = text.split()
    return (max(cell_len(word) for word in words) if words else high), high


def _cell_lines(text: str, extent: tuple[int, int], width: int) -> list[str]:
    inner = min(_measure_inner(extent, width) + 2, width) - 2
    return [set_cell_size(f" {line} ", width) for line in _wrap_cell(text, inner)]


def _measure_inner(extent: tuple[int, int], width: int) -> int:
    low, high = _normalize(*extent)
    high = min(high, width)
    return 0 if high < 1 else _normalize(min(low, width), high)[1]


def _rule(chars: str, widths: list[int]) -> str:
    left, line, divider, right = chars
    return left + divider.join(line * w for w in widths) + right + "\n"


def _plain_table(table: Table, width: int) -> str:
    rows = [tuple(table.columns)] + [tuple(r) + ("",) * (len(table.columns) - len(r)) for r in table.rows]
    texts = [[_plain(cell) for cell in row] for row in rows]
    extents = [[_extent(cell) for cell in row] for row in texts]
    n = len(table.columns)
    widths = _widths([[row[i] for row in extents] for i in range(n)], width - (n + 1))
    if min(widths) < 3:
        raise _NotPlain
    table_width = sum(widths) + n + 1
    out = [_print_title(table.title, table_width)]
    out.append(_rule(_TOP, widths))
    for index, (row, ext) in enumerate(zip(texts, extents)):
        cells = [_cell_lines(text, e, w) for text, e, w in zip(row, ext, widths)]
        height = max(len(c) for c in cells)
        if index == 0:  # the header row sits at the bottom of its cells
            cells = [[" " * w] * (height - len(c)) + c for c, w in zip(cells, widths)]
        else:
            cells = [c + [" " * w] * (height - len(c)) for c, w in zip(cells, widths)]
        edge = _HEAD_EDGE if index == 0 else _BODY_EDGE
        for line in zip(*cells):
            out.append(edge + edge.join(line) + edge + "\n")
        if index == 0:
            out.append(_rule(_HEAD_ROW, widths))
        elif table.show_lines and index < len(rows) - 1:
            out.append(_rule(_ROW, widths))
    out.append(_rule(_BOTTOM, widths))
    return "".join(out)


def _print_title(markup: str, width: int) -> str:
    """A table's title: wrapped to the table's width, each line padded to it."""
    lines = []
    for line in _plain(markup).split("\n"):
        for piece in _pieces(line, width, fold=True):
            length = cell_len(piece)
            if length > width:
                piece = set_cell_size(piece, width)
            elif length < width:
                piece += " " * (width - length)
            lines.append(piece)
    return "\n".join(lines) + "\n"


def _plain_item(item: str | Table, width: int) -> str:
    return _plain_table(item, width) if isinstance(item, Table) else _print_line(item, width)
