"""Every shipped example parses, resolves, is canonically formatted, and matches its
golden IR summary."""

from __future__ import annotations

import io

import pytest
from corpus import ALL_EXAMPLES, EXAMPLES, GOLDEN, LIBRARY_EXAMPLES, ROOT, example_id
from golden import check_golden

from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import library_index, load_spec
from placement_logic.ir import STATES

IDS = [example_id(p) for p in ALL_EXAMPLES]


@pytest.mark.parametrize("path", ALL_EXAMPLES, ids=IDS)
def test_example_is_canonically_formatted(path):
    text = path.read_text()
    assert format_source(text, str(path)) == text


@pytest.mark.parametrize("path", ALL_EXAMPLES, ids=IDS)
def test_example_ir_summary_matches_golden(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    rel = path.relative_to(ROOT)
    out, err = io.StringIO(), io.StringIO()
    status = main(["inspect", str(rel)], out=out, err=err)
    assert (status, err.getvalue()) == (0, "")
    check_golden(GOLDEN / "inspect" / f"{example_id(path)}.txt", out.getvalue())


@pytest.mark.parametrize("path", ALL_EXAMPLES, ids=IDS)
def test_example_plans_place_every_state_on_every_axis(path):
    spec = load_spec(path)
    assert spec.plans, "every example defines at least one plan"
    for plan in spec.plans:
        assert [p.state for p in plan.placements] == list(STATES)
        for placement in plan.placements:
            assert [a for a, _ in placement.modes] == list(plan.mesh.names)
        bound = [a for b in plan.bindings for a in b.axes]
        assert sorted(bound) == sorted(plan.mesh.names)


def test_every_library_strategy_has_an_example():
    strategies = {s for names in library_index().values() for s in names}
    examples = {p.stem for p in LIBRARY_EXAMPLES}
    assert strategies <= examples, f"library strategies without an example: {sorted(strategies - examples)}"


def test_required_examples_exist():
    for name in ("zero_paper", "llama70b_3d", "zeropp", "mixtral_4d"):
        assert (EXAMPLES / f"{name}.place").exists()


def test_messy_input_formats_to_golden():
    src = (GOLDEN / "fmt" / "messy.place").read_text()
    check_golden(GOLDEN / "fmt" / "messy.expected.place", format_source(src, "messy.place"))


def test_fmt_check_exit_status(tmp_path):
    messy = tmp_path / "m.place"
    messy.write_text((GOLDEN / "fmt" / "messy.place").read_text())
    out, err = io.StringIO(), io.StringIO()
    assert main(["fmt", "--check", str(messy)], out=out, err=err) == 1
    assert "not formatted" in err.getvalue()
    assert out.getvalue().startswith("---")
    assert main(["fmt", "--write", str(messy)], out=io.StringIO(), err=io.StringIO()) == 0
    assert main(["fmt", "--check", str(messy)], out=io.StringIO(), err=io.StringIO()) == 0
