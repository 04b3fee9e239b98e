"""The command line: version, help, exit statuses, ``python -m`` entry point."""

from __future__ import annotations

import io
import subprocess
import sys

from corpus import ROOT

from placement_logic import __version__
from placement_logic.cli import main


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_version():
    status, out, _ = run("--version")
    assert status == 0
    assert out.strip() == f"placement-logic {__version__}"


def test_help_lists_commands_and_examples():
    status, out, _ = run("--help")
    assert status == 0
    for word in ("fmt", "inspect", "examples:", "exit status"):
        assert word in out


def test_no_command_prints_help_and_exits_2():
    status, out, _ = run()
    assert status == 2 and "usage:" in out


def test_unknown_option_is_a_usage_error():
    status, _, _ = run("fmt", "--frobnicate", "x.place")
    assert status == 2


def test_fmt_prints_canonical_text():
    status, out, err = run("fmt", str(ROOT / "examples" / "zero_paper.place"))
    assert status == 0 and err == ""
    assert out == (ROOT / "examples" / "zero_paper.place").read_text()


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "placement_logic", "--version"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.strip() == f"placement-logic {__version__}"


def test_diagnostic_from_python_dash_m_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.place"
    bad.write_text("mesh {\n  dp = 8 GB\n}\n")
    result = subprocess.run([sys.executable, "-m", "placement_logic", "inspect", str(bad)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{bad}:2:8: error: ")
    assert "[PL202]" in result.stderr and "Traceback" not in result.stderr


def test_output_file_stdin_and_quiet(tmp_path, monkeypatch, capsys):
    import io as _io
    from pathlib import Path

    from placement_logic.cli import main as run

    example = Path(__file__).resolve().parent.parent / "examples" / "zero_paper.place"
    target = tmp_path / "report.txt"
    assert run(["cost", str(example), "-o", str(target)]) == 0
    assert capsys.readouterr().out == "" and "plan dp: memory per device" in target.read_text()
    monkeypatch.setattr("sys.stdin", _io.TextIOWrapper(_io.BytesIO(example.read_bytes())))
    assert run(["cost", "-"]) == 0
    assert "plan zero3" in capsys.readouterr().out
    assert run(["check", str(example.parent / "bugs" / "grad_reduced_twice.place"), "--quiet"]) == 1
    assert capsys.readouterr().out == ""
    assert run(["cost", str(example), "-o", str(tmp_path / "no" / "such" / "dir.txt")]) == 2
    assert "[PL700]" in capsys.readouterr().err


def test_an_error_found_after_loading_shows_its_source_line_and_caret(tmp_path):
    # PL506 for a layout statement is found by the checker, after the spec has loaded: the diagnostic still
    # carries the line it points at and a caret under its column, with exit status 2
    text = (ROOT / "examples/safe/cp_zigzag_labels.place").read_text()
    lines = [ln for ln in text.splitlines() if "context_parallel" not in ln and not ln.strip().startswith("cp =")]
    spec = tmp_path / "no_cp.place"
    spec.write_text("\n".join(lines) + "\n")
    status, _, err = run("check", str(spec))
    assert status == 2 and "[PL506]" in err, err
    first = err.splitlines()
    at = next(i for i, ln in enumerate(first) if "[PL506]" in ln)
    line_no = int(first[at].split(":")[1])
    assert first[at + 1].strip().startswith(f"{line_no} |") and "override layout" in first[at + 1]
    assert "^" in first[at + 2]
