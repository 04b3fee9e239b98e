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


def test_reports_render_themselves_in_a_notebook():
    """Jupyter calls _repr_latex_ / _repr_markdown_: a cost report shows its equations, a check
    report its verdict table, each the same text the command line's renderer gives."""
    from placement_logic.check.render import markdown

    spec = pl.load_spec(ROOT / "examples" / "bugs" / "sp_layernorm_grads.place")
    checked = pl.check_spec(spec)
    md = checked._repr_markdown_()
    assert md == markdown(checked) and "refuted" in md
    latex = pl.cost_report(pl.load_spec(ROOT / "examples" / "zero_paper.place"))._repr_latex_()
    assert latex.startswith("$$\\begin{aligned}") and "M_{\\mathrm{params}} = 2 \\cdot \\Psi" in latex


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


def test_cost_imports_only_what_it_prints():
    """A first `placement cost` (no result cache) on a spec without hardware or claims imports no
    solver, no numpy or jsonschema, no step-time model and no other renderer. (The hardware
    catalogue is plain data, ~2 ms, imported with the resolver so that every import stays at
    module level.)"""
    code = ("import sys, io, os; os.environ['PLACEMENT_NO_CACHE'] = '1'; from placement_logic.cli import main; "
            "assert main(['cost', 'examples/llama70b_3d.place'], out=io.StringIO(), err=io.StringIO()) == 0; "
            "heavy = [m for m in ('z3', 'cvc5', 'torch', 'numpy', 'jsonschema', 'placement_logic.costs.steptime', "
            "'placement_logic.costreport.jsonout', 'placement_logic.costreport.markdown') "
            "if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_configs_in_and_plans_out_from_python():
    """A notebook goes from configs to a spec object, its costs, and back to a framework config."""
    from pathlib import Path

    import placement_logic as pl

    data = Path(__file__).resolve().parent / "data"
    assert pl.import_hf(data / "hf" / "gpt2.json").model.transformer.layers.value == 12
    spec = pl.import_deepspeed({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}, 8,
                               params=10**9)
    assert pl.cost_report(spec).plans[0].device["params"].exact == 4 * 10**9 // 8  # fp32: no bf16 section
    meg = pl.import_megatron((data / "frameworks" / "megatron_llama70b.args").read_text(), 256)
    args, problems = pl.export_plan(meg, "megatron", "megatron")
    assert "--tensor-model-parallel-size" in args and not problems
    titan = pl.import_torchtitan(data / "frameworks" / "torchtitan_llama3_8b.toml", 64, params=8 * 10**9)
    toml_text, problems = pl.export_plan(titan, "torchtitan", "torchtitan")
    assert "data_parallel_shard_degree = 8" in toml_text and not problems
