"""A diagnostic as the user reads it: its one-line form, the source line under it with a caret run
under the span, and its notes.

Input: a ``Diagnostic`` and the text of the file it points into (or nothing). Output: the text the
command line prints for it.
"""

from __future__ import annotations

from .diagnostics import COMMAND_LINE, Diagnostic

SNIPPET_WIDTH = 120  # characters of a source line shown; a longer line is shown as a window
SNIPPET_CONTEXT = 40  # characters shown before the span in such a window


def snippet(diag: Diagnostic, source: str | None) -> str:
    """The offending source line with a caret run under the span (empty if unknown)."""
    s = diag.span
    if s.file == COMMAND_LINE and s.text:
        source = s.text
    if source is None or (not s.located and not s.text):
        return ""
    lines = source.splitlines()
    if not (1 <= s.line <= len(lines)):
        if s.line == len(lines) + 1:
            lines.append("")
        else:
            return ""
    text = lines[s.line - 1].expandtabs(1)
    end = s.end_column if s.end_line == s.line else len(text) + 1
    width = max(1, end - s.column)
    column = s.column
    if len(text) > SNIPPET_WIDTH:
        # a long line (minified JSON, a generated spec) is shown as a window around the span
        first = max(0, min(s.column - 1 - SNIPPET_CONTEXT, len(text) - SNIPPET_WIDTH))
        last = first + SNIPPET_WIDTH
        lead = "…" if first > 0 else ""
        text = lead + text[first:last] + ("…" if last < len(text) else "")
        column = s.column - first + len(lead)
        width = max(1, min(width, SNIPPET_WIDTH - (s.column - 1 - first)))
    gutter = f"{s.line:>4} | " if s.located else "     | "
    caret = " " * (len(gutter) - 2) + "| " + " " * (column - 1) + "^" + "~" * (width - 1)
    return f"{gutter}{text}\n{caret}"


def render(diag: Diagnostic, source: str | None = None) -> str:
    parts = [diag.one_line()]
    snip = snippet(diag, source)
    if snip:
        parts.append(snip)
    parts.extend(f"     = note: {n}" for n in diag.notes)
    return "\n".join(parts)
