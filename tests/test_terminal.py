"""Text sized to the terminal: --width, $COLUMNS, a terminal's own size; colour only on a
terminal and never with $NO_COLOR; piped output plain and 120 columns wide."""

from __future__ import annotations

import io
import re

from placement_logic.cli import main

EXAMPLE = "examples/zero_paper.place"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(argv, out=None, env=None, monkeypatch=None):
    out = out if out is not None else io.StringIO()
    if monkeypatch is not None:
        for k, v in (env or {}).items():
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, v)
    status = main(argv, out=out, err=io.StringIO())
    return status, out.getvalue()


def _widest(text: str) -> int:
    return max(len(ANSI.sub("", line)) for line in text.splitlines())


def test_piped_output_is_plain_and_120_columns(monkeypatch):
    status, text = _run(["cost", EXAMPLE, "--no-cache"], env={"COLUMNS": None}, monkeypatch=monkeypatch)
    assert status == 0 and not ANSI.search(text)
    assert _widest(text) <= 120


def test_width_flag_and_columns_fit_80(monkeypatch):
    for argv, env in ((["--width", "80"], {"COLUMNS": None}), ([], {"COLUMNS": "80"})):
        status, text = _run(["cost", EXAMPLE, "--no-cache", *argv], env=env, monkeypatch=monkeypatch)
        assert status == 0
        assert _widest(text.split("model:")[1].split("\n", 1)[1]) <= 80


def test_colour_on_a_terminal_unless_no_color(monkeypatch):
    status, text = _run(["cost", EXAMPLE, "--no-cache"], out=Terminal(), env={"NO_COLOR": None, "COLUMNS": None},
                        monkeypatch=monkeypatch)
    assert ANSI.search(text) and "holds" in ANSI.sub("", text)
    status, text = _run(["cost", EXAMPLE, "--no-cache"], out=Terminal(), env={"NO_COLOR": "1"},
                        monkeypatch=monkeypatch)
    assert not ANSI.search(text)


def test_a_too_narrow_width_is_a_usage_error(capsys):
    assert main(["cost", EXAMPLE, "--width", "10"]) == 2
    assert "[PL301]" in capsys.readouterr().err


def test_check_lines_wrap_to_the_width_asked_for(monkeypatch):
    argv = ["check", "examples/bugs/grad_reduced_twice.place"]
    status, piped = _run(argv, env={"COLUMNS": None}, monkeypatch=monkeypatch)
    assert status == 1 and _widest(piped) > 80  # a pipe keeps lines whole
    status, narrow = _run(argv + ["--width", "80"], monkeypatch=monkeypatch)
    assert status == 1 and _widest(narrow) <= 80
    assert " ".join(narrow.split()) == " ".join(piped.split())  # the same words, wrapped
