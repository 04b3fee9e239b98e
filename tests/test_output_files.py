"""Output files and crashes: `-o` never replaces an input, never leaves a truncated or
partial file, and an internal error has an exit status of its own (never a verdict's)."""

from __future__ import annotations

import importlib
import io
import os
from pathlib import Path

import pytest

from placement_logic.cli import COMMANDS, main
from placement_logic.outcome import Exit

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "zero_paper.place"


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    return main(argv, out, err), out.getvalue(), err.getvalue()


def test_output_naming_the_input_is_refused(tmp_path):
    spec = tmp_path / "s.place"
    spec.write_text(EXAMPLE.read_text())
    before = spec.read_bytes()
    status, _, err = _run(["cost", str(spec), "-o", str(spec)])
    assert status == 2 and "[PL700]" in err and "would replace the input file" in err
    assert spec.read_bytes() == before


def test_output_naming_the_input_through_a_link_is_refused(tmp_path):
    spec = tmp_path / "s.place"
    spec.write_text(EXAMPLE.read_text())
    link = tmp_path / "link.txt"
    link.symlink_to(spec)
    before = spec.read_bytes()
    status, _, err = _run(["check", str(spec), "-o", str(link)])
    assert status == 2 and "[PL700]" in err
    assert spec.read_bytes() == before and link.is_symlink()


def test_failed_run_leaves_the_target_as_it_was(tmp_path):
    target = tmp_path / "report.txt"
    target.write_text("yesterday's report\n")
    bad = tmp_path / "bad.place"
    bad.write_text("mesh { dp = 0 }\n")
    status, _, err = _run(["cost", str(bad), "-o", str(target)])
    assert status == 2 and "[PL" in err
    assert target.read_text() == "yesterday's report\n"
    fresh = tmp_path / "fresh.txt"
    assert _run(["cost", str(bad), "-o", str(fresh)])[0] == 2
    assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.place", "report.txt"]


def test_successful_output_replaces_whole_and_keeps_mode(tmp_path):
    target = tmp_path / "report.txt"
    target.write_text("x" * 100_000)
    os.chmod(target, 0o640)
    status, out, _ = _run(["cost", str(EXAMPLE), "-o", str(target)])
    assert status == 0 and out == ""
    text = target.read_text()
    assert text.startswith(f"{EXAMPLE}") or "plan" in text.splitlines()[0] or "memory" in text
    assert "x" * 10 not in text
    assert (target.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["report.txt"]  # no temporary file left


def test_refuted_report_is_still_written(tmp_path):
    target = tmp_path / "verdict.txt"
    bug = ROOT / "examples" / "bugs" / "grad_reduced_twice.place"
    status, _, _ = _run(["check", str(bug), "-o", str(target)])
    assert status == 1 and "REFUTED" in target.read_text()


def test_fmt_may_rewrite_its_input(tmp_path):
    spec = tmp_path / "s.place"
    spec.write_text(EXAMPLE.read_text().replace("plan zero1 {", "plan    zero1   {"))
    status, _, _ = _run(["fmt", "--write", str(spec)])
    assert status == 0 and "plan zero1 {" in spec.read_text() and "plan    zero1" not in spec.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["s.place"]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "convert"])
def test_internal_error_has_its_own_status(command, monkeypatch, tmp_path):
    """Each command, forced to fail inside: exit 70, one line naming a crash report, no traceback
    on the console, and the report file holds the traceback."""
    try:
        mod = importlib.import_module(f"placement_logic.commands.{command}")
    except ModuleNotFoundError:
        pytest.skip(f"{command} is not installed")

    def boom(args, out, err):
        raise ZeroDivisionError("forced")

    monkeypatch.setattr(mod, "run", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    argv = {"prove": ["prove"],
            "search": ["search", str(ROOT / "examples" / "models" / "llama3_8b.place"), "--device", "h100_sxm",
                       "--devices", "8", "--global-batch", "64", "--seq", "4096"],
            "measure": ["measure", str(EXAMPLE), "--plan", "dp"],
            "trace": ["trace", "--nproc", "2", "--", "python", str(EXAMPLE)], "lift": ["lift", str(EXAMPLE)],
            "export": ["export", "deepspeed", str(EXAMPLE), "--plan", "dp"], "calibrate": ["calibrate", "--quick"]}.get(command, [command, str(EXAMPLE)])
    status, out, err = _run(argv)
    assert "usage" not in err, err
    assert status == int(Exit.INTERNAL) == 70
    assert "internal error (ZeroDivisionError)" in err and "Traceback" not in err + out
    reports = list(tmp_path.glob("placement-crash-*.txt"))
    assert len(reports) == 1 and "ZeroDivisionError: forced" in reports[0].read_text()


def test_internal_error_is_not_a_verdict_status():
    assert int(Exit.INTERNAL) not in {int(e) for e in Exit if e is not Exit.INTERNAL}


def test_unwritable_targets_are_refused_before_the_work(tmp_path):
    missing = tmp_path / "no" / "such" / "report.txt"
    status, _, err = _run(["check", str(ROOT / "examples" / "library" / "zero3.place"), "-o", str(missing)])
    assert status == 2 and "[PL700]" in err and "does not exist" in err and not missing.parent.exists()
    status, _, err = _run(["cost", str(EXAMPLE), "--set", "dp=2..4", "--plot", str(tmp_path / "no" / "p.png")])
    assert status == 2 and "[PL700]" in err and "--plot" in err
    status, _, err = _run(["cost", str(EXAMPLE), "--set", "dp=2..4", "--plot", str(EXAMPLE)])
    assert status == 2 and "[PL700]" in err and "would replace the input" in err


def test_imported_model_path_is_relative_to_the_written_spec(tmp_path, monkeypatch):
    """`import deepspeed --model cfg.json -o out/x.place`: the spec reads `model from` relative to
    its own folder, so the path written is the config's path from there, and the spec loads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text((ROOT / "examples" / "configs" / "llama3_8b.json").read_text())
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    (tmp_path / "out").mkdir()
    status, _, err = _run(["import", "deepspeed", "ds.json", "--devices", "8", "--model", "cfg/config.json",
                           "-o", "out/x.place"])
    assert status == 0, err
    text = (tmp_path / "out" / "x.place").read_text()
    assert 'model from "../cfg/config.json"' in text
    monkeypatch.chdir(ROOT)
    assert _run(["cost", str(tmp_path / "out" / "x.place")])[0] == 0


@pytest.mark.parametrize("name", ["a b", "x-y", "1st", ""])
def test_lift_refuses_a_plan_name_that_would_not_parse(name):
    status, out, err = _run(["lift", str(ROOT / "tests" / "data" / "traces" / "ddp_summed.json"), "--plan-name", name])
    assert status == 2 and "[PL301]" in err and out == ""
