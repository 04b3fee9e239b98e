"""Checker layering and documentation: only the encoding and the session touch z3;
report data and renderers know nothing of z3 or lark; every rule code, PL5xx code and
bug spec is documented."""

from __future__ import annotations

import ast
from pathlib import Path

import pkgsource
import pytest
from corpus import ROOT, example_files

from placement_logic.check.rules import RULES
from placement_logic.diagnostics import CODES

CHECK = ROOT / "placement_logic" / "check"
SOLVER_MODULES = {"encode.py", "encode_time.py", "encode_partial.py", "encode_buckets.py", "encode_rankupdate.py",
                  "encode_subgroups.py", "encode_ranksets.py", "encode_cplayout.py", "encode_cpwindow.py", "encode_amax.py", "encode_scalerstate.py", "encode_cpshort.py", "encode_rankclips.py", "encode_ulysses_heads.py", "encode_capacity.py", "encode_cplayout_packs.py", "encode_auxstats.py", "encode_rankcount.py", "encode_rankproduct.py", "encode_ignored.py", "encode_ignored_loss.py", "encode_auxcells.py", "encode_rankcount_multi.py", "encode_amax_blocks.py", "encode_termranks.py", "encode_normeps.py", "encode_normsets.py", "encode_cpchunk.py", "encode_capdrop.py", "encode_mtpstage.py",
                  "encode_rankproduct_axes.py", "encode_shapefacts.py", "encode_norm.py", "session.py", "run.py",
                  "obligations.py"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(pkgsource.tree(path)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(CHECK.glob("*.py")), ids=lambda p: p.name)
def test_only_solver_modules_import_z3(path):
    roots = imported_roots(path)
    assert "lark" not in roots and "sympy" not in roots
    if path.name not in SOLVER_MODULES:
        assert "z3" not in roots, f"{path.name} imports z3"


def test_command_module_does_not_import_z3():
    assert "z3" not in imported_roots(ROOT / "placement_logic" / "commands" / "check.py")


def test_every_rule_is_documented():
    doc = (ROOT / "docs" / "checker.md").read_text()
    for code, rule in RULES.items():
        assert f"`{code}` | {rule.name}" in doc


def test_every_bug_spec_is_in_the_catalogue_table():
    doc = (ROOT / "docs" / "checker.md").read_text()
    for path in example_files("bugs"):
        assert f"`{path.stem}`" in doc, path.stem


def test_checker_codes_are_registered_and_documented():
    doc = (ROOT / "docs" / "diagnostics.md").read_text()
    for code in ("PL500", "PL501", "PL502", "PL503", "PL504"):
        assert code in CODES
        assert f"`{code}` {CODES[code][0]}" in doc
