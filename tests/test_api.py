"""The public API of ``placement_logic``: every function on a shipped example, the
documented examples of the package docstring, and a cheap import."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import placement_logic as pl

ROOT = Path(__file__).resolve().parent.parent


def test_all_names_exist():
    for name in pl.__all__:
        assert getattr(pl, name) is not None


def test_load_cost_and_check_a_shipped_example():
    spec = pl.load_spec(ROOT / "examples" / "zero_paper.place")
    report = pl.cost_report(spec)
    assert [p.name for p in report.plans] == [p.name for p in spec.plans]
    cost = pl.derive_costs(spec.plans[0])
    assert cost.memory is not None
    checked = pl.check_spec(pl.load_spec(ROOT / "examples" / "safe" / "zero3.place"))
    assert checked.verdict is pl.Verdict.PROVED and checked.exit_status == 0


def test_bad_input_raises_a_diagnostic_error():
    with pytest.raises(pl.DiagnosticError) as e:
        pl.load_string("mesh { dp = 8 }\nplan p { dp: zero4 }")
    assert e.value.diagnostics[0].code.startswith("PL")


def test_package_docstring_examples():
    failures, tests = doctest.testmod(pl)
    assert tests and not failures


def test_importing_the_package_is_cheap():
    code = ("import sys, placement_logic; "
            "heavy = [m for m in ('sympy', 'z3', 'cvc5', 'torch', 'lark') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_cheap_commands_import_no_solver():
    """`placement --version`, `fmt` and `inspect` import neither sympy nor z3."""
    code = ("import sys; from placement_logic.cli import main; import io; "
            "main(['fmt', 'examples/zero_paper.place'], out=io.StringIO(), err=io.StringIO()); "
            "main(['inspect', 'examples/zero_paper.place'], out=io.StringIO(), err=io.StringIO()); "
            "heavy = [m for m in ('sympy', 'z3', 'torch') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
