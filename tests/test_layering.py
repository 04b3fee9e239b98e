"""Import rules of the pipeline: the IR knows nothing of lark, sympy or z3; renderers
know nothing of z3 or lark. Checked on the source, module by module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "placement_logic"

RULES = {
    "frontend/surface.py": {"lark", "sympy", "z3", "torch"},
    "diagnostics.py": {"lark", "sympy", "z3", "torch"},
    "frontend/canonical.py": {"lark", "sympy", "z3", "torch"},
    **{f"costreport/{m}.py": {"lark", "sympy", "z3", "torch"} for m in ("model", "units", "text", "markdown", "jsonout", "latex")},
    # report data and renderers of the checker, the proofs and the measurements
    **{f"{pkg}/{m}.py": {"lark", "sympy", "z3", "torch"}
       for pkg in ("check", "prove", "measure") for m in ("report", "render")},
}
# Whole packages with the same constraint (checked when present).
PACKAGE_RULES = {
    "ir": {"lark", "sympy", "z3", "torch"},
    "resolve": {"lark", "sympy", "z3", "torch"},
    "costreport": {"lark", "z3", "torch"},
    "costs": {"lark", "z3", "torch"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module,forbidden", sorted(RULES.items()))
def test_module_imports(module, forbidden):
    assert not imported_roots(PKG / module) & forbidden


@pytest.mark.parametrize("package,forbidden", sorted(PACKAGE_RULES.items()))
def test_package_imports(package, forbidden):
    root = PKG / package
    assert root.is_dir(), package
    for path in root.rglob("*.py"):
        assert not imported_roots(path) & forbidden, path


def test_only_the_cli_layer_prints():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] in ("commands",) or rel.name in ("cli.py", "__main__.py"):
            continue
        if "measure" in rel.parts and rel.name in ("worker.py", "validate.py"):
            continue  # measurement workers report through their own stdout pipe
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
        assert not calls, f"{rel} calls print()"


def test_no_evaluation_of_user_text():
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                name = getattr(n.func, "id", None) or getattr(n.func, "attr", None)
                assert name not in {"eval", "exec", "sympify", "parse_expr"}, f"{path} calls {name}"


def test_resolution_does_not_reach_back_into_loading():
    """The loader calls the resolver, never the reverse; every import is at module level."""
    for path in (PKG / "resolve").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not nested, f"{path.name}: import inside {node.name}()"
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                names = {a.name for a in node.names}
                assert not (target.endswith(("loader", "parser")) or names & {"loader", "parser"}), \
                    f"{path.name} imports {target}"
