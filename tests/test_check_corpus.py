"""The checker on the generated mutation and equivalence corpus (tests/corpus/).

Every mutant (a correct library plan with one mutation) is refuted: each obligation its
`# expect:` line names is refuted, no gradient-integrity aspect it does not name is, and
its `# root:` obligation carries a counterexample that refutes again when re-run with its
sizes pinned. Every equivalent plan is proved for all mesh sizes
(but those its statements are read at: a K/V copy layout's, a list of rank sets'). A `# known-gap:` line
marks a file on which the checker departs from docs/semantics.md: its test is a strict
expected failure, so fixing the checker makes it pass and asks for the line's removal."""

from __future__ import annotations

import filecmp
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from corpus import ROOT

from placement_logic.check.report import Verdict
from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec

CORPUS = Path(__file__).resolve().parent / "corpus"
MUTANTS = sorted((CORPUS / "mutants").glob("*.place"))
EQUIVALENT = sorted((CORPUS / "equivalent").glob("*.place"))


def header(path: Path, key: str) -> str | None:
    m = re.search(rf"^# {key}: (.+)$", path.read_text(), re.M)
    return m.group(1).strip() if m else None


def cases(paths: list[Path]) -> list:
    out = []
    for p in paths:
        gap = header(p, "known-gap")
        marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
        out.append(pytest.param(p, id=p.stem, marks=marks))
    return out


def find(report, name: str):
    """The obligation called `name`, or the rule with that code."""
    hits = [o for o in report.obligations if o.name == name or o.condition == name]
    assert hits, f"no obligation named {name}"
    return hits[0]


def test_corpus_is_large_enough():
    assert len(MUTANTS) >= 80
    assert len(EQUIVALENT) >= 40


def test_corpus_is_generated_and_up_to_date(tmp_path):
    subprocess.run([sys.executable, str(CORPUS / "generate.py"), str(tmp_path)], check=True)
    for sub in ("mutants", "equivalent"):
        fresh = sorted(p.name for p in (tmp_path / sub).glob("*.place"))
        assert fresh == sorted(p.name for p in (CORPUS / sub).glob("*.place")), sub
        _, mismatch, errors = filecmp.cmpfiles(tmp_path / sub, CORPUS / sub, fresh, shallow=False)
        assert not mismatch and not errors, f"re-run tests/corpus/generate.py: {mismatch + errors}"


def test_every_mutant_names_its_expectations():
    for p in MUTANTS:
        expect, root = header(p, "expect"), header(p, "root")
        assert expect and root, p.name
        assert root in [x.strip() for x in expect.split(",")], p.name


@pytest.mark.slow
@pytest.mark.parametrize("path", cases(MUTANTS))
def test_mutant_is_refuted(path, monkeypatch):
    report = check_spec(load_spec(path), timeout=20)
    assert report.exit_status == 1
    wants = [x.strip() for x in header(path, "expect").split(",")]
    for want in wants:
        assert find(report, want).verdict is Verdict.REFUTED, want
    aspects = {w.split("] ", 1)[1] for w in wants if w.startswith("GI ") and "] " in w}
    for o in report.obligations:
        if o.condition == "gradient_integrity" and o.verdict is not Verdict.PROVED and "] " in o.name:
            assert o.name.split("] ", 1)[1] in aspects, (o.name, o.verdict)

    root = find(report, header(path, "root"))
    cex = root.counterexample
    assert cex is not None and cex.equation and cex.diagnosis
    argv = shlex.split(cex.command)
    assert argv[:2] == ["placement", "check"]
    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    assert main(argv[1:] + ["--format", "json"], out=out, err=err) == 1, err.getvalue()
    again = [o for p in json.loads(out.getvalue())["plans"] for o in p["obligations"] if o["name"] == root.name]
    assert again[0]["verdict"] == "refuted"
    assert again[0]["scope"].startswith("at ")


@pytest.mark.slow
@pytest.mark.parametrize("path", cases(EQUIVALENT))
def test_equivalent_is_proved_for_all_sizes(path):
    assert header(path, "equivalent to"), path.name
    report = check_spec(load_spec(path), timeout=20)
    for ob in report.obligations:
        assert ob.verdict is Verdict.PROVED, (ob.name, ob.reason)
        held = ", ".join(f"{a}={n}" for a, n in ob.fixed_sizes)  # sizes the statement is read at (test_check_scope)
        assert ob.scope == (f"all sizes with {held}" if held else "all mesh sizes"), ob.name
    assert report.exit_status == 0
