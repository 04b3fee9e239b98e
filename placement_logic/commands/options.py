"""The command-line options every command shares, and their parsing: one ``--set`` parser,
``--plan``, ``--format``, ``--timeout``, and the one location command-line errors carry.

Values are parsed here into exact numbers; a bad value is a located ``DiagnosticError``
(``placement: error: ...`` with the offending option under a caret; no file position), never a traceback.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable

from ..diagnostics import COMMAND_LINE, Code, Diagnostic, DiagnosticError, Span, did_you_mean


def command_line_span(text: str) -> Span:
    """The location of a command-line error: the option's text on a line of its own."""
    return Span(COMMAND_LINE, 1, 1, 1, len(text) + 1, text)


def add_file(p, help: str = "a .place spec") -> None:
    p.add_argument("file", metavar="FILE", help=help)


def add_plan(p, help: str = "only this plan (repeatable)", required: bool = False) -> None:
    p.add_argument("--plan", dest="plans", action="append", default=None if required else [], metavar="NAME",
                   required=required, help=help)


def add_format(p, formats: tuple[str, ...]) -> None:
    p.add_argument("--format", choices=formats, default="text", help="output format (default: text)")


def add_width(p) -> None:
    p.add_argument("--width", type=int, default=None, metavar="COLUMNS",
                   help="text width (default: the terminal's, or $COLUMNS; 120 when the output is not a terminal)")


DEFAULT_WIDTH = 120  # piped or redirected text: stable, as the golden files hold it
MIN_WIDTH = 40


def output_width(args, out) -> int:
    """The text width: --width, else $COLUMNS, else the terminal's, else DEFAULT_WIDTH."""
    import os
    import shutil

    asked = getattr(args, "width", None)
    if asked is not None:
        if asked < MIN_WIDTH:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--width {asked}: at least {MIN_WIDTH} columns",
                                              command_line_span(f"--width {asked}"))])
        return asked
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) >= MIN_WIDTH:
        return int(env)
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)
    return DEFAULT_WIDTH


def wrap_width(args, out) -> int | None:
    """The width to wrap plain-text lines at: --width, $COLUMNS or a terminal's; None for a
    pipe (lines kept whole, stable for files and tools)."""
    import os

    isatty = getattr(out, "isatty", None)
    env = os.environ.get("COLUMNS", "")
    if getattr(args, "width", None) is not None or (env.isdigit() and int(env) >= MIN_WIDTH) \
            or (isatty is not None and isatty()):
        return output_width(args, out)
    return None


def colour(out) -> bool:
    """Colour only on a terminal, and never when $NO_COLOR is set (no-color.org)."""
    import os

    isatty = getattr(out, "isatty", None)
    return bool(isatty is not None and isatty()) and "NO_COLOR" not in os.environ


def add_timeout(p, default: str = "10", help: str = "solver time limit per query (default: 10)") -> None:
    p.add_argument("--timeout", default=default, metavar="SECONDS", help=help)


def add_set(p, help: str) -> None:
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE", help=help)


def exact_number(text: str) -> Fraction:
    """A command-line number as an exact fraction: a decimal literal as the language reads it
    (``7.5e9``, ``70_000``, exponents within ±400, docs/language.md) or a fraction ``P/Q`` of
    two; ``ValueError`` otherwise (NaN, infinities, and numbers whose digits alone would take
    minutes to build, such as ``1e999999999``)."""
    from ..frontend.lower import read_number

    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    body = text[1:] if text[:1] in "+-" else text
    num, slash, den = body.partition("/")
    if not num or (slash and not den) or body[:1] in "+-" or \
            not all(c.isdigit() or c in "._eE+-" for c in body.replace("/", "")):
        raise ValueError(text)
    try:
        value = read_number(num) / (read_number(den) if slash else 1)
    except (ValueError, ZeroDivisionError, IndexError):
        raise ValueError(text) from None
    return sign * value


def parse_timeout(text: str, option: str = "--timeout") -> float:
    try:
        value = float(exact_number(text))
    except (ValueError, OverflowError):
        value = -1.0
    if not 0 < value <= MAX_TIMEOUT:
        raise DiagnosticError([Diagnostic(Code.BAD_TIMEOUT, f"{option} {text}: expected a positive number of seconds, at "
                                          f"most {MAX_TIMEOUT} (a day)", command_line_span(f"{option} {text}"))])
    return value


MAX_TIMEOUT = 86400  # seconds: a solver time limit beyond a day is a typing error


