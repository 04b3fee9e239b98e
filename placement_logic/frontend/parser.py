"""Parsing: source text -> syntax tree, or diagnostics.

Loads the canonical grammar (``grammar/placement.lark``, shipped inside the package),
parses with lark's LALR parser keeping positions, maps every lark error to a
``Diagnostic`` with a span, and lowers the tree with ``placement_logic.frontend.lower``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from . import surface
from .files import packaged
from .lark_import import Lark, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from .lower import Lower

# Readable names for the grammar's terminals, used in "expected ..." messages.
TERMINAL_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "UNIT": "a byte unit",
    "COMP_OP": "a comparison",
    "STAR": "'*'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COMMA": "','",
    "COLON": "':'",
    "EQUAL": "'='",
    "DOT": "'.'",
    "AT": "'@'",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "SLASH": "'/'",
    "CIRCUMFLEX": "'^'",
    "$END": "end of file",
}


def grammar_text() -> str:
    """The grammar shipped in the installed package, or the source tree's copy."""
    here = Path(__file__).resolve()
    for path in (here.parents[1] / "grammar" / "placement.lark", here.parents[2] / "grammar" / "placement.lark"):
        if path.is_file():  # the package's folder on disk, or the source tree
            return path.read_text(encoding="utf-8")
    return packaged("grammar", "placement.lark").read_text(encoding="utf-8")  # a package not on disk (a zip)


def _cache_file(text: str) -> str | bool:
    """Where lark keeps the compiled parser between runs: a file in the user's cache folder
    named by the grammar's hash and lark's version (lark re-checks both when it reads it), or
    no cache when that folder cannot be made."""
    import hashlib
    import os

    import lark

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "placement-logic"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return str(base / f"grammar-{digest}-lark{lark.__version__}.cache")


def build_parser(cache: bool = True) -> Lark:
    """A fresh LALR parser of the grammar; with ``cache``, loaded from (and saved to) the user's
    cache folder. A parser loaded from the cache keeps its tables but not the grammar object
    (``Lark.grammar``), which grammar-driven generators need: build those with ``cache=False``."""
    text = grammar_text()
    return Lark(text, parser="lalr", lexer="contextual", propagate_positions=True,
                maybe_placeholders=True, cache=_cache_file(text) if cache else False)


@lru_cache(maxsize=1)
def parser() -> Lark:
    return build_parser()


def _describe_expected(expected) -> str:
    names = []
    for term in sorted(expected):
        if term.startswith("__ANON"):
            continue
        name = TERMINAL_NAMES.get(term)
        if name is None:
            name = f"'{term.lower()}'" if term.isupper() and term.isalpha() else term
        if name not in names:
            names.append(name)
    if not names:
        return ""
    if len(names) > 6:
        names = names[:6] + ["..."]
    return "; expected " + ", ".join(names)


def _keyword_terminals() -> dict[str, str]:
    return {t.name: t.pattern.value for t in parser().terminals if t.pattern.type == "str"}


def _token_text(tok) -> str:
    if tok.type == "$END":
        return "end of file"
    return f"'{tok}'"


