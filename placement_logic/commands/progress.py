"""Progress of long work on standard error: a rich progress bar on a terminal, nothing otherwise.

Input: the error stream and the environment. Output: a ``Progress`` whose ``tick(done, total,
label)`` the long loops call (``prove``'s obligations, ``check``'s plans, ``measure``'s plans
and launches, ``search``'s structures and re-derived rows). The bar is drawn only when the
error stream is a terminal (and ``TERM`` is not ``dumb``) and the command is not ``--quiet``;
it is transient, so it leaves nothing behind, and piped or redirected output is byte for
byte what it is without it.
"""

from __future__ import annotations

import os
from typing import TextIO


def wanted(err: TextIO) -> bool:
    """Draw a bar: the error stream is a terminal and the terminal can redraw a line."""
    isatty = getattr(err, "isatty", None)
    return bool(isatty is not None and isatty()) and os.environ.get("TERM", "") != "dumb"


class Progress:
    """A transient bar on ``err`` (when ``wanted`` and not ``quiet``), driven by ``tick``; a
    context manager."""

    def __init__(self, err: TextIO, what: str, quiet: bool = False):
        self.err, self.what, self.quiet = err, what, quiet
        self.bar = None
        self.task = None

    def __enter__(self) -> Progress:
        if not self.quiet and wanted(self.err):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            console = Console(file=self.err, stderr=True)
            self.bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("{task.fields[label]}", style="dim"),
                           console=console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=None, label="")
        return self

    def tick(self, done: int, total: int, label: str = "") -> None:
        """``done`` of ``total`` finished; ``label`` names what runs now."""
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total, label=label)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