def parse_sets(items: Iterable[str], known: Iterable[str] | None = None, axes: Iterable[str] = (),
               integers: bool = False) -> dict[str, Fraction]:
    """``NAME=VALUE`` options to exact numbers.

    ``known``: the names that may be set (None: any); ``axes``: names whose value is a mesh
    size (a positive integer); ``integers``: every value must be a positive integer (pinned
    sizes of ``check``)."""
    known = list(known) if known is not None else None
    axes = set(axes)
    out: dict[str, Fraction] = {}
    for item in items:
        span = command_line_span(f"--set {item}")
        name, eq, text = item.partition("=")
        name, raw = name.strip(), text.strip()
        text = raw.replace("_", "")  # digit grouping: 1_000
        try:
            value = exact_number(text) if eq and text else None
        except ValueError:
            value = None
        if integers:
            if not name or value is None or value.denominator != 1 or value < 1:
                raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {item}: expected NAME=N with N a positive integer",
                                                  span)])
            out[name] = value
            continue
        if not eq or not name or not text:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set expects NAME=NUMBER, got '{item}'", span)])
        if known is not None and name not in known:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set names '{name}', which is not a let or an axis of the spec",
                                              span, notes=did_you_mean(name, known))])
        if value is None:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {name}: '{raw}' is not an exact number", span)])
        if name in axes and (value.denominator != 1 or value < 1):
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {name}: an axis size must be a positive integer", span)])
        out[name] = value
    return out


def parse_single_sets(items: Iterable[str], known: Iterable[str] | None = None, axes: Iterable[str] = (),
                      command: str = "this command") -> dict[str, Fraction]:
    """``--set`` options of a command that takes one value per name (``inspect``, ``measure``):
    as ``parse_sets``; a list or a range (``is_sweep``) is PL301 with the caret under its value,
    since only ``cost`` and ``compare`` sweep."""
    for item in items:
        if is_sweep(item):
            raw_name, _, raw = item.partition("=")
            offset = len(raw_name) + 1 + (len(raw) - len(raw.lstrip()))
            raise DiagnosticError([Diagnostic(
                Code.BAD_SET, f"--set {item.strip()}: {command} takes one value per name; a list or a range sweeps "
                "in cost and compare (docs/sweeps.md)", _item_span(item, offset, raw.strip()))])
    return parse_sets(items, known=known, axes=axes)


def spec_single_sets(items: Iterable[str], spec, command: str) -> dict[str, Fraction]:
    """``--set`` of ``inspect`` and ``measure``: one exact number per let or mesh axis of
    ``spec`` (an axis size a positive integer), each name located as PL301 when it is not one."""
    return parse_single_sets(items, known=[n for n, _ in spec.bindings],
                             axes=spec.mesh.names if spec.mesh else (), command=command)


def add_device(p) -> None:
    p.add_argument("--device", metavar="NAME", default=None,
                   help="a catalogue device (docs/hardware.md), e.g. h100_sxm: memory fit and step time; "
                   "it replaces the mesh's own 'device'")


def device_option(args) -> str | None:
    """``--device NAME``, checked against the catalogue (PL150 at the option otherwise)."""
    name = getattr(args, "device", None)
    if name is None:
        return None
    from .. import hardware

    if hardware.device(name) is None:
        raise DiagnosticError([Diagnostic(Code.FILTER_ON_SHARDS, f"--device {name}: not a device of the catalogue",
                                          command_line_span(f"--device {name}"),
                                          notes=did_you_mean(name, tuple(hardware.DEVICES))
                                          + ("catalogue devices: " + ", ".join(hardware.DEVICES),))])
    return name.lower()
MAX_SWEEP_ROWS = 100_000  # configurations per plan one sweep may ask for


def _item_span(item: str, start: int, text: str) -> Span:
    """The location of ``text`` at ``start`` inside ``--set ITEM`` (columns are 1-based)."""
    col = len("--set ") + start + 1
    return Span(COMMAND_LINE, 1, col, 1, col + max(len(text), 1), f"--set {item}")


