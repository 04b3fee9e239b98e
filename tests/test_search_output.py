"""``placement search`` as a user reads it: the terminal width (``--width``, ``$COLUMNS``),
``--reserve`` (bytes or a fraction of the device's memory kept free), layouts with the same
figures merged into one row (zero3 and fsdp), and memory in the units ``cost`` prints."""

from __future__ import annotations

import io
import json
from fractions import Fraction

import pytest

pytest.importorskip("numpy")

from placement_logic import hardware as hw  # noqa: E402
from placement_logic.cli import main  # noqa: E402
from placement_logic.commands.search import reserve_bytes  # noqa: E402

MODEL = """model {
  transformer {
    hidden = 2048
    layers = 16
    heads = 16
    kv_heads = 4
    ffn = 5632
    vocab = 32000
    norm = rmsnorm
    gated_mlp
    bias = false
  }
}
"""
L40S = hw.device("l40s").memory


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def model_file(tmp_path):
    f = tmp_path / "m.place"
    f.write_text(MODEL)
    return f


def _args(model_file, *extra):
    return ["search", str(model_file), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq", "4096",
            "--tp", "1,2", "--pp", "1,2", "--no-check", *extra]


def test_text_reads_at_the_terminal_width(model_file, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    status, out, err = run_cli(*_args(model_file, "--top", "5"))
    assert status == 0, err
    assert max(map(len, out.splitlines())) <= 80
    assert "tokens/s" not in out  # the narrow table leaves out what step time already says
    status, wide, _ = run_cli(*_args(model_file, "--top", "5", "--width", "140"))
    assert max(map(len, wide.splitlines())) <= 140 and "tokens/s" in wide
    status, _, err = run_cli(*_args(model_file, "--width", "20"))
    assert status == 2 and "--width 20: at least 40 columns" in err


@pytest.mark.parametrize("text, want", [("4GiB", 4 * 2**30), ("2.5GB", 2_500_000_000), ("1000000", 10**6),
                                        ("0.05", Fraction(L40S, 20)), (".5", Fraction(L40S, 2))])
def test_reserve_in_bytes_or_a_fraction(text, want):
    assert reserve_bytes(text, L40S) == want


@pytest.mark.parametrize("text, words", [("4 parsecs", "bytes such as 4GiB"), ("1.5", "a whole number of bytes"),
                                         ("64GB", "leaves nothing"), ("-1", "bytes such as 4GiB")])
def test_bad_reserves_are_located_at_the_option(model_file, text, words):
    status, _, err = run_cli(*_args(model_file, "--reserve", text))
    assert status == 2 and words in err and f"--reserve {text}" in err and "[PL301]" in err


def test_reserve_keeps_memory_free(model_file):
    """With 40 GB kept free, what fits is exactly the unreserved search's rows of at most
    L40S − 40 GB, and each row's headroom is L40S − 40 GB − its memory."""
    status, js, err = run_cli(*_args(model_file, "--top", "1000", "--format", "json"))
    assert status == 0, err
    everything = json.loads(js)["ranked"]
    left = L40S - 40 * 10**9
    status, js, err = run_cli(*_args(model_file, "--top", "1000", "--format", "json", "--reserve", "40GB"))
    doc = json.loads(js)
    assert doc["space"]["reserve_bytes"] == 40 * 10**9
    key = ("dp", "tp", "pp", "v", "strategy", "recompute", "microbatch")
    want = sorted(tuple(r[k] for k in key) + tuple(r["same_as"]) for r in everything if r["memory_bytes"] <= left)
    got = sorted(tuple(r[k] for k in key) + tuple(r["same_as"]) for r in doc["ranked"])
    assert got == want and 0 < len(got) < len(everything)
    assert all(r["headroom_bytes"] == left - r["memory_bytes"] for r in doc["ranked"])


def test_zero3_and_fsdp_rows_with_the_same_figures_are_one_row(model_file):
    """Searched apart, zero3 and fsdp give the same rows figure for figure; searched together,
    each such row appears once, naming both."""
    def ranked(strategies):
        status, js, err = run_cli(*_args(model_file, "--top", "6", "--format", "json", "--strategies", strategies))
        assert status == 0, err
        return json.loads(js)["ranked"]

    figures = ("dp", "tp", "pp", "v", "recompute", "microbatch", "memory_bytes", "step_exact", "stage_memory_bytes",
               "link_bytes")
    zero3 = [tuple(json.dumps(r[k]) for k in figures) for r in ranked("zero3")]
    fsdp = [tuple(json.dumps(r[k]) for k in figures) for r in ranked("fsdp")]
    assert zero3 == fsdp
    both = ranked("zero3,fsdp")
    assert [tuple(json.dumps(r[k]) for k in figures) for r in both] == zero3
    assert all(r["strategy"] == "zero3" and r["same_as"] == ["fsdp"] for r in both)
    status, text, _ = run_cli(*_args(model_file, "--top", "6", "--strategies", "zero3,fsdp"))
    assert "zero3/fsdp" in text
    status, csv_text, _ = run_cli(*_args(model_file, "--top", "6", "--strategies", "zero3,fsdp", "--format", "csv"))
    assert all(",zero3/fsdp," in line for line in csv_text.splitlines()[1:])


def test_memory_in_the_units_cost_prints(model_file, tmp_path):
    """cost's fit line prints GB (10⁹ bytes) with GiB beside; search's table prints the same GB
    figure for a row's memory."""
    status, js, _ = run_cli(*_args(model_file, "--top", "1", "--format", "json"))
    row = json.loads(js)["ranked"][0]
    status, text, _ = run_cli(*_args(model_file, "--top", "1", "--width", "140"))
    line = next(x for x in text.splitlines() if x.lstrip().startswith("1"))
    shown = [w for w, unit in zip(line.split(), line.split()[1:]) if unit == "GB"]
    assert abs(float(shown[0]) - row["memory_bytes"] / 1e9) < 0.005
    assert "GiB" not in line
    status, emitted, _ = run_cli(*_args(model_file, "--top", "1", "--emit", "1"))
    f = tmp_path / "row.place"
    f.write_text(emitted)
    status, cost, _ = run_cli("cost", str(f), "--no-cache")
    fit = next(x for x in cost.splitlines() if x.startswith("fit:"))
    assert f"peak {shown[0]} GB (" in fit


def test_search_help_names_width_and_reserve():
    status, out, _ = run_cli("search", "--help")
    text = " ".join(out.split())
    assert status == 0 and "--width COLUMNS" in text and "$COLUMNS" in text
    assert "--reserve BYTES|FRACTION" in text and "a fraction of the device's memory (0.05)" in text
