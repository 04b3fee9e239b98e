"""The tool's on-disk caches, content-addressed: an entry's name is the hash of everything its
content is a function of, and always includes the hash of the tool's own source, so an edited
tool never reads a stale entry.

Entries live in ``$XDG_CACHE_HOME/placement-logic/<kind>`` (default ``~/.cache``) as JSON (data
only, never code); a folder that cannot be written means no cache, never an error, and an
entry that cannot be read is a miss. ``PLACEMENT_NO_CACHE=1`` turns every cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path


def enabled(flag_off: bool = False) -> bool:
    return not flag_off and os.environ.get("PLACEMENT_NO_CACHE", "") in ("", "0")


def folder(kind: str = "results") -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "placement-logic" / kind


@lru_cache(maxsize=1)
def source_hash() -> str:
    """The hash of the tool's own source (its Python files, grammar and library modules)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".place", ".lark") and path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def read(kind: str, key: str):
    """The JSON value stored under ``key``, or ``None``."""
    try:
        return json.loads((folder(kind) / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write(kind: str, key: str, value) -> None:
    try:
        d = folder(kind)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(value), encoding="utf-8")
        tmp.replace(d / f"{key}.json")
    except OSError:
        pass
