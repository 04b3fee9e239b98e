"""Reading source files: only regular files of bounded size, every line ending alike.

Input: a path (or text). Output: the text, UTF-8 decoded, a leading BOM dropped and CRLF or
a lone CR read as LF; a device, a FIFO, a directory or a file over ``MAX_SOURCE_BYTES`` is a
PL006 diagnostic, refused before it is opened so reading cannot block.
"""

from __future__ import annotations

import stat
from pathlib import Path

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span

MAX_SOURCE_BYTES = 8 * 1024 * 1024  # a spec larger than this is not a spec


def packaged(*parts: str):
    """A file or folder shipped inside the package (``packaged("stdlib")``): its path where the
    package is a folder on disk, as ``importlib.resources.files`` gives it there, without
    importing ``importlib.resources`` (about 0.02 s CPU of a cold start with its first
    ``files``); elsewhere (a zip) ``importlib.resources``' view of it."""
    path = Path(__file__).resolve().parents[1].joinpath(*parts)
    if path.exists():
        return path
    from importlib import resources

    return resources.files("placement_logic").joinpath(*parts)


def normalise_text(text: str) -> str:
    """Every line-ending convention (LF, CRLF, a lone CR) read alike, a leading BOM dropped."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_regular(p: Path) -> bytes:
    """The bytes of a regular file of at most MAX_SOURCE_BYTES; OSError otherwise (a device,
    a FIFO or a directory is refused before it is opened, so reading cannot block)."""
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):
        raise OSError(0, "not a regular file")
    if st.st_size > MAX_SOURCE_BYTES:
        raise OSError(0, f"larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB")
    with open(p, "rb") as fh:
        data = fh.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise OSError(0, f"larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB")
    return data


def read_source(path: str | Path) -> str:
    """The text of a source file, or of standard input when the path is ``-``."""
    if str(path) == "-":
        import sys

        data = sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1) if hasattr(sys.stdin, "buffer") else \
            sys.stdin.read().encode("utf-8")
        if len(data) > MAX_SOURCE_BYTES:
            raise DiagnosticError([Diagnostic(Code.UNREADABLE_FILE, "standard input is larger than 8 MiB",
                                              Span.point("<stdin>", 1, 1))])
        try:
            return normalise_text(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DiagnosticError([Diagnostic(Code.UNREADABLE_FILE, f"not UTF-8 text (byte {exc.start})",
                                              Span.point("<stdin>", 1, 1))]) from None
    p = Path(path)
    try:
        data = read_regular(p)
    except ValueError:  # a name the operating system cannot take (a NUL byte)
        raise DiagnosticError([Diagnostic(Code.UNREADABLE_FILE, "cannot read file: the name is not a valid path",
                                          Span.point(str(path).replace("\x00", "\\x00"), 1, 1))]) from None
    except OSError as exc:
        raise DiagnosticError([Diagnostic(Code.UNREADABLE_FILE, f"cannot read file: {exc.strerror or exc}",
                                          Span.point(str(path), 1, 1))]) from None
    try:
        return normalise_text(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DiagnosticError([Diagnostic(Code.UNREADABLE_FILE, f"not UTF-8 text (byte {exc.start})",
                                          Span.point(str(path), 1, 1))]) from None


