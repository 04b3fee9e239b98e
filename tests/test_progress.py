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


SEARCH = ["search", "examples/library/ddp.place", "--device", "h100_sxm", "--devices", "8", "--global-batch", "16",
          "--seq", "1024", "--tp", "1,2", "--pp", "1", "--microbatch", "1", "--recompute", "none",
          "--strategies", "ddp,zero3", "--top", "2"]


def test_search_draws_a_bar_on_a_terminal_and_the_report_is_the_same(monkeypatch):
    pytest.importorskip("numpy")
    monkeypatch.setenv("TERM", "xterm-256color")
    code, piped_out, piped_err = run(SEARCH, io.StringIO())
    code2, tty_out, tty_err = run(SEARCH, Terminal())
    def timeless(text):  # search prints its own time
        return re.sub(r"\d+\.\d+ s\b", "T s", text)

    assert code == code2 == 0 and timeless(piped_out) == timeless(tty_out)
    assert piped_err == "" and "search" in tty_err and "\x1b" in tty_err


@pytest.mark.parametrize("argv", [SEARCH, ["check", BUG]])
def test_quiet_draws_no_bar(argv, monkeypatch):
    if argv[0] == "search":
        pytest.importorskip("numpy")
    monkeypatch.setenv("TERM", "xterm-256color")
    _, out, err = run([*argv, "--quiet"], Terminal())
    assert out == "" and err == ""


def test_search_reports_each_structure_and_row_to_the_bar():
    pytest.importorskip("numpy")
    from placement_logic import search

    space = search.Space(devices=8, global_batch=16, seq=1024, device="h100_sxm", tp=(1, 2), pp=(1,), microbatch=(1,),
                         chunks=(2,), strategies=("ddp", "zero3"), recompute=("none",))
    ticks = []
    result = search.run("examples/library/ddp.place", space, top=2, check=False,
                        progress=lambda *t: ticks.append(t))
    structures = result.structures
    assert [d for d, _, _ in ticks] == list(range(structures + len(result.ranked) + 1))
    assert ticks[-1][:2] == (structures + len(result.ranked),) * 2
    assert all(label.startswith("deriving ") for _, _, label in ticks[:structures])
    # re-derived in step-time order, then ranked (the ties by robustness, search.by_robustness)
    assert sorted(label for _, _, label in ticks[structures:-1]) == sorted("re-deriving " + c.label()
                                                                           for c in result.ranked)
