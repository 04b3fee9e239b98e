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
