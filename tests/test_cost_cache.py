"""The result cache of `placement cost`: a hit prints exactly what a fresh derivation prints;
an edit to the spec, to an imported module or to an option is a miss; an unwritable cache
folder or PLACEMENT_NO_CACHE means no cache, never an error."""

from __future__ import annotations

import io
from pathlib import Path

from placement_logic.cli import main
from placement_logic.commands import cache

SPEC = """from layouts import mine
model { params = 1e9 }
mesh { dp = 8 }
plan p { dp: mine }
"""


def run(args):
    out, err = io.StringIO(), io.StringIO()
    status = main(args, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def setup(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.delenv("PLACEMENT_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "layouts.place").write_text("strategy mine = data(S*, S, S, R)\n")
    spec = tmp_path / "main.place"
    spec.write_text(SPEC)
    return spec


def test_a_hit_prints_what_a_fresh_derivation_prints(tmp_path, monkeypatch):
    spec = setup(tmp_path, monkeypatch)
    first = run(["cost", str(spec)])
    assert list((tmp_path / "cache").rglob("*.json")), "the result was not stored"
    second = run(["cost", str(spec)])
    fresh = run(["cost", str(spec), "--no-cache"])
    assert first == second == fresh
    assert first[0] == 0 and "memory" in first[1]


def test_an_edited_import_or_option_is_a_miss(tmp_path, monkeypatch):
    spec = setup(tmp_path, monkeypatch)
    before = run(["cost", str(spec)])[1]
    (tmp_path / "layouts.place").write_text("strategy mine = data(R, R, R, R)\n")
    after = run(["cost", str(spec)])[1]
    assert before != after
    assert run(["cost", str(spec), "--format", "json"])[1].lstrip().startswith("{")
    assert run(["cost", str(spec), "--set", "dp=16"])[1] != after


def test_no_cache_when_the_folder_cannot_be_written(tmp_path, monkeypatch):
    spec = setup(tmp_path, monkeypatch)
    (tmp_path / "cache").write_text("a file where the folder should be")
    status, out, err = run(["cost", str(spec)])
    assert status == 0 and out and not err


def test_the_environment_turns_it_off(tmp_path, monkeypatch):
    spec = setup(tmp_path, monkeypatch)
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    run(["cost", str(spec)])
    assert not (tmp_path / "cache").exists()
    assert not cache.enabled()
