"""The package's source files as syntax trees, each parsed once per test process and shared by the
tests that read the source (tests/test_layering.py, tests/test_vocabularies.py, tests/test_check_layers.py):
parsing all of ``placement_logic`` takes about a second. No test changes a tree."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "placement_logic"


@lru_cache(maxsize=None)
def tree(path: Path) -> ast.Module:
    """A source file's syntax tree."""
    return ast.parse(Path(path).read_text())
