"""Configuration files read safely: JSON and TOML text in, plain data with located, typed
access out.

Every framework reader (Hugging Face ``config.json``, DeepSpeed ``ds_config.json``,
torchtitan TOML) goes through here, so each is bounded alike:

- nesting deeper than ``MAX_DEPTH`` is refused before the parser runs (no ``RecursionError``);
- an integer literal longer than ``MAX_INT_DIGITS`` digits is refused while parsing (no
  4,300-digit ``ValueError``, no number too large to print); ``NaN`` and ``Infinity`` are
  refused;
- a value of the wrong JSON/TOML type is a diagnostic at its key (``Table``'s typed getters),
  never an attribute error deep in a reader.

A key is located by a scan of the text (``position``): the first occurrence of the path's
keys in order, a JSON ``"key":`` or a TOML ``key =`` / ``[table]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable

from ..diagnostics import Diagnostic, DiagnosticError, Span, did_you_mean

MAX_DEPTH = 64  # no framework configuration nests deeper
MAX_INT_DIGITS = 30  # counts and sizes: far beyond any real model, far below what cannot be printed


class _Refused(ValueError):
    """A literal the reader refuses (too long, not finite)."""


def _depth_at(text: str, opens: str, closes: str, quotes: str) -> int | None:
    """The offset where nesting first exceeds ``MAX_DEPTH`` (strings skipped), or None."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in quotes:
            q = ch
            i += 1
            while i < n and text[i] != q:
                i += 2 if text[i] == "\\" and q == '"' else 1
        elif ch in opens:
            depth += 1
            if depth > MAX_DEPTH:
                return i
        elif ch in closes:
            depth -= 1
        elif ch == "#" and "'" in quotes:  # a TOML comment runs to the end of the line
            while i < n and text[i] != "\n":
                i += 1
        i += 1
    return None


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _bounded_int(s: str) -> int:
    if len(s.lstrip("-+")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(s.lstrip('-+'))} digits (at most {MAX_INT_DIGITS})")
    return int(s)


def _finite(s: str) -> float:
    raise _Refused(f"{s} is not a number")


def load_json(text: str, file: str, code: str, what: str = "a JSON config") -> Any:
    """The JSON document of ``text``; a located ``code`` diagnostic when it is not one, nests
    too deep or holds a literal out of bounds."""
    deep = _depth_at(text, "[{", "]}", '"')
    if deep is not None:
        raise _error(file, text, code, f"not {what}: nested deeper than {MAX_DEPTH} levels", *_line_col(text, deep))
    try:
        return json.loads(text, parse_int=_bounded_int, parse_constant=_finite)
    except json.JSONDecodeError as exc:
        err = _error(file, text, code, f"not {what}: {exc.msg}", exc.lineno, exc.colno)
        if not text.lstrip().startswith(("{", "[")):
            err.sources = {}  # not JSON at all (a path given by mistake): its text is not echoed
        raise err from None
    except _Refused as exc:
        raise _error(file, text, code, f"not {what}: {exc}", 1, 1) from None
    except (ValueError, RecursionError) as exc:
        raise _error(file, text, code, f"not {what}: {exc}", 1, 1) from None


def load_toml(text: str, file: str, code: str, what: str = "a TOML job config") -> dict:
    """The TOML document of ``text``, bounded as ``load_json`` is."""
    import tomllib

    deep = _depth_at(text, "[{", "]}", "\"'")
    if deep is not None:
        raise _error(file, text, code, f"not {what}: nested deeper than {MAX_DEPTH} levels", *_line_col(text, deep))
    for m in re.finditer(r"(?<![\w.\"'])[-+]?\d[\d_]*", text):
        if len(m.group().lstrip("-+").replace("_", "")) > MAX_INT_DIGITS:
            raise _error(file, text, code, f"not {what}: an integer of more than {MAX_INT_DIGITS} digits",
                         *_line_col(text, m.start()))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, col = getattr(exc, "lineno", None) or 1, getattr(exc, "colno", None) or 1
        raise _error(file, text, code, f"not {what}: {getattr(exc, 'msg', None) or exc}", line, col) from None
    except (ValueError, RecursionError) as exc:
        raise _error(file, text, code, f"not {what}: {exc}", 1, 1) from None


def _error(file: str, text: str, code: str, message: str, line: int, col: int, width: int = 1,
           notes: tuple[str, ...] = ()) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, message, Span(file, line, col, line, col + width), notes=notes)],
                           {file: text})


