"""Writes the checker's mutation and equivalence corpus: base plans from the library,
one mutation each (`mutants/`), or restated in an equivalent form (`equivalent/`).

    python tests/corpus/generate.py [OUTDIR]

OUTDIR defaults to this file's directory. The output is deterministic; the test suite
re-generates it into a temporary directory and compares. Every mutant's `# expect:` and
`# root:` lines come from what its mutation operator breaks according to the step
semantics (docs/semantics.md), not from the checker's output. A `# known-gap:` line marks
a file the checker is known to get wrong (KNOWN_GAPS); its test is an expected failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the sections (gen/__init__.py imports them in file order: each registers its mutants and equivalents)
import gen  # noqa: E402, F401
from gen.c00_bases import HERE, MUTANTS  # noqa: E402
from gen.c03_equivalents import EQUIVALENTS  # noqa: E402

# ---------------------------------------------------------------------------------------


def files() -> dict[str, str]:
    out = {}
    for m in MUTANTS:
        out[f"mutants/{m.name}.place"] = m.text()
    for e in EQUIVALENTS:
        out[f"equivalent/{e.name}.place"] = e.text()
    assert len(out) == len(MUTANTS) + len(EQUIVALENTS), "duplicate names"
    return out


def write(outdir: Path) -> None:
    for sub in ("mutants", "equivalent"):
        (outdir / sub).mkdir(parents=True, exist_ok=True)
        for old in (outdir / sub).glob("*.place"):
            old.unlink()
    for rel, text in files().items():
        (outdir / rel).write_text(text)


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
