"""Every command's --help, run: it exits 0, names the command, says what the command does, and
gives every option a help text (an option without one is an option nobody can learn)."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from placement_logic.cli import build_parser, main

PARSER = build_parser()
SUB = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
NAMES = sorted(set(SUB.choices))


def _help(*words: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        code = main([*words, "--help"], out, io.StringIO())
    except SystemExit as exc:  # argparse's help action exits
        code = exc.code or 0
    return code, out.getvalue()


def test_the_top_level_help_lists_every_command():
    r = subprocess.run([sys.executable, "-m", "placement_logic", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert all(name in r.stdout for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_command_help_runs_and_documents_every_option(name, capsys):
    code, out = _help(name)
    out += capsys.readouterr().out
    assert code == 0, out
    assert out.startswith(f"usage: placement {name}"), out[:200]
    parser = SUB.choices[name]
    assert (parser.description or "").strip(), f"{name}: no description"
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert (action.help or "").strip(), f"{name} {action.option_strings}: no help text"
            assert any(o in out for o in action.option_strings), (name, action.option_strings)


def test_help_says_what_the_commands_now_do(capsys):
    _, out = _help("cost")
    out += capsys.readouterr().out
    assert "--symbolic" in out
    _, out = _help("search")
    out += capsys.readouterr().out
    assert "--plot" in out and "--reserve" in out and "--width" in out
    for name in NAMES:  # no help names a package on a public index the project does not publish
        _, out = _help(name)
        out += capsys.readouterr().out
        assert "placement-logic[" not in out, name
