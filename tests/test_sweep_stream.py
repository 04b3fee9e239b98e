"""Streamed sweeps: rows written as they are made, in memory that does not grow with them.

Oracles: single ``placement cost --set dp=K`` reports (the ordinary report, derived exactly
in sympy, not the sweep's code) for a few rows of a long streamed sweep; the text table
rich lays out whole for the text table laid out block by block; ``json.dumps`` of the parsed
document for the JSON assembled around its spooled rows; exact substitution in sympy for the
exact-rational evaluator; tracemalloc's peak for the memory.
"""

from __future__ import annotations

import csv
import io
import json
import tracemalloc
from fractions import Fraction

import pytest
import sympy

from placement_logic.cli import main
from placement_logic.costs.compiled import exact_value
from placement_logic.costs.exactfn import compile_exact

ZERO = "examples/zero_paper.place"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def no_cache(monkeypatch):
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")


def single(k: int) -> dict:
    """The ordinary report of dp = k: per plan its exact bytes, and the questions' verdicts."""
    _, out, _ = run("cost", ZERO, "--set", f"dp={k}", "--format", "json")
    doc = json.loads(out)
    plans = {}
    for p in doc["plans"]:
        dev = p["memory"]["device"]
        plans[p["plan"]] = {**{f"memory_{s}_bytes": Fraction(dev[s]["exact"]) for s in dev},
                            "comm_total_bytes": Fraction(p["communication"]["total"]["exact"])}
    return {"plans": plans, "verdicts": [q["verdict"] for q in doc["questions"]]}


def test_streamed_rows_equal_single_runs():
    n = 1500
    code, out, _ = run("cost", ZERO, "--set", f"dp=1..{n}", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 4 * n and code == 1  # the ZeRO-3 assert fails where dp is small
    labels = [k for k in rows[0] if not k.endswith("_bytes") and k not in ("dp", "plan")]
    for k in (1, 2, 7, 8, 64, 1023, n):
        want = single(k)
        got = [r for r in rows if r["dp"] == str(k)]
        assert [r["plan"] for r in got] == list(want["plans"])
        for r in got:
            for name, v in want["plans"][r["plan"]].items():
                assert int(r[name]) == round(v), (k, r["plan"], name)
            assert [r[q] for q in labels] == want["verdicts"], k


def test_long_text_table_is_the_table_rich_lays_out_whole(monkeypatch):
    import placement_logic.costreport.sweeptext as sweeptext

    for argv in (("cost", ZERO, "--set", "dp=1..60"),
                 ("compare", "examples/llama70b_3d.place", "--set", "dp=1..12", "--width", "200"),
                 ("cost", "examples/llama70b_3d.place", "--set", "dp=1..4", "--set", "tp=1,2,4,8", "--width", "80")):
        whole = run(*argv)
        monkeypatch.setattr(sweeptext, "TEXT_ROWS", 10)
        monkeypatch.setattr(sweeptext, "BLOCK", 7)
        blocks = run(*argv)
        monkeypatch.undo()
        monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
        assert "┃" in whole[1] and blocks == whole, argv


def test_json_around_spooled_rows_is_the_indented_document():
    code, out, _ = run("compare", ZERO, "--set", "dp=1..80", "--format", "json")
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    # ZeRO-3's model state is 7.5e9 × 16 B / dp: above 2 GB for dp < 60, so the assert fails below 60
    failing = sum(1 for k in range(1, 81) if Fraction(75 * 10**8 * 16, k) > 2 * 10**9)
    assert failing == 59
    assert code == doc["exit_status"] == 1
    assert doc["summary"] == {"configurations": 80, "rows": 320, "asserts_failed": 4 * failing}
    assert sum(1 for r in doc["rows"][::4] if r["verdicts"][0] == "fails") == failing
    _, csv_out, _ = run("compare", ZERO, "--set", "dp=1..80", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(csv_out)))
    assert [int(r["memory_total_bytes"]) for r in rows] == [r["bytes"]["memory.total"] for r in doc["rows"]]


def test_output_file_is_streamed_whole(tmp_path):
    target = tmp_path / "rows.csv"
    code, out, _ = run("cost", ZERO, "--set", "dp=1..500", "--format", "csv", "-o", str(target))
    _, want, _ = run("cost", ZERO, "--set", "dp=1..500", "--format", "csv")
    assert code == 1 and out == "" and target.read_text() == want
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]  # no temporary file left
    target.write_text("kept")
    code, _, err = run("cost", ZERO, "--set", "dp=1..5", "--set", "nope=1,2", "-o", str(target))
    assert code == 2 and target.read_text() == "kept"


def test_quiet_keeps_nothing_and_keeps_the_exit_status():
    code, out, _ = run("cost", ZERO, "--set", "dp=1..200", "--format", "csv", "-q")
    assert (code, out) == (1, "")


def _peak(n: int) -> int:
    from placement_logic.commands.options import parse_sweep_sets
    from placement_logic.costreport.sweep import plan_sweep
    from placement_logic.costreport.sweeptext import write
    from placement_logic.frontend.loader import load_spec

    class Nowhere(io.TextIOBase):
        def write(self, s):
            return len(s)

    spec = load_spec(ZERO)
    _, sweeps = parse_sweep_sets([f"dp=1..{n}"], known=["dp", "psi", "K"], axes=["dp"])
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        report = plan_sweep(spec, sweeps=sweeps)
        for fmt in ("csv", "json", "markdown", "text"):
            write(report, fmt, Nowhere())
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_rows(monkeypatch):
    import placement_logic.costreport.sweeprows as sweeprows
    import placement_logic.costreport.sweeptext as sweeptext

    # small chunks and blocks, so that a few thousand rows are many of each (the text table spooled)
    monkeypatch.setattr(sweeprows, "CHUNK", 128)
    monkeypatch.setattr(sweeptext, "TEXT_ROWS", 100)
    monkeypatch.setattr(sweeptext, "BLOCK", 50)
    _peak(200)  # caches and imports first
    small, large = _peak(600), _peak(2400)
    # every row kept would cost ~1 KiB (four plans' numbers): 7,200 more rows, over 7 MiB more; the
    # sweep's values themselves (a Fraction per configuration, ~100 B) are its input and are allowed
    assert large - small < 2**20, (small, large)


def test_exact_function_equals_substitution():
    x, y = sympy.Symbol("x", positive=True), sympy.Symbol("y", positive=True)
    exprs = [sympy.Max(x, y / 3, 2), sympy.Min(x, 8) * y, sympy.ceiling(x / 3) + sympy.floor(y / 7),
             sympy.Piecewise((x * y, x > 2), (y, True)), sympy.Mod(x, 5) + sympy.Abs(x - y),
             (x + 1) ** -2 * y ** 3, sympy.Rational(7, 3) * x / y]
    f = compile_exact([str(k) for k in range(len(exprs))], exprs, [x, y])
    for a in (1, 2, 3, Fraction(7, 2), 64, 10**6):
        for b in (1, Fraction(1, 3), 9, 10**9):
            got = f(a, b)
            for k, e in enumerate(exprs):
                want = exact_value(e, {x: sympy.Rational(Fraction(a).numerator, Fraction(a).denominator),
                                       y: sympy.Rational(Fraction(b).numerator, Fraction(b).denominator)})
                assert got[str(k)] == want and isinstance(got[str(k)], Fraction), (k, a, b)
    assert compile_exact(["r"], [sympy.sqrt(x)], [x]) is None  # no exact rational form: sympy does it
