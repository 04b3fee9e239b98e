"""A result cache for commands whose output is a pure function of their inputs (as mypy
caches): the text of the spec and of every module it imports, the command's options, and
the tool itself (its version and the hash of its own source files, so an edited tool never
reads a stale entry).

Entries live in ``$XDG_CACHE_HOME/placement-logic/results`` (default ``~/.cache``); a
folder that cannot be written means no cache, never an error. ``PLACEMENT_NO_CACHE=1`` or a
command's ``--no-cache`` turns it off. The storage is ``placement_logic.cache``'s, which the
search's compiled structures share.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from .. import __version__
from .. import cache as store
from ..cache import enabled, folder

__all__ = ["enabled", "folder", "get", "key", "put", "tool_hash"]


@lru_cache(maxsize=1)
def tool_hash() -> str:
    """The hash of the tool's version and its own source."""
    return hashlib.sha256((__version__ + store.source_hash()).encode()).hexdigest()


def key(command: str, sources: dict[str, str], options: dict) -> str:
    h = hashlib.sha256(tool_hash().encode())
    h.update(command.encode())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    for name in sorted(sources):
        h.update(name.encode() + b"\\0" + sources[name].encode("utf-8") + b"\\0")
    return h.hexdigest()


def get(k: str) -> tuple[str, int] | None:
    data = store.read("results", k)
    try:
        return data["out"], int(data["status"])
    except (KeyError, TypeError, ValueError):
        return None


def put(k: str, out: str, status: int) -> None:
    store.write("results", k, {"out": out, "status": status})


class Recorder:
    """A stream that passes what is written on to ``out`` and keeps a copy for the cache while it
    is at most ``limit`` characters (a longer output, a large sweep's, is not cached: ``text`` is
    None then, and memory does not grow with it)."""

    def __init__(self, out, limit: int = 1 << 22):
        self.out = out
        self.limit = limit
        self._parts: list[str] | None = []
        self._size = 0

    def write(self, s: str) -> int:
        self.out.write(s)
        if self._parts is not None:
            self._size += len(s)
            if self._size > self.limit:
                self._parts = None
            else:
                self._parts.append(s)
        return len(s)

    def isatty(self) -> bool:
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty())

    @property
    def text(self) -> str | None:
        return None if self._parts is None else "".join(self._parts)
