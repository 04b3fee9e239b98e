"""Atomic file output: text or bytes in (whole, or streamed into ``open_atomic``), a file that
is whole or unchanged out.

The data goes to a temporary file in the target's folder, is flushed to disk, and replaces
the target by one rename only when it is whole (keeping the mode of a file it replaces); a
failure leaves the target as it was and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, TextIO


def write_atomic(target: str | os.PathLike, data: str | bytes) -> None:
    """``data`` written to ``target`` whole or not at all (raises ``OSError``)."""
    with open_atomic(target, binary=isinstance(data, bytes)) as fh:
        fh.write(data)


class Discard(Exception):
    """Raised inside ``open_atomic`` to leave the target as it was, without an error."""


@contextlib.contextmanager
def open_atomic(target: str | os.PathLike, binary: bool = False) -> Iterator[TextIO]:
    """A file to stream into (UTF-8 text, or bytes): it replaces ``target`` when the block ends,
    whole; an exception in the block (``Discard`` among them, which is swallowed) leaves the
    target as it was and no temporary file behind. Raises ``OSError``."""
    path = Path(target)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8",
                       newline=None if binary else "") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # nothing was left behind
        if not isinstance(exc, Discard):
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
