"""``placement cost`` / ``compare`` on every example, every format; symbolic walker and LaTeX."""

import io
import json
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic import ir
from placement_logic.cli import main
from placement_logic.costreport.units import both
from placement_logic.costs.symbolic import latex, symbol, to_sympy

EXAMPLES = sorted(str(p) for p in Path("examples").rglob("*.place"))
FORMATS = ("text", "markdown", "json", "latex")


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_every_example_reports(path):
    code, out, err = run("cost", path, "--format", "json")
    assert code in (0, 1, 3), err
    data = json.loads(out)
    assert data["schema_version"] == 2 and data["exit_status"] == code
    for plan in data["plans"]:
        for row in ("params", "optimizer", "grads", "activations", "transient", "total"):
            q = plan["memory"]["device"][row]
            assert set(q) >= {"bytes", "exact", "formula", "latex"}
            if q["exact"] is not None:
                assert Fraction(q["exact"]) >= 0
        assert "total" in plan["memory"]["host"]
        assert set(plan["communication"]["total"]) >= {"bytes_per_device", "volume", "formula"}
        for c in plan["communication"]["collectives"]:
            assert set(c) >= {"kind", "state", "axis", "phase", "count", "bytes_per_device", "volume"}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", [p for p in EXAMPLES if "library" not in p], ids=lambda p: Path(p).stem)
def test_formats_and_compare(path, fmt):
    for cmd in ("cost", "compare"):
        code, out, err = run(cmd, path, "--format", fmt)
        assert code in (0, 1, 3) and out, err
        if fmt == "latex":
            check_latex(out)


def check_latex(text):
    check_balanced(text)
    assert text.count(r"\toprule") == text.count(r"\bottomrule") == 1


def check_balanced(text):
    depth = 0
    for ch in re.sub(r"\\[{}]", "", text):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    stack = []
    for kind, env in re.findall(r"\\(begin|end)\{([^}]*)\}", text):
        if kind == "begin":
            stack.append(env)
        else:
            assert stack.pop() == env
    assert not stack


def test_latex_compiles_when_pdflatex_present(tmp_path):
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed")
    code, out, _ = run("compare", "examples/zero_paper.place", "--format", "latex")
    (tmp_path / "r.tex").write_text(out)
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "r.tex"], cwd=tmp_path, capture_output=True)
    assert res.returncode == 0


def test_set_rebinds_and_bad_set_is_pl301():
    code, out, _ = run("cost", "examples/zero_paper.place", "--plan", "dp", "--set", "psi=70e9", "--format", "json")
    assert json.loads(out)["plans"][0]["memory"]["device"]["total"]["bytes"] == 1120 * 10**9
    for bad in ("psy=3", "psi", "dp=2.5", "psi=abc"):
        code, out, err = run("cost", "examples/zero_paper.place", "--set", bad)
        assert code == 2 and "[PL301]" in err, bad


def test_unknown_plan_is_pl302():
    code, _, err = run("cost", "examples/zero_paper.place", "--plan", "zero4")
    assert code == 2 and "[PL302]" in err


def test_failing_assert_exits_1_and_shows_the_deciding_value(tmp_path):
    code, out, _ = run("cost", "examples/zero_paper.place", "--set", "dp=8")
    assert code == 1  # ZeRO-3 model state at N = 8 is 15 GB > 2 GB
    assert "fails" in out and "15000000000" in out


def test_compare_ratios_to_baseline():
    code, out, _ = run("compare", "examples/zero_paper.place", "--baseline", "dp", "--format", "json")
    r = {p["plan"]: p["ratios"] for p in json.loads(out)["plans"]}
    assert r["zero3"]["volume.total"]["exact"] == "3/2"
    assert r["zero3"]["memory.total"]["exact"] == "1/64"
    assert r["zero1"]["comm.total"]["exact"] == "1"


def test_walker_is_iterative_and_exact():
    v: ir.Value = ir.Sym("x")
    for _i in range(5000):
        v = ir.Op("+", (v, ir.Const(Fraction(1, 3))))
    assert to_sympy(v) == symbol("x") + sympy.Rational(5000, 3)


def test_display_names():
    expr = 2 * symbol("psi") / symbol("dp") + symbol("K")
    out = latex(expr, axes=("dp",))
    assert r"\Psi" in out and r"N_{\mathrm{dp}}" in out and "K" in out


def test_units_label_both():
    assert both(Fraction("31.40625e9")) == "31.41 GB (29.25 GiB)"


def test_repr_latex_for_jupyter():
    from placement_logic.costreport import build
    from placement_logic.frontend.loader import load_spec

    r = build(load_spec("examples/zero_paper.place"), plans=["zero3"])
    assert r.plans[0].device["total"]._repr_latex_() == r"$\frac{\Psi \cdot \left(K + 4\right)}{N_{\mathrm{dp}}}$"
    check_balanced(r.plans[0]._repr_latex_())
    check_balanced(r._repr_latex_())


TIMED = """from std.data import ddp, zero3
let psi = 7.5e9
let n = 64
model { params = psi }
mesh { dp = n }
plan a { dp: ddp }
plan b { dp: zero3 }
claim "ZeRO-3 moves 1.5x": comm(b) / comm(a) == 3/2
"""


@pytest.mark.parametrize("command", ["cost", "compare"])
def test_timeout_bounds_each_simplification(tmp_path, command):
    """--timeout sets the time each simplification may take: past it the identity is left undecided (the claim
    still holds on its values), never assumed; a time limit that is not a positive number is PL500."""
    f = tmp_path / "t.place"
    f.write_text(TIMED)
    code, out, _ = run(command, str(f), "--no-cache", "--format", "json") if command == "cost" else \
        run(command, str(f), "--format", "json")
    [q] = json.loads(out)["questions"]
    assert code == 0 and q["verdict"] == "holds" and q["identity"] is True
    extra = ["--no-cache"] if command == "cost" else []
    code, out, _ = run(command, str(f), *extra, "--timeout", "0.000001", "--format", "json")
    [q] = json.loads(out)["questions"]
    assert code == 0 and q["verdict"] == "holds" and q["identity"] is None
    code, _, err = run(command, str(f), *extra, "--timeout", "0")
    assert code == 2 and "[PL500]" in err and "--timeout 0" in err
