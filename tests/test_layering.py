"""Import rules of the pipeline: the IR knows nothing of lark, sympy or z3; renderers
know nothing of z3 or lark. Checked on the source, module by module."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pkgsource
import pytest

PKG = Path(__file__).resolve().parent.parent / "placement_logic"

RULES = {
    "frontend/surface.py": {"lark", "sympy", "z3", "torch"},
    "diagnostics.py": {"lark", "sympy", "z3", "torch"},
    "codes.py": {"lark", "sympy", "z3", "torch"},
    "snippets.py": {"lark", "sympy", "z3", "torch"},
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
    "interop": {"lark", "z3", "torch"},  # configurations in and out: text and the IR only
}


_tree = pkgsource.tree  # a source file's syntax tree, parsed once per process (none changes it)


def imported_roots(path: Path) -> set[str]:
    tree = _tree(path)
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
        tree = _tree(path)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
        assert not calls, f"{rel} calls print()"


def test_no_evaluation_of_user_text():
    for path in PKG.rglob("*.py"):
        tree = _tree(path)
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                name = getattr(n.func, "id", None) or getattr(n.func, "attr", None)
                assert name not in {"eval", "exec", "sympify", "parse_expr"}, f"{path} calls {name}"


def test_resolution_does_not_reach_back_into_loading():
    """The loader calls the resolver, never the reverse; every import is at module level."""
    for path in (PKG / "resolve").rglob("*.py"):
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not nested, f"{path.name}: import inside {node.name}()"
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                names = {a.name for a in node.names}
                assert not (target.endswith(("loader", "parser")) or names & {"loader", "parser"}), \
                    f"{path.name} imports {target}"


# --------------------------------------------------------------------------- stage order

# The pipeline's stages, lowest first. A module may import modules of its own stage or a
# lower one, never a higher one, at module level or inside a function; and the import graph
# has no cycle between modules (one package's modules may import each other, acyclically).
STAGES = (
    ("outcome", "codes", "spans", "diagnostics", "snippets", "hardware", "atomic", "cache"),
    ("ir",),
    ("frontend.surface", "frontend.lark_import", "frontend.lower", "frontend.parser", "frontend.canonical",
     "frontend.files", "frontend.hf", "frontend.configs"),
    ("resolve",),
    ("frontend.loader",),
    ("costs", "solver", "interop"),
    ("check", "costreport"),
    ("prove", "measure", "search", "trace", "calibrate"),
    ("commands", "cli", "__main__", "__init__"),
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
    return ".".join(parts)


def _stage(module: str) -> int:
    best = None
    for i, names in enumerate(STAGES):
        for n in names:
            if module == n or module.startswith(n + "."):
                if best is None or len(n) > best[1]:
                    best = (i, len(n))
    assert best is not None, f"{module} is in no stage"
    return best[0]


def _internal_imports(path: Path) -> set[str]:
    """Modules of the package this file imports, anywhere in the file."""
    mod = _module_name(path)
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    if mod == "__init__":
        pkg = []
    out = set()
    for node in _runtime_nodes(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else list(pkg)
                base = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("placement_logic"):
                base = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                candidate = ".".join(base + [alias.name])
                out.add(candidate if _exists(candidate) else ".".join(base))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("placement_logic."):
                    out.add(alias.name.split(".", 1)[1])
    return {m for m in out if m and _exists(m)}


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _exists(module: str) -> bool:
    p = PKG.joinpath(*module.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    return {m: set(deps) for m, deps in _graph_once().items()}  # a copy: a test may change it


@lru_cache(maxsize=1)
def _graph_once() -> dict[str, frozenset[str]]:
    return {_module_name(p): frozenset(_internal_imports(p)) for p in PKG.rglob("*.py")}


def test_no_upward_import():
    bad = [(m, d) for m, deps in _graph().items() for d in deps if _stage(d) > _stage(m)]
    assert not bad, bad


def test_no_import_cycle():
    graph = _graph()
    # a package's __init__ re-exporting its modules is not an edge back into the package
    for m in graph:
        graph[m] = {d for d in graph[m] if not (m.startswith(d + ".") and _is_package(d))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _is_package(module: str) -> bool:
    return (PKG.joinpath(*module.split(".")) / "__init__.py").exists()


def test_command_line_groups_match_the_prover():
    from placement_logic.commands import prove as command
    from placement_logic.prove import GROUPS

    assert command.GROUPS == GROUPS


def _imports_torch(path: Path) -> bool:
    """A module that imports torch when it is imported (a module-level ``import torch`` or ``from torch``),
    or imports such a module of its own package: without the torch extra it is never imported."""
    for n in _tree(path).body:
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch" and not n.level:
            return True
    return False


def _torch_modules() -> set[str]:
    """Every package module that needs torch to import, directly or through a module-level import of
    another package module that does."""
    mods = {".".join(("placement_logic",) + p.relative_to(PKG).with_suffix("").parts): p for p in PKG.rglob("*.py")}
    needs = {m for m, p in mods.items() if _imports_torch(p)}
    while True:
        more = set()
        for m, p in mods.items():
            if m in needs:
                continue
            pkg = m.rsplit(".", 1)[0] if not p.name == "__init__.py" else m
            for n in _tree(p).body:
                if isinstance(n, ast.ImportFrom) and n.level == 1:
                    names = [f"{pkg}.{n.module}"] if n.module else [f"{pkg}.{a.name}" for a in n.names]
                    if any(x in needs for x in names):
                        more.add(m)
        if not more:
            return needs
        needs |= more


def test_no_submodule_shadows_a_name_of_its_package():
    """Importing a submodule binds it as an attribute of its package: a submodule named like
    a function the package exports (``ir.walk``, ``placement_logic.check_spec``) would replace it."""
    import importlib
    import importlib.util
    import pkgutil

    import placement_logic

    torch = importlib.util.find_spec("torch") is not None
    torch_modules = _torch_modules()
    for info in pkgutil.walk_packages(placement_logic.__path__, "placement_logic."):
        if ".ranks" in info.name or info.name.endswith("__main__"):
            continue  # the rank processes' modules import torch; __main__ runs the command line
        if not torch and info.name in torch_modules:
            continue  # the traced ranks' recorder imports torch: without the extra it is never imported
        importlib.import_module(info.name)
    from placement_logic import ir

    assert callable(ir.walk) and callable(ir.show)
    for name in placement_logic.__all__:
        assert not isinstance(getattr(placement_logic, name), type(placement_logic)), name


# --------------------------------------------------------------------------- private names


def _subpackage(module: str) -> str:
    """The first-level package a module belongs to (a top-level module is its own)."""
    return module.split(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_across_packages(path: Path, tree: ast.AST) -> list[str]:
    """``from X import _name`` (and ``mod._name`` on a module so imported) where X lies in another
    first-level package of placement_logic than ``path``."""
    mod = _module_name(path)
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    if mod == "__init__":
        pkg = []
    own = _subpackage(mod)
    foreign: dict[str, str] = {}  # local name -> the module (or object) it names, in another package
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else list(pkg)
            base = base + (node.module.split(".") if node.module else [])
        elif node.module and node.module.startswith("placement_logic"):
            base = node.module.split(".")[1:]
        else:
            continue
        for alias in node.names:
            full = ".".join(base + [alias.name])
            if _subpackage(full) == own:
                continue
            if _private(alias.name):
                found.append(f"{mod}:{node.lineno}: from {'.'.join(base)} import {alias.name}")
            foreign[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in foreign \
                and _private(node.attr):
            found.append(f"{mod}:{node.lineno}: {foreign[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_crosses_a_package_boundary():
    found = [hit for p in sorted(PKG.rglob("*.py")) for hit in private_names_across_packages(p, _tree(p))]
    assert found == []


def test_the_private_name_scan_sees_both_forms():
    # a module of check/ taking a private name of ir/, both ways; one of its own package is fine
    src = ("from ..ir.groups import _mul\nfrom ..ir import folding\nfrom .dims import _own\n"
           "x = folding._role(1)\ny = folding.role_of(1)\n")
    found = private_names_across_packages(PKG / "check" / "steps.py", ast.parse(src))
    assert found == ["check.steps:1: from ir.groups import _mul", "check.steps:4: ir.folding._role"]