def _sweep_values(item: str, name: str, text: str, offset: int, axis: bool) -> tuple[Fraction, ...]:
    """The values of one swept ``--set``: ``A,B,C`` (exact numbers, given order, no repeats),
    ``A..B`` (every integer from A to B), ``A..B:+K`` (step K) or ``A..B:xK`` (A, A·K, A·K², …
    up to B). Every value is positive; an axis size is a positive integer."""

    def bad(message: str, start: int = 0, part: str = text) -> DiagnosticError:
        return DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {name}={text}: {message}",
                                           _item_span(item, offset + start, part))])

    if ".." in text:
        head, _, step = text.partition(":")
        lo_text, _, hi_text = head.partition("..")
        bounds = []
        for start, part in ((0, lo_text), (len(lo_text) + 2, hi_text)):
            try:
                v = Fraction(part) if part else None
            except (ValueError, ZeroDivisionError):
                v = None
            if v is None or v.denominator != 1 or v < 1:
                raise bad(f"a range is A..B with A and B positive integers; '{part}' is not one", start, part)
            bounds.append(int(v))
        lo, hi = bounds
        if hi < lo:
            raise bad(f"the range {lo}..{hi} is descending (write {hi}..{lo})")
        kind, k = "+", 1
        if step:
            at = len(head) + 1
            kind = step[0] if step[0] in "+x" else ""
            try:
                k = int(step[1:]) if kind and step[1:].isdigit() else 0
            except ValueError:
                k = 0
            if not kind or k < (2 if kind == "x" else 1):
                raise bad("a range step is :+K (K ≥ 1) or :xK (K ≥ 2)", at, step)
        if kind == "+":
            count = (hi - lo) // k + 1
            if count > MAX_SWEEP_ROWS:
                raise DiagnosticError([Diagnostic(Code.SWEEP_TOO_LARGE, f"--set {name}={text}: {count:,} values; a sweep takes at "
                                                  f"most {MAX_SWEEP_ROWS:,} configurations", _item_span(item, offset, text))])
            return tuple(Fraction(v) for v in range(lo, hi + 1, k))
        out, v = [], lo
        while v <= hi:
            out.append(Fraction(v))
            v *= k
        return tuple(out)
    values: list[Fraction] = []
    pos = 0
    for part in text.split(","):
        start, pos = pos, pos + len(part) + 1
        if not part.strip():
            raise bad("an empty value in the list", start, part)
        try:
            v = Fraction(part.strip())
        except (ValueError, ZeroDivisionError):
            raise bad(f"'{part}' is not an exact number", start, part) from None
        if v <= 0:
            raise bad(f"'{part}': swept values are positive", start, part)
        if axis and v.denominator != 1:
            raise bad(f"'{part}': an axis size must be a positive integer", start, part)
        if v in values:
            raise bad(f"'{part}' is given twice", start, part)
        values.append(v)
    return tuple(values)


def is_sweep(item: str) -> bool:
    """Whether a ``--set`` item gives a list or a range rather than one number."""
    text = item.partition("=")[2]
    return "," in text or ".." in text


def parse_sweep_sets(items: Iterable[str], known: Iterable[str] | None = None, axes: Iterable[str] = ()
                     ) -> tuple[dict[str, Fraction], dict[str, tuple[Fraction, ...]]]:
    """``--set`` options of ``cost`` and ``compare``: single values (as ``parse_sets``) and
    sweeps (lists and ranges, ``_sweep_values``), the latter in the order given. A name given
    again replaces its earlier value. More than ``MAX_SWEEP_ROWS`` configurations in the
    cartesian product of the sweeps is PL310."""
    known = list(known) if known is not None else None
    axes = set(axes)
    single: dict[str, Fraction] = {}
    sweeps: dict[str, tuple[Fraction, ...]] = {}
    spans: dict[str, Span] = {}
    for item in items:
        if not is_sweep(item):
            single.update(parse_sets([item], known=known, axes=axes))
            sweeps.pop(item.partition("=")[0].strip(), None)
            continue
        raw_name, _, raw = item.partition("=")
        name = raw_name.strip()
        if not name:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set expects NAME=VALUES, got '{item}'",
                                              command_line_span(f"--set {item}"))])
        if known is not None and name not in known:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set names '{name}', which is not a let or an axis of the spec",
                                              _item_span(item, 0, raw_name), notes=did_you_mean(name, known))])
        offset = len(raw_name) + 1 + (len(raw) - len(raw.lstrip()))
        text = raw.strip().replace("_", "")
        sweeps[name] = _sweep_values(item, name, text, offset, name in axes)
        single.pop(name, None)
        spans[name] = command_line_span(f"--set {item}")
    total = 1
    for name, values in sweeps.items():
        total *= len(values)
        if total > MAX_SWEEP_ROWS:
            raise DiagnosticError([Diagnostic(
                Code.SWEEP_TOO_LARGE, f"the sweep over {', '.join(sweeps)} has {_product(sweeps):,} configurations; at most "
                f"{MAX_SWEEP_ROWS:,} are evaluated at once", spans[name])])
    return single, sweeps


def _product(sweeps: dict[str, tuple]) -> int:
    n = 1
    for v in sweeps.values():
        n *= len(v)
    return n
