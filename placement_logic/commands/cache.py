"""A result cache for commands whose output is a pure function of their inputs (as mypy
caches): the text of the spec and of every module it imports, the command's options, and
the tool itself (its version and the hash of its own source files, so an edited tool never
reads a stale entry).

Entries live in ``$XDG_CACHE_HOME/placement-logic/results`` (default ``~/.cache``); a
folder that cannot be written means no cache, never an error. ``PLACEMENT_NO_CACHE=1`` or a
command's ``--no-cache`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from .. import __version__


def enabled(flag_off: bool = False) -> bool:
    return not flag_off and os.environ.get("PLACEMENT_NO_CACHE", "") in ("", "0")


def folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "placement-logic" / "results"


@lru_cache(maxsize=1)
def tool_hash() -> str:
    """The hash of the tool's own source (its Python files, grammar and library modules)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(__version__.encode())
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".place", ".lark") and path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def key(command: str, sources: dict[str, str], options: dict) -> str:
    h = hashlib.sha256(tool_hash().encode())
    h.update(command.encode())
    h.update(json.dumps(options, sort_keys=True, default=str).encode())
    for name in sorted(sources):
        h.update(name.encode() + b"\\0" + sources[name].encode("utf-8") + b"\\0")
    return h.hexdigest()


def get(k: str) -> tuple[str, int] | None:
    try:
        data = json.loads((folder() / f"{k}.json").read_text(encoding="utf-8"))
        return data["out"], int(data["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def put(k: str, out: str, status: int) -> None:
    try:
        d = folder()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"out": out, "status": status}), encoding="utf-8")
        tmp.replace(d / f"{k}.json")
    except OSError:
        pass


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
