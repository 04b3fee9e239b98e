"""Files a command writes: atomically (``atomic.write_atomic``), and never over one of its
inputs.

Input: a target path, the text to write, and the paths the command read. Output: the file,
complete or not at all, or a located PL700. A target that is (after links are resolved) one
of the command's input files is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from ..atomic import open_atomic, write_atomic
from ..diagnostics import Code, Diagnostic, DiagnosticError
from .options import command_line_span


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (links resolved); False when either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def input_paths(args) -> tuple[str, ...]:
    """Every path-like argument of a parsed command line that names an existing file."""
    found: list[str] = []
    for name, value in vars(args).items():
        if name in ("output", "run", "command"):
            continue
        values = value if isinstance(value, (list, tuple)) else (value,)
        for v in values:
            if isinstance(v, (str, os.PathLike)) and str(v) and os.path.isfile(v):
                found.append(str(v))
    return tuple(found)


def refuse_inputs(target: str, inputs: Iterable[str], option: str = "-o") -> None:
    """A located PL700 when ``target`` names one of ``inputs``."""
    for path in inputs:
        if same_file(target, path):
            raise DiagnosticError([Diagnostic(
                Code.EXPORT_FAILED, f"{option} {target}: would replace the input file {path}; write the output elsewhere",
                command_line_span(f"{option} {target}"))])


def check_writable(target: str, option: str = "-o") -> None:
    """A located PL700 before any work when ``target`` cannot be written (its folder is
    missing or not writable, or it is a folder)."""
    path = Path(target)
    folder = path.parent if str(path.parent) else Path(".")
    why = None
    if path.is_dir():
        why = "it is a folder"
    elif not folder.is_dir():
        why = f"the folder {folder} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK):
        why = f"the folder {folder} is not writable"
    if why:
        raise DiagnosticError([Diagnostic(Code.EXPORT_FAILED, f"{option} {target}: cannot write: {why}",
                                          command_line_span(f"{option} {target}"))])


@contextlib.contextmanager
def streamed_output(target: str, option: str = "-o") -> Iterator[TextIO]:
    """``atomic.open_atomic`` with a failure to create, write or rename the file reported as a
    located PL700 (exit 2); an error of the command inside leaves the target as it was."""
    try:
        with open_atomic(target) as fh:
            yield _Checked(fh)
    except _WriteFailed as exc:
        raise _pl700(target, exc.error, option) from None
    except OSError as exc:
        raise _pl700(target, exc, option) from None


class _WriteFailed(BaseException):  # not an error of the command: passes its handlers by
    def __init__(self, error: OSError):
        self.error = error


class _Checked:
    """The file, its write failures told apart from the command's own errors (which are reported as
    the command's, not as a PL700)."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, s: str) -> int:
        try:
            return self.fh.write(s)
        except OSError as exc:
            raise _WriteFailed(exc) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as exc:
            raise _WriteFailed(exc) from None

    def isatty(self) -> bool:
        return False


def _pl700(target: str, exc: OSError, option: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.EXPORT_FAILED, f"{option} {target}: cannot write: {exc.strerror or exc}",
                                       command_line_span(f"{option} {target}"))])


def write_output(target: str, text: str, option: str = "-o") -> None:
    """``write_atomic`` with a failure reported as a located PL700 (exit 2)."""
    try:
        write_atomic(target, text)
    except OSError as exc:
        raise DiagnosticError([Diagnostic(Code.EXPORT_FAILED, f"{option} {target}: cannot write: {exc.strerror or exc}",
                                          command_line_span(f"{option} {target}"))]) from None