def position(text: str, path: tuple[str, ...]) -> tuple[int, int, int]:
    """(line, column, width) of the last key of ``path`` in ``text``: each key searched after
    the one before it, as a JSON ``"key":``, a TOML ``key =`` or a TOML table header; (1, 1, 1)
    when it is not found."""
    at, found = 0, None
    for key in path:
        k = re.escape(key)
        m = re.compile(rf'"{k}"\s*:|^\s*\[+\s*(?:[\w.-]+\.)?{k}\s*\]+|(?:^|[{{,.\s]){k}\s*=|\.{k}\s*=',
                       re.MULTILINE).search(text, at)
        if not m:
            break
        start = text.index(key, m.start())
        found, at = (start, len(key)), m.end()
    if found is None:
        return 1, 1, 1
    line, col = _line_col(text, found[0])
    if col > 1 and text[found[0] - 1] == '"':
        return line, col - 1, found[1] + 2
    return line, col, found[1]


@dataclass
class Table:
    """One object of a configuration (the whole file, or a table inside it) with typed getters
    whose errors are located at the key. ``used`` collects every key read (dotted)."""

    data: dict
    text: str
    file: str
    code: str
    path: tuple[str, ...] = ()
    used: list = field(default_factory=list)
    asked: set = field(default_factory=set)  # every key name a getter asked for, present or not

    def error(self, key: str | None, message: str, notes: tuple[str, ...] = ()) -> DiagnosticError:
        line, col, width = position(self.text, self.path + ((key,) if key else ())) if key or self.path else (1, 1, 1)
        return _error(self.file, self.text, self.code, message, line, col, width, notes)

    def name(self, key: str) -> str:
        return ".".join(self.path + (key,))

    def has(self, key: str) -> bool:
        self.asked.add(key)
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = None) -> Any:
        if not self.has(key):
            return default
        self.used.append(self.name(key))
        return self.data[key]

    def table(self, key: str, *, allow_false: bool = False) -> "Table":
        """The table at ``key`` (empty when absent or null; with ``allow_false``, ``false`` too)."""
        self.asked.add(key)
        v = self.data.get(key)
        if v is None or (allow_false and v is False):
            if v is False:
                self.used.append(self.name(key))
            return Table({}, self.text, self.file, self.code, self.path + (key,), self.used, self.asked)
        if not isinstance(v, dict):
            raise self.error(key, f"{self.name(key)} must be a table (an object of keys), not {_show(v)}")
        return Table(v, self.text, self.file, self.code, self.path + (key,), self.used, self.asked)

    def integer(self, key: str, default: int | None = None, low: int | None = 1, high: int | None = None,
                allowed: Iterable[int] = ()) -> int | None:
        """An integer (``true``/``false`` and ``3.0`` are not) in [low, high] or one of ``allowed``."""
        if not self.has(key):
            return default
        v = self.data[key]
        allowed = tuple(allowed)
        ok = isinstance(v, int) and not isinstance(v, bool) and (
            v in allowed or ((low is None or v >= low) and (high is None or v <= high)))
        if not ok:
            if low == 1 and high is None:
                rng = "a positive integer"
            elif low is not None:
                rng = f"an integer of at least {low}" if high is None else f"an integer from {low} to {high}"
            else:
                rng = "an integer"
            extra = f" (or {', '.join(map(str, allowed))})" if allowed else ""
            raise self.error(key, f"{self.name(key)} must be {rng}{extra}, not {_show(v)}")
        self.used.append(self.name(key))
        return v

    def number(self, key: str, default: Fraction | None = None, positive: bool = True) -> Fraction | None:
        if not self.has(key):
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (positive and v <= 0):
            raise self.error(key, f"{self.name(key)} must be a {'positive ' if positive else ''}number, not {_show(v)}")
        self.used.append(self.name(key))
        return Fraction(str(v))

    def flag(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        v = self.data[key]
        if not isinstance(v, bool):
            raise self.error(key, f"{self.name(key)} must be true or false, not {_show(v)}")
        self.used.append(self.name(key))
        return v

    def choice(self, key: str, choices: Iterable[str], default: str | None = None) -> str | None:
        if not self.has(key):
            return default
        v = self.data[key]
        choices = tuple(choices)
        if not isinstance(v, str) or v not in choices:
            raise self.error(key, f"{self.name(key)} must be one of {', '.join(choices)}, not {_show(v)}",
                             did_you_mean(v, choices) if isinstance(v, str) else ())
        self.used.append(self.name(key))
        return v

    def string(self, key: str, default: str | None = None) -> str | None:
        if not self.has(key):
            return default
        v = self.data[key]
        if not isinstance(v, str):
            raise self.error(key, f"{self.name(key)} must be a string, not {_show(v)}")
        self.used.append(self.name(key))
        return v


def _show(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (dict, list, str, bool, int, float)) or v is None else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
