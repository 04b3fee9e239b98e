"""Golden-file comparison; set PLACEMENT_UPDATE_GOLDEN=1 to rewrite the files."""

from __future__ import annotations

import os
from pathlib import Path


def check_golden(path: Path, actual: str) -> None:
    if os.environ.get("PLACEMENT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    assert path.exists(), f"missing golden file {path}; run with PLACEMENT_UPDATE_GOLDEN=1"
    expected = path.read_text()
    assert actual == expected, f"output differs from {path}"
