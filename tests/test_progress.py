"""Progress on standard error: drawn only on a terminal, and piped output unchanged by it."""

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from placement_logic.cli import main

ROOT = Path(__file__).resolve().parent.parent
BUG = "examples/bugs/zero1_no_regather.place"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def run(argv, err):
    out = io.StringIO()
    code = main(argv, out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", [["check", BUG], ["prove", "--only", "none", "examples/zero_paper.place"]])
def test_a_terminal_gets_a_bar_and_the_report_is_the_same(argv, monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    code, piped_out, piped_err = run(argv, io.StringIO())
    code2, tty_out, tty_err = run(argv, Terminal())
    def timeless(text):  # prove prints solver times
        return re.sub(r"\d+\.\d+ s\b", "T s", text)

    assert code == code2 and timeless(piped_out) == timeless(tty_out)
    assert "\x1b" not in piped_err and "\r" not in piped_err
    assert argv[0] in tty_err and "\x1b" in tty_err  # the bar was drawn (and cleared: it is transient)


def test_a_dumb_terminal_gets_no_bar(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    _, _, err = run(["check", BUG], Terminal())
    assert err == ""


def test_piped_output_of_a_process_is_unchanged():
    """The command line through real pipes: no control characters on either stream."""
    res = subprocess.run([sys.executable, "-m", "placement_logic.cli", "check", BUG], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TERM": "xterm"})
    assert res.returncode == 1 and res.stderr == ""
    code, out, _ = run(["check", BUG], io.StringIO())
    assert res.stdout == out


def test_prove_reports_each_obligation_to_the_bar():
    from placement_logic.frontend.loader import load_spec
    from placement_logic.prove import prove

    ticks = []
    report, _ = prove([load_spec("examples/zero_paper.place")], timeout=20, only=(),
                      progress=lambda done, total, label: ticks.append((done, total, label)))
    keys = [r.key for r in report.results]
    assert [t for t in ticks if t[1] is not None] == [(i, len(keys), k) for i, k in enumerate(keys)]


def test_check_reports_each_plan_to_the_bar():
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_spec

    ticks = []
    spec = load_spec("examples/zero_paper.place")
    check_spec(spec, progress=lambda *t: ticks.append(t))
    assert ticks == [(i, len(spec.plans), p.name) for i, p in enumerate(spec.plans)]


def test_measure_reports_preparation_and_launch_to_the_bar():
    pytest.importorskip("torch")
    from placement_logic.frontend.loader import load_spec
    from placement_logic.measure.runner import LaunchError
    from placement_logic.measure.session import measure

    def failing(jobs, world):
        raise LaunchError("no launch in this test")

    ticks = []
    reports = measure(load_spec("examples/library/zero3.place"), ["zero3"], launcher=failing, with_checker=False,
                      progress=lambda *t: ticks.append(t))
    assert reports[0].outcome.value == "failed"
    assert ticks[0] == (0, 2, "preparing zero3") and ticks[-1][:2] == (2, 2)
    assert [d for d, _, _ in ticks] == sorted(d for d, _, _ in ticks)
