"""Odd and hostile input: a located diagnostic and the documented exit status, never a
traceback, a hang or a silent wrong verdict."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.solver.backends import _comment

ROOT = Path(__file__).resolve().parent.parent
BUG = ROOT / "examples" / "bugs" / "grad_reduced_twice.place"


@pytest.mark.parametrize("newline,bom", [("\r", False), ("\r\n", False), ("\r\n", True), ("\n", True)])
def test_every_line_ending_reads_alike(tmp_path, capsys, newline, bom):
    text = BUG.read_text().replace("\n", newline)
    f = tmp_path / "bug.place"
    f.write_bytes((("\ufeff" if bom else "") + text).encode())
    assert main(["check", str(f)]) == 1  # still refuted, not read as one line
    out = capsys.readouterr().out
    assert "refuted" in out
    assert main(["fmt", str(f)]) in (0, 1)
    formatted = capsys.readouterr().out
    assert formatted.strip() and "plan" in formatted  # fmt keeps the code


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_is_not_read(capsys):
    assert main(["cost", "/dev/zero"]) == 2
    assert "[PL006]" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_not_opened(tmp_path, capsys):
    fifo = tmp_path / "spec.place"
    os.mkfifo(fifo)
    assert main(["cost", str(fifo)]) == 2  # refused before opening: no hang
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e300", "abc"])
def test_time_limits_are_finite_and_positive(capsys, value):
    assert main(["prove", "--only", "none", "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert "[PL500]" in err and "Traceback" not in err


@pytest.mark.parametrize("let,words", [("2 - 2", "not 0"), ("3/2", "not 3/2"), ("1 - 3", "not -2")])
def test_axis_sizes_through_a_let_are_checked(tmp_path, capsys, let, words):
    f = tmp_path / "s.place"
    f.write_text(f"from std.data import ddp\nlet n = {let}\nmodel {{ params = 1e9 }}\nmesh {{ dp = n }}\n"
                 "plan p { dp: ddp }\n")
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL107]" in err and words in err and "s.place:4:8" in err


def test_a_zero_divisor_through_a_let_is_an_error(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("from std.data import ddp\nlet z = 1 - 1\nmodel { params = 1e9 }\nmesh { dp = 4 }\n"
                 "plan p { dp: ddp override grads: divide by z }\n")
    assert main(["check", str(f)]) == 2
    assert "[PL204]" in capsys.readouterr().err


def test_checking_a_spec_without_plans_is_not_a_proof(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("model { params = 1e9 }\n")
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "nothing to check" in err and "PROVED" not in err


def test_smt_comments_cannot_be_broken_out_of():
    assert "\n" not in _comment("a.place\n(assert false)\r(check-sat)")
    assert _comment("plain text") == "plain text"


def test_prove_without_cvc5_says_so_and_uses_z3(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cvc5" else real(name, *a))
    assert main(["prove", "--only", "none"]) == 0
    captured = capsys.readouterr()
    assert "cvc5 is not installed" in captured.err and "pip install '.[proofs]' in a clone" in captured.err
    assert "Traceback" not in captured.err


def test_every_unbound_symbol_a_note_names_can_be_set(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("from std.data import zero3\nmodel {\n  transformer { hidden = 64  layers = 2  heads = 4  vocab = 128 }\n"
                 "}\nmesh { dp = 8 }\nplan p { dp: zero3 }\n")
    assert main(["cost", str(f)]) == 0
    assert "unbound symbols (give them with --set or in the spec): b, s" in capsys.readouterr().out
    assert main(["cost", str(f), "--set", "s=128", "--set", "b=2"]) == 0
    assert "unbound symbols" not in capsys.readouterr().out


def test_an_unclosed_brace_is_named_where_it_was_opened(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("from std.data import ddp\nmodel {\n  params = 1e9\n\nmesh { dp = 8 }\nplan p { dp: ddp }\n")
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert "s.place:5:1" in err and "the block opened at line 2, column 7 is still open" in err


def test_a_sympy_call_past_its_budget_is_out_of_time_not_a_hang():
    """The call is interrupted (a sleep that ran to its end would return, not raise)."""
    import time

    from placement_logic.costs.budget import OutOfTime, bounded

    with pytest.raises(OutOfTime):
        bounded(lambda: time.sleep(5), seconds=0.2)
    assert bounded(lambda: 41 + 1, seconds=1) == 42


@pytest.mark.parametrize("flag,value", [("--devices", "1000000"), ("--devices", "0"), ("--steps", "-1")])
def test_measure_counts_are_bounded_before_anything_starts(capsys, flag, value):
    assert main(["measure", str(ROOT / "examples" / "library" / "ddp.place"), "--plan", "ddp", flag, value]) == 2
    assert "[PL301]" in capsys.readouterr().err


def test_a_config_path_with_a_nul_byte_is_a_diagnostic(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text('model from "\x00" { }\n')
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL006]" in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--set", "dp=1e999999999"], ["--set", "psi=1e999999999"],
                                   ["--set", "psi=-1e999999999"], ["--set", "psi=1/1e999999999"]])
def test_huge_exponents_on_the_command_line_are_refused_at_once(flags, capsys):
    """Refused by the exponent bound before any number is built (building 10**999999999 alone takes minutes;
    a hang here is what the fuzz test's per-case limit reports)."""
    assert main(["cost", str(ROOT / "examples" / "zero_paper.place"), *flags]) == 2
    assert "[PL301]" in capsys.readouterr().err


def test_command_line_numbers_read_as_the_language_reads_them():
    from fractions import Fraction

    from placement_logic.commands.options import exact_number, parse_timeout

    assert exact_number("7.5e9") == 7500000000 and exact_number("1/3") == Fraction(1, 3)
    assert exact_number("-2.5") == Fraction(-5, 2) and exact_number("1e400") == 10**400
    for bad in ("1e401", "1e999999999", "nan", "inf", "-inf", "1/0", "--1", "0x10", "", "1/", "abc"):
        with pytest.raises(ValueError):
            exact_number(bad)
    with pytest.raises(Exception, match="expected a positive number of seconds"):
        parse_timeout("1e999999999")


def test_compare_without_plans_is_pl118(tmp_path, capsys):
    f = tmp_path / "empty.place"
    f.write_text("let x = 1\n")
    assert main(["compare", str(f)]) == 2
    assert "nothing to compare: the spec defines no plan [PL118]" in capsys.readouterr().err


def test_json_of_a_fraction_beyond_a_double(tmp_path, capsys):
    import json

    f = tmp_path / "big.place"
    f.write_text("assert 1e-9 KB - 10e300 GiB == 3 B\n")
    assert main(["cost", str(f), "--format", "json"]) == 1
    left = json.loads(capsys.readouterr().out)["questions"][0]["left"]
    assert left["value"] is None  # -10^301·2^30 + 10^-6 is no double
    from fractions import Fraction

    assert Fraction(left["exact"]) == Fraction(1, 10**6) - 10**301 * 2**30


def test_inspect_of_a_let_beyond_a_double(tmp_path, capsys):
    import json

    f = tmp_path / "big.place"
    f.write_text("let x = 10e350 / 3\nlet y = 1 / 4\n")
    assert main(["inspect", str(f)]) == 0
    assert "x = 10" in capsys.readouterr().out
    assert main(["inspect", str(f), "--format", "json"]) == 0
    b = json.loads(capsys.readouterr().out)["bindings"]
    assert b["x"]["value"] is None and b["x"]["exact"] == str(10**351) + "/3"
    assert b["y"]["value"] == 0.25 and b["y"]["exact"] == "1/4"


def test_a_bug_pinned_at_a_million_devices_is_unknown_not_a_hang(capsys):
    """dp pinned to 10^6: the solver's witness keeps that size, so it cannot be replayed: every
    obligation it finds broken is unknown at once, saying why, and nothing is refuted unreplayed."""
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_spec
    from placement_logic.outcome import Verdict

    spec = load_spec(str(Path(__file__).resolve().parent.parent / "examples" / "bugs" / "dp_mean_of_means.place"))
    report = check_spec(spec, pinned={"dp": 10**6}).plans[0]
    verdicts = {o.verdict for o in report.obligations}
    assert Verdict.REFUTED not in verdicts and Verdict.UNKNOWN in verdicts
    assert all("too large to replay concretely" in o.reason for o in report.obligations
               if o.verdict is Verdict.UNKNOWN)


@pytest.mark.parametrize("sep", ["\r", "\x0c", "\x85", "\u2028", "\u2029", "\x0b", "\x1c"])
def test_fmt_splits_lines_where_the_parser_does(sep):
    """A line separator other than LF inside a string literal, before a '#': the comment scanner
    reads one line, as the parser does, so formatting is idempotent and repeats nothing."""
    from placement_logic.frontend.canonical import format_source

    src = f'let x = 1\nassert "a{sep}b # c": x == 1  # kept\n'
    once = format_source(src, "f.place")
    assert format_source(once, "f.place") == once
    assert once.count('# c"') == 1 and once.count("# kept") == 1


@pytest.mark.parametrize("size, code", [("2^99999999", "PL203"), ("0", "PL107"), ("1/2", "PL107"), ("nowhere", "PL101")])
def test_a_bad_axis_size_is_one_error_not_a_cascade(tmp_path, capsys, size, code):
    # the axis keeps existing after its size is refused: the plans that bind it report nothing more
    spec = tmp_path / "s.place"
    spec.write_text("from std.data import ddp\nmodel {\n  params = 1e9\n}\nmesh {\n"
                    f"  dp = {size}\n}}\nplan p {{\n  dp: ddp\n  params: {{dp: R}}\n}}\n")
    assert main(["cost", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"[{code}]" in err and ":6:" in err, err
