"""The quick tier's sample of a sweep (tests/conftest.py ``SAMPLED``): which cases it keeps, and that
every sweep it names is a parametrised test that exists."""

import ast
import re
from pathlib import Path

import conftest
import pytest

ROOT = Path(__file__).resolve().parent.parent


class _Item:
    def __init__(self, nodeid: str):
        self.nodeid = nodeid


def test_first_of_each_kind_and_every_stride_th_case_are_kept(monkeypatch):
    sweep = "tests/test_x.py::test_sweep"
    monkeypatch.setitem(conftest.SAMPLED, sweep, r"\d+")
    monkeypatch.setattr(conftest, "STRIDE", 3)
    ids = ["a0-True", "a1-True", "a2-False", "a3-True", "a4-True", "a5-True", "a6-False", "a7-True"]
    items = [_Item(f"{sweep}[{i}]") for i in ids] + [_Item("tests/test_x.py::test_other[a1-True]"),
                                                    _Item("tests/test_x.py::test_plain")]
    out = [it.nodeid for it in conftest.sampled_out(items)]
    # kept, by hand: index 0, 3, 6 (every third), and index 2 (the first of kind a-False)
    assert out == [f"{sweep}[{i}]" for i in ("a1-True", "a4-True", "a5-True", "a7-True")]
    assert conftest.sampled_out(items) == conftest.sampled_out(items)  # the same sample every time


def test_a_kind_pattern_groups_named_cases(monkeypatch):
    sweep = "tests/test_x.py::test_scope"
    monkeypatch.setitem(conftest.SAMPLED, sweep, r"_.*")
    monkeypatch.setattr(conftest, "STRIDE", 10)
    ids = ["global_a", "global_b", "micro_a", "micro_b", "seq_a"]
    out = [it.nodeid for it in conftest.sampled_out([_Item(f"{sweep}[{i}]") for i in ids])]
    assert out == [f"{sweep}[global_b]", f"{sweep}[micro_b]"]


@pytest.mark.parametrize("sweep", sorted(conftest.SAMPLED))
def test_every_sampled_sweep_is_a_parametrised_test(sweep):
    path, name = sweep.split("::")
    tree = ast.parse((ROOT / path).read_text())
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(fn) == 1, f"{sweep}: no such test"
    assert any("parametrize" in ast.unparse(d) for d in fn[0].decorator_list), f"{sweep}: not parametrised"
    re.compile(conftest.SAMPLED[sweep])


def test_every_measured_slow_test_exists_and_leaves_its_module_a_quick_test():
    """Each entry of tests/slow_measured.txt names a test function of its module (a parametrised case by
    its id), and no module is left with every test of it in the slow tier by that file."""
    by_module: dict[str, set[str]] = {}
    trees: dict[str, ast.Module] = {}
    defined: dict[str, set[str]] = {}
    for nodeid in conftest.MEASURED:
        path, _, rest = nodeid.partition("::")
        name = rest.split("[")[0]
        if path not in trees:
            trees[path] = ast.parse((ROOT / path).read_text())
            defined[path] = {n.name for n in ast.walk(trees[path]) if isinstance(n, ast.FunctionDef)}
        names = defined[path]
        assert name in names, f"{nodeid}: no such test"
        by_module.setdefault(path, set()).add(name)
    for path in by_module:
        tree = trees[path]
        tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
        whole = {nodeid.split("::")[1] for nodeid in conftest.SLOW if nodeid.startswith(path + "::")
                 and "[" not in nodeid}
        assert tests - whole, f"{path}: every test is in the slow tier"
