"""Context of one resolution: the file being resolved -> the diagnostics found in it.

The one object every stage of the resolution reports to. It also carries the strategy
index of the shipped library, passed in by the caller, for "add this import" hints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..diagnostics import Diagnostic, DiagnosticError, Span

# Library module name -> names of the strategies it defines (computed on demand).
LibraryIndex = Callable[[], Mapping[str, tuple[str, ...]]]


@dataclass
class Context:
    """Collects the diagnostics of one module's resolution."""

    file: str
    library_index: LibraryIndex
    diags: list[Diagnostic] = field(default_factory=list)
    base_dir: object = None  # the folder relative paths in the module are read from (a Path, or None: cwd)
    sources: dict = field(default_factory=dict)  # other files read (a model's config.json): name -> text

    def error(self, code: str, message: str, span: Span, notes: tuple[str, ...] = ()) -> None:
        self.diags.append(Diagnostic(code, message, span, notes=notes))

    def mark(self) -> int:
        """A point to compare against with ``failed_since``."""
        return len(self.diags)

    def failed_since(self, mark: int) -> bool:
        return len(self.diags) > mark

    def raise_errors(self) -> None:
        """Raise every diagnostic found so far, in source order; nothing if there is none."""
        if self.diags:
            raise DiagnosticError(sorted(self.diags, key=lambda d: (d.span.line, d.span.column)), self.sources)