def _error_to_diagnostic(exc: UnexpectedInput, text: str, file: str) -> Diagnostic:
    line = getattr(exc, "line", 1) or 1
    column = getattr(exc, "column", 1) or 1
    if isinstance(exc, UnexpectedCharacters):
        ch = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        span = Span.point(file, line, column)
        if ch == '"':
            return Diagnostic(Code.UNTERMINATED_STRING, "unterminated string: no closing '\"' on this line", span)
        return Diagnostic(Code.UNEXPECTED_CHARACTER, f"unexpected character {ch!r}", span)
    if isinstance(exc, UnexpectedEOF):
        lines = text.splitlines() or [""]
        return Diagnostic(Code.UNEXPECTED_END, "unexpected end of file" + _describe_expected(exc.expected),
                          Span.point(file, len(lines), len(lines[-1]) + 1))
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        expected = _describe_expected(exc.expected)
        if tok.type == "$END":
            lines = text.splitlines() or [""]
            opened = _unclosed_brace(text)
            msg = "unexpected end of file" + expected
            notes = ()
            if opened:
                msg = "unterminated block: '{' is never closed"
                notes = (f"the block opened at line {opened[0]}, column {opened[1]}",)
            return Diagnostic(Code.UNEXPECTED_END, msg, Span.point(file, len(lines), len(lines[-1]) + 1), notes=notes)
        width = len(str(tok)) or 1
        span = Span(file, tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + width)
        notes: tuple[str, ...] = ()
        if str(tok) in TOP_LEVEL and tok.column == 1:
            # a top-level keyword inside a block: most likely a '{' above was never closed
            before = "".join(text.splitlines(keepends=True)[:tok.line - 1])
            opened = _unclosed_brace(before)
            if opened:
                notes = (f"the block opened at line {opened[0]}, column {opened[1]} is still open: "
                         "is its '}' missing?",)
        return Diagnostic(Code.UNEXPECTED_TOKEN, f"unexpected {_token_text(tok)}" + expected, span, notes=notes)
    return Diagnostic(Code.UNEXPECTED_TOKEN, str(exc).splitlines()[0], Span.point(file, line, column))


TOP_LEVEL = ("model", "mesh", "plan", "strategy", "let", "import", "from", "assert", "claim")


def _unclosed_brace(text: str) -> tuple[int, int] | None:
    """Line and column of the innermost '{' left open, ignoring comments and strings."""
    stack = []
    line, col = 1, 0
    in_comment = in_string = False
    for ch in text:
        col += 1
        if ch == "\n":
            line, col = line + 1, 0
            in_comment = in_string = False
            continue
        if in_comment:
            continue
        if in_string:
            in_string = ch != '"'
            continue
        if ch == "#":
            in_comment = True
        elif ch == '"':
            in_string = True
        elif ch == "{":
            stack.append((line, col))
        elif ch == "}" and stack:
            stack.pop()
    return stack[-1] if stack else None


def parse(text: str, file: str = "<string>") -> surface.Module:
    """Parse and lower one source file; raise DiagnosticError on any error."""
    try:
        tree = parser().parse(text)
    except RecursionError:
        raise DiagnosticError([Diagnostic(Code.TOO_DEEP, "nested too deeply to read", Span.point(file, 1, 1))],
                              {file: text}) from None
    except UnexpectedInput as exc:
        raise DiagnosticError([_error_to_diagnostic(exc, text, file)], {file: text}) from None
    try:
        return Lower(file).transform(tree)
    except RecursionError:
        raise DiagnosticError([Diagnostic(Code.TOO_DEEP, "nested too deeply to read", Span.point(file, 1, 1))],
                              {file: text}) from None
    except VisitError as exc:
        if isinstance(exc.orig_exc, DiagnosticError):
            raise DiagnosticError(exc.orig_exc.diagnostics, {file: text}) from None
        if isinstance(exc.orig_exc, RecursionError):
            raise DiagnosticError([Diagnostic(Code.TOO_DEEP, "nested too deeply to read", Span.point(file, 1, 1))],
                                  {file: text}) from None
        raise


def parse_pieces(text: str, file: str = "<string>") -> surface.Module:
    """``parse(text, file)``, each top-level piece of the text (from a line that starts a
    top-level item at its first column to the next such line) parsed once per (text, line) in
    the process: the specs a search writes share their model block, their imports and much of
    their mesh, each at one of a few lines. The text is first split where a line starts with a
    top-level keyword; a piece that does not parse alone (a split inside a block) gives the
    whole text's parse, so the module and any diagnostic are ``parse``'s."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if i == 0 or line.split(" ", 1)[0].split("{", 1)[0] in TOP_LEVEL]
    items: list = []
    try:
        for a, b in zip(starts, starts[1:] + [len(lines)]):
            items += _piece("".join(lines[a:b]), a, file)
    except DiagnosticError:
        return parse(text, file)
    return surface.Module(tuple(items), file=file)


@lru_cache(maxsize=1024)
def _piece(piece: str, line: int, file: str) -> tuple:
    """The items of one piece of a file starting at 0-based ``line`` (spans as in the whole file)."""
    return parse("\n" * line + piece, file).items
