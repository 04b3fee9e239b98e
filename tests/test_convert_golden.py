"""Golden files for configurations in and out: the block `placement import hf` prints for every
shipped config, and what `placement export` prints for every library plan in each framework
(the configuration, or the list of what the framework cannot express).
Set PLACEMENT_UPDATE_GOLDEN=1 to rewrite them after an intended change."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from golden import check_golden

from placement_logic.cli import main

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
HF = sorted(p for p in (ROOT / "tests" / "data" / "hf").glob("*.json")
            if p.stem not in ("unknown_family", "missing_key", "bad_value"))
LIBRARY = sorted((ROOT / "examples" / "library").glob("*.place"))


def _run(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return f"exit: {status}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}"


@pytest.mark.parametrize("config", HF, ids=[p.stem for p in HF])
def test_imported_block_matches_golden(config, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = _run(["import", "hf", str(config.relative_to(ROOT))])
    check_golden(GOLDEN / "import" / f"{config.stem}.txt", text)


@pytest.mark.parametrize("framework", ["deepspeed", "megatron", "torchtitan"])
@pytest.mark.parametrize("spec", LIBRARY, ids=[p.stem for p in LIBRARY])
def test_library_export_matches_golden(spec, framework, monkeypatch):
    from placement_logic.frontend.loader import load_spec

    monkeypatch.chdir(ROOT)
    rel = spec.relative_to(ROOT)
    plans = [p.name for p in load_spec(rel).plans]
    text = "".join(_run(["export", framework, str(rel), "--plan", name]) for name in plans)
    assert "Traceback" not in text
    check_golden(GOLDEN / "export" / framework / f"{spec.stem}.txt", text)
