"""Source spans: where a diagnostic, an obligation or a statement is in a file (or on the command line).

``Span`` is a region of one file, 1-based, ends exclusive; ``NO_SPAN`` stands for a built-in place and
``Span.located`` tells a place in a file from the command line. ``Severity`` grades a diagnostic. Imports
nothing of the package (``diagnostics`` re-exports every name here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True, order=True)
class Span:
    """A region of one source file; lines and columns are 1-based, ends exclusive."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int
    # A command-line error's option text (``--set dp=0``); its columns count within it.
    text: str = field(default="", compare=False)

    @property
    def located(self) -> bool:
        """Whether the span is a place in a file (not the command line, not built in)."""
        return self.file not in UNLOCATED

    @staticmethod
    def point(file: str, line: int, column: int, width: int = 1) -> "Span":
        return Span(file, line, column, line, column + max(width, 1))

    def cover(self, other: "Span") -> "Span":
        start = min((self.line, self.column), (other.line, other.column))
        end = max((self.end_line, self.end_column), (other.end_line, other.end_column))
        return Span(self.file, start[0], start[1], end[0], end[1])


COMMAND_LINE = "<command line>"
BUILTIN = "<builtin>"
UNLOCATED = (COMMAND_LINE, BUILTIN)
NO_SPAN = Span(BUILTIN, 1, 1, 1, 2)
