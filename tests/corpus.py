"""The shared corpus: every shipped example spec, by a readable id."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"


def example_files(subdir: str | None = None) -> list[Path]:
    base = EXAMPLES / subdir if subdir else EXAMPLES
    return sorted(base.rglob("*.place"))


def example_id(path: Path) -> str:
    return str(path.relative_to(EXAMPLES).with_suffix(""))


# Examples that model real bugs are expected to resolve; some purposely contain
# overrides. Every example must parse and resolve.
ALL_EXAMPLES = example_files()
LIBRARY_EXAMPLES = example_files("library")
