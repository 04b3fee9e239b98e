"""Atomic file output: text or bytes in, a file that is whole or unchanged out.

The data goes to a temporary file in the target's folder, is flushed to disk, and replaces
the target by one rename only when it is whole (keeping the mode of a file it replaces); a
failure leaves the target as it was and no temporary file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(target: str | os.PathLike, data: str | bytes) -> None:
    """``data`` written to ``target`` whole or not at all (raises ``OSError``)."""
    path = Path(target)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # nothing was left behind
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
