"""Sweeps of ``cost`` and ``compare`` and the compiled closed forms under them.

The oracle is independent of the compiled code: for every configuration of a grid, a spec
is written with the sizes as literals (mesh sizes and lets), loaded and derived exactly
with ``costs.derive(plan, sized=True)``; the compiled rows must agree with it to the byte,
and the ``--exact`` rows must equal it.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from fractions import Fraction

import pytest
import sympy

from placement_logic import costs
from placement_logic.cli import main
from placement_logic.commands.options import MAX_SWEEP_ROWS, parse_sweep_sets
from placement_logic.costreport.sweep import build_sweep
from placement_logic.costs.compiled import agrees, compile_exprs, cost_exprs, exact_value, tolerance
from placement_logic.costs.symbolic import resolve_bindings, symbol
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_spec, load_string

TEMPLATE = """from std.data import ddp, zero1, zero3
from std.tensor import megatron_sp
from std.pipeline import one_f_one_b
from std.recompute import selective_recompute
let b = {b}
let m = 8
model {{
  transformer {{ hidden = 1024 layers = 8 heads = 16 kv_heads = 4 ffn = 4096 vocab = 32000
                norm = rmsnorm gated_mlp bias = false }}
  seq = 2048  microbatch = b  microbatches = m
}}
mesh {{ dp = {dp} @ inter_node  tp = {tp} @ intra_node  pp = {pp} @ inter_node }}
plan fsdp_tp {{
  dp: zero3
  tp: megatron_sp
  pp: one_f_one_b
}}
plan zero1_pp {{
  dp: zero1
  tp: megatron_sp
  pp: one_f_one_b
  use selective_recompute
}}
plan ddp_tp {{
  dp: ddp
  tp: megatron_sp
  pp: one_f_one_b
}}
assert "fsdp fits in 2 GiB": memory(fsdp_tp) <= 2 GiB
"""
# axes of one device (no gather, no bucket, no p2p) and tensor ranks beyond the 4 K/V heads
GRID = {"dp": (1, 2, 4), "tp": (1, 2, 8, 16), "pp": (1, 2), "b": (1, 3)}
BASE = {"dp": 2, "tp": 2, "pp": 2, "b": 1}


def literal_spec(values: dict):
    return load_string(TEMPLATE.format(**values), "<oracle>")


def oracle(values: dict) -> dict[str, dict[str, Fraction]]:
    """Exact quantities of every plan, derived from a spec whose sizes are literals."""
    spec = literal_spec(values)
    subs = resolve_bindings(spec.bindings)
    out = {}
    for p in spec.plans:
        pc = costs.derive(p, sized=True)
        out[p.name] = {k: exact_value(e, subs) for k, e in cost_exprs(pc).items()}
    return out


def oracle_assert(values: dict) -> str:
    spec = literal_spec(values)
    subs = resolve_bindings(spec.bindings)
    pc = costs.derive(spec.plan("fsdp_tp"), sized=True)
    return "holds" if exact_value(pc.memory.device_total, subs) <= 2 * 2**30 else "fails"


@pytest.fixture(scope="module")
def grid_reports():
    spec = literal_spec(BASE)
    sweeps = {n: tuple(Fraction(v) for v in vs) for n, vs in GRID.items()}
    return build_sweep(spec, sweeps=sweeps), build_sweep(spec, sweeps=sweeps, exact=True)


def test_compiled_and_exact_rows_agree_with_literal_specs_to_the_byte(grid_reports):
    compiled, exact = grid_reports
    assert compiled.evaluation == "compiled" and exact.evaluation == "exact"
    configs = list(itertools.product(*GRID.values()))
    assert len(compiled.rows) == len(exact.rows) == 3 * len(configs)
    by_config = {}
    for row_c, row_e in zip(compiled.rows, exact.rows):
        assert row_c.values == row_e.values and row_c.plan == row_e.plan
        values = dict(zip(GRID, (int(v) for v in row_c.values)))
        key = tuple(values.values())
        if key not in by_config:
            by_config[key] = oracle(values)
        want = by_config[key][row_c.plan]
        assert set(row_c.numbers) == set(want)
        for k, v in want.items():
            assert row_e.numbers[k] == v, (values, row_c.plan, k)
            assert agrees(row_c.numbers[k], v), (values, row_c.plan, k, row_c.numbers[k], v)
            assert round(row_c.numbers[k]) == round(v)


def test_asserts_are_evaluated_per_configuration(grid_reports):
    compiled, exact = grid_reports
    seen = set()
    for row_c, row_e in zip(compiled.rows, exact.rows):
        values = dict(zip(GRID, (int(v) for v in row_c.values)))
        want = oracle_assert(values)
        assert row_c.verdicts == row_e.verdicts == (want,)
        seen.add(want)
    assert seen == {"holds", "fails"}, "the grid should make the assert hold and fail"


def test_let_that_an_axis_size_depends_on_is_swept():
    text = TEMPLATE.format(dp="n / 4", tp=4, pp=2, b=1).replace("let m = 8", "let m = 8\nlet n = 16")
    spec = load_string(text, "<derived>")
    report = build_sweep(spec, sweeps={"n": (Fraction(4), Fraction(8), Fraction(16))})
    for row in report.rows:
        n = int(row.values[0])
        want = oracle({"dp": n // 4, "tp": 4, "pp": 2, "b": 1})[row.plan]
        for k, v in want.items():
            assert agrees(row.numbers[k], v), (n, row.plan, k)


# --------------------------------------------------------------------------- compiled module


def test_compiled_backends_agree_on_max_min_piecewise_and_ceiling():
    x, y = symbol("x"), symbol("y")
    exprs = {"max": sympy.Max(x, y, 3, evaluate=False), "min": sympy.Min(x, 8), "ceil": sympy.ceiling(x / 3),
             "pw": sympy.Piecewise((x * y, x > 2), (y, True)), "const": sympy.Integer(7) / 2}
    xs, ys = [1, 2, 3, 9, 10], [5, 1, 4, 2, 7]
    fast = compile_exprs(exprs, ["x", "y"], backend="numpy").evaluate(x=xs, y=ys)
    slow = compile_exprs(exprs, ["x", "y"], backend="math").evaluate(x=xs, y=ys)
    for k in exprs:
        for i, (a, b) in enumerate(zip(xs, ys)):
            want = exact_value(exprs[k], {x: sympy.Integer(a), y: sympy.Integer(b)})
            assert agrees(float(fast[k][i]), want) and agrees(slow[k][i], want), (k, a, b)


def test_exact_and_check_report_disagreement():
    x = symbol("x")
    c = compile_exprs({"third": x / 3}, ["x"])
    out = c.evaluate(x=[1, 2])
    assert c.exact(x=1)["third"] == Fraction(1, 3)
    assert c.check(0, out, x=1) == []
    out["third"][0] += 1e-3  # a compiled value off by a thousandth of a byte
    assert c.check(0, out, x=1) == ["third"]
    assert tolerance(Fraction(2**50)) == Fraction(2**50, 2**44)


def test_unbound_symbol_is_refused():
    with pytest.raises(ValueError, match="unbound symbols in the expressions: y"):
        compile_exprs({"a": symbol("x") * symbol("y")}, ["x"])


# --------------------------------------------------------------------------- --set lists and ranges


@pytest.mark.parametrize("item, values", [
    ("dp=8,16,32", (8, 16, 32)),
    ("dp=1..4", (1, 2, 3, 4)),
    ("dp=1..64:x2", (1, 2, 4, 8, 16, 32, 64)),
    ("dp=1..100:x4", (1, 4, 16, 64)),
    ("dp=2..10:+4", (2, 6, 10)),
    ("b=1/2,1,3/2", (Fraction(1, 2), 1, Fraction(3, 2))),
    ("dp=3..3", (3,)),
])
def test_sweep_syntax(item, values):
    single, sweeps = parse_sweep_sets([item], known=["dp", "b"], axes=["dp"])
    assert single == {} and sweeps[item.split("=")[0]] == tuple(Fraction(v) for v in values)


@pytest.mark.parametrize("item, code, column, phrase", [
    ("dp=8..4", "PL301", 10, "descending"),
    ("dp=8,,16", "PL301", 12, "empty value"),
    ("dp=8,", "PL301", 12, "empty value"),
    ("dp=2,3/2", "PL301", 12, "positive integer"),
    ("dp=0,2", "PL301", 10, "positive"),
    ("dp=0..4", "PL301", 10, "positive integers"),
    ("dp=1..8:x1", "PL301", 15, ":xK"),
    ("dp=1..8:y2", "PL301", 15, ":xK"),
    ("dp=4,8,4", "PL301", 14, "twice"),
    ("dp=1.5..4", "PL301", 10, "positive integers"),
    ("dq=1,2", "PL301", 7, "not a let or an axis"),
    (f"dp=1..{MAX_SWEEP_ROWS + 1}", "PL310", 10, "at most 100,000"),
])
def test_bad_sweeps_are_located_diagnostics(item, code, column, phrase):
    with pytest.raises(DiagnosticError) as e:
        parse_sweep_sets([item], known=["dp", "b"], axes=["dp"])
    d = e.value.diagnostics[0]
    assert d.code == code and phrase in d.message and d.span.file == "<command line>"
    assert d.span.column == column, d.span


def test_cartesian_product_over_the_cap():
    with pytest.raises(DiagnosticError) as e:
        parse_sweep_sets(["dp=1..1000", "b=1..101"], known=["dp", "b"], axes=["dp"])
    assert e.value.diagnostics[0].code == "PL310" and "101,000" in e.value.diagnostics[0].message


# --------------------------------------------------------------------------- command line


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    path = tmp_path / "grid.place"
    path.write_text(TEMPLATE.format(**BASE))
    return path


def test_json_and_csv_rows(spec_file):
    code, out, _ = run("cost", str(spec_file), "--set", "dp=1,4", "--set", "tp=2..8:x2", "--format", "json")
    data = json.loads(out)
    assert code == 1  # the assert fails in some configuration
    assert data["swept"] == ["dp", "tp"] and data["summary"]["configurations"] == 6 and len(data["rows"]) == 18
    assert [r["values"] for r in data["rows"][::3]] == [{"dp": d, "tp": t} for d in (1, 4) for t in (2, 4, 8)]
    first = data["rows"][0]
    want = oracle({"dp": 1, "tp": 2, "pp": 2, "b": 1})[first["plan"]]
    assert first["bytes"]["memory.total"] == round(want["memory.total"])
    code, out, _ = run("cost", str(spec_file), "--set", "dp=1,4", "--format", "csv", "--exact")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 6 and rows[0]["dp"] == "1" and rows[0]["plan"] == "fsdp_tp"
    want = oracle({"dp": 1, "tp": 2, "pp": 2, "b": 1})["fsdp_tp"]
    assert Fraction(rows[0]["memory_total_bytes"]) == want["memory.total"]
    assert rows[0]["fsdp fits in 2 GiB"] in ("holds", "fails")


def test_exit_status_follows_the_asserts_of_every_row(spec_file):
    # one GPU-sized configuration fails, the sharded ones hold
    holds = [oracle_assert({**BASE, "dp": d}) for d in (1, 4)]
    code, _, _ = run("cost", str(spec_file), "--set", "dp=1,4", "--set", "tp=2")
    assert code == (1 if "fails" in holds else 0)
    code, _, _ = run("cost", str(spec_file), "--set", "dp=4,8", "--set", "tp=16", "--set", "pp=2")
    assert code == (1 if "fails" in [oracle_assert({**BASE, "dp": d, "tp": 16}) for d in (4, 8)] else 0)


def test_text_table_fits_the_width(spec_file):
    for width in (60, 120, 200):
        code, out, _ = run("cost", str(spec_file), "--set", "dp=1..4", "--width", str(width))
        assert max(len(line) for line in out.splitlines()) <= width
        assert "GiB" in out and "GB" in out
    code, out, _ = run("compare", str(spec_file), "--set", "dp=1,2", "--format", "markdown")
    assert "× fsdp_tp" in out and out.count("\n| 1 |") == 3


@pytest.mark.parametrize("argv, code", [
    (["--set", "dp=1,2", "--format", "latex"], "PL314"),
    (["--exact"], "PL314"),
    (["--set", "dp=1,2", "--groups"], "PL314"),
    (["--set", "dp=1..4:x0"], "PL301"),
    (["--plot", "out.gif"], "PL313"),
    (["--set", "dp=1,2", "--set", "tp=1,2", "--plot", "out.png"], "PL313"),
])
def test_usage_errors_exit_2(spec_file, argv, code):
    status, _, err = run("cost", str(spec_file), *argv)
    assert status == 2 and f"[{code}]" in err and "Traceback" not in err


def test_unbound_symbol_in_a_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    path = tmp_path / "free.place"
    path.write_text(TEMPLATE.format(**BASE).replace("seq = 2048", ""))
    status, _, err = run("cost", str(path), "--set", "dp=2,4")
    assert status == 2 and "[PL311]" in err and " s " in err
    status, out, _ = run("cost", str(path), "--set", "dp=2,4", "--set", "s=2048", "--format", "json")
    want = [oracle({**BASE, "dp": d})["fsdp_tp"]["memory.total"] for d in (2, 4)]
    assert status == 0 and [r["bytes"]["memory.total"] for r in json.loads(out)["rows"][::3]] == [
        round(w) for w in want]


def test_the_cache_keys_on_the_sweep(tmp_path, monkeypatch):
    monkeypatch.delenv("PLACEMENT_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "grid.place"
    path.write_text(TEMPLATE.format(**BASE))
    a = run("cost", str(path), "--set", "dp=1,2", "--format", "csv")
    b = run("cost", str(path), "--set", "dp=1,4", "--format", "csv")
    c = run("cost", str(path), "--set", "dp=1,2", "--format", "csv", "--exact")
    assert a[1] != b[1] and a[1].splitlines()[1] == b[1].splitlines()[1]
    assert list((tmp_path / "cache").rglob("*.json"))
    assert run("cost", str(path), "--set", "dp=1,4", "--format", "csv") == b
    assert c[1].splitlines()[0] == a[1].splitlines()[0]


def test_without_numpy_the_math_fallback_gives_the_same_rows(monkeypatch):
    import placement_logic.costreport.sweep as sweep_mod
    import placement_logic.costs.compiled as compiled_mod

    spec = literal_spec(BASE)
    sweeps = {"dp": (Fraction(1), Fraction(4)), "tp": (Fraction(2), Fraction(16))}
    fast = build_sweep(spec, sweeps=sweeps)
    monkeypatch.setattr(compiled_mod, "numpy_or_none", lambda: None)
    monkeypatch.setattr(sweep_mod, "numpy_or_none", lambda: None)
    slow = build_sweep(spec, sweeps=sweeps)
    assert (fast.backend, slow.backend) == ("numpy", "math")
    for a, b in zip(fast.rows, slow.rows):
        assert (a.values, a.plan, a.verdicts) == (b.values, b.plan, b.verdicts)
        assert a.numbers.keys() == b.numbers.keys()
        for k, v in b.numbers.items():
            assert isinstance(v, float) and round(v) == round(a.numbers[k])


def test_a_class_whose_compiled_values_disagree_is_re_derived_exactly(monkeypatch):
    import placement_logic.costreport.sweep as sweep_mod

    real = sweep_mod.compile_exprs

    def skewed(exprs, syms, backend=None):  # a compiled total one byte off
        c = real(exprs, syms, backend)
        fn = c._fn
        c._fn = lambda *a: [v + 1.0 if n.endswith("memory.total") else v for n, v in zip(c.names, fn(*a))]
        return c

    monkeypatch.setattr(sweep_mod, "compile_exprs", skewed)
    spec = literal_spec(BASE)
    report = build_sweep(spec, sweeps={"dp": (Fraction(1), Fraction(2), Fraction(4))})
    assert report.notes and "fsdp_tp: memory.total" in report.notes[0] and "re-derived exactly" in report.notes[0]
    assert "\0" not in report.notes[0]
    for row in report.rows:
        want = oracle({**BASE, "dp": int(row.values[0])})[row.plan]
        assert row.numbers == want


EXAMPLES = ["examples/llama70b_3d.place", "examples/mixtral_4d.place", "examples/zeropp.place",
            "examples/library/zero_infinity.place", "examples/library/hybrid_shard.place",
            "examples/library/context_parallel.place", "examples/library/interleaved_1f1b.place"]


@pytest.mark.parametrize("path", EXAMPLES)
def test_compiled_rows_equal_single_set_derivations_on_examples(path):
    """Every mesh axis of shipped examples swept over 1, 2 and 8 (the sizes a plan can take there:
    8 stages × 2 chunks do not split ZeroPP's 40 layers): the compiled rows agree with the exact
    rows, each derived as a single ``--set`` report derives it."""
    from placement_logic.costreport.sweep import compiled_agrees
    from placement_logic.resolve.validate import rebinding_diagnostics

    spec = load_spec(path)
    for axis in spec.mesh.names:
        sizes = tuple(Fraction(n) for n in (1, 2, 8) if not rebinding_diagnostics(spec, {axis: Fraction(n)}))
        assert len(sizes) >= 2, axis
        sweeps = {axis: sizes}
        compiled, exact = build_sweep(spec, sweeps=sweeps), build_sweep(spec, sweeps=sweeps, exact=True)
        assert not compiled.notes
        for a, b in zip(compiled.rows, exact.rows):
            assert (a.values, a.plan, a.verdicts) == (b.values, b.plan, b.verdicts)
            assert a.numbers.keys() == b.numbers.keys() and not compiled_agrees(a, b.numbers), (axis, a.values)
