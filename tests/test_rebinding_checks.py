"""Re-bound values meet the checks written values meet (``resolve.validate``).

Oracle: the same values written in the file and loaded (``load_string``: the resolver's own
PL107 / PL130 / PL133 checks). ``--set`` on check, cost, compare, inspect, a sweep's points, the
API and the rows ``search`` ranks must give the diagnostics the written file gives: the same
codes, messages and locations, plus a note naming the ``--set``."""

from __future__ import annotations

import io
import json
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from strategies import shape_values
from tiers import examples

import placement_logic as pl
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.resolve.validate import rebinding_diagnostics

TEMPLATE = """from std.data import zero1
from std.tensor import {tensor}
from std.pipeline import one_f_one_b

let H = {H}
let KV = {KV}
let F = {F}
let L = {L}
let S = {S}
let n = {n}

model {{
  transformer {{
    hidden = 4096
    layers = L
    heads = H
    kv_heads = KV
    ffn = F
    vocab = 32768
  }}
  seq = S
  microbatch = 1
  microbatches = 8
}}

mesh {{
  dp = n * 2
  tp = {tp}
  pp = {pp}
}}

plan p {{
  dp: zero1
  tp: {tensor}
  pp: one_f_one_b
}}
"""
BASE = {"H": 64, "KV": 8, "F": 11008, "L": 32, "S": 4096, "n": Fraction(1), "tp": 4, "pp": 2}

# the repro: 64 heads, 8 kv heads, 80 layers, tp = 4 in the file
REPRO = TEMPLATE.format(tensor="megatron_tp", **{**BASE, "L": 80})


def _text(values: dict, tensor: str = "megatron_tp") -> str:
    shown = {k: (f"{v.numerator}/{v.denominator}" if isinstance(v, Fraction) and v.denominator != 1 else int(v))
             for k, v in values.items()}
    return TEMPLATE.format(tensor=tensor, **shown)


def _written(text: str) -> list[tuple]:
    try:
        load_string(text, "s.place")
    except DiagnosticError as exc:
        return [(d.code, d.message, d.span.line, d.span.column, d.notes) for d in exc.diagnostics]
    return []


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=shape_values, sp=hs.booleans())
def test_set_gives_the_diagnostics_of_the_written_value(values, sp):
    tensor = "megatron_sp" if sp else "megatron_tp"
    base = load_string(_text(BASE, tensor), "s.place")
    sets = {k: Fraction(v) for k, v in values.items()}
    want = _written(_text(values, tensor))
    got = rebinding_diagnostics(base, sets)
    note = "the values given by " + " ".join(f"--set {k}={v}" for k, v in sets.items())
    assert [(d.code, d.message, d.span.line, d.span.column, d.notes) for d in got] == \
        [w[:4] + (w[4] + (note,),) for w in want]
    # the API's check re-binds the same way: an error exactly when the written file is one
    pinned = {k: int(v) for k, v in sets.items() if v.denominator == 1}
    if len(pinned) == len(sets) and want:
        with pytest.raises(DiagnosticError) as info:
            pl.check_spec(base, pinned=pinned)
        assert [d.code for d in info.value.diagnostics] == [w[0] for w in want]


@pytest.fixture
def repro(tmp_path):
    f = tmp_path / "r.place"
    f.write_text(REPRO)
    return f


@pytest.mark.parametrize("argv,words", [
    (("check", "--set", "tp=3"), "the attention heads (64) cannot be split evenly over tp (3)"),
    (("cost", "--set", "tp=3", "--no-cache"), "the attention heads (64) cannot be split evenly over tp (3)"),
    (("cost", "--set", "pp=3", "--no-cache"), "the layer count (80) cannot be split evenly over pp (3)"),
    (("compare", "--set", "pp=3"), "the layer count (80) cannot be split evenly over pp (3)"),
    (("inspect", "--set", "tp=3"), "the attention heads (64) cannot be split evenly over tp (3)"),
])
def test_repro_is_an_input_error_on_every_command(repro, argv, words):
    code, out, err = run(argv[0], str(repro), *argv[1:])
    assert code == 2 and "[PL130]" in err and words in err, err
    line = 35 if "pp=" in argv[2] else 34
    assert f"{repro}:{line}:3: error:" in err  # the binding that splits the size, as in the file
    assert "= note: the value given by " + " ".join(a for a in argv[1:3]) in err
    assert "PROVED" not in out and "GB" not in out


def test_the_written_value_is_the_same_error(repro, tmp_path):
    f = tmp_path / "w.place"
    f.write_text(REPRO.replace("tp = 4", "tp = 3"))
    _, _, written = run("inspect", str(f))
    _, _, rebound = run("inspect", str(repro), "--set", "tp=3")
    strip = [line.replace(str(f), "F") for line in written.splitlines()]
    assert [line.replace(str(repro), "F") for line in rebound.splitlines() if "--set" not in line] == strip


def test_json_format_carries_the_diagnostic(repro):
    code, out, _ = run("check", str(repro), "--set", "tp=3", "--format", "json")
    doc = json.loads(out)
    assert code == 2 and doc["diagnostics"][0]["code"] == "PL130" and doc["diagnostics"][0]["line"] == 34


def test_valid_sets_still_report(repro):
    code, out, err = run("cost", str(repro), "--set", "tp=8", "--set", "pp=4", "--no-cache")
    assert code == 0, err


def test_a_sweep_with_invalid_points_is_an_error_listing_them(repro):
    code, out, err = run("cost", str(repro), "--set", "tp=1..8", "--no-cache")
    assert code == 2 and out == "" and "[PL130]" in err
    # 64 heads, 8 kv heads, 11008 columns, 32768 vocabulary entries: tp in 1, 2, 4, 8 divide them all
    assert "4 of the 8 configurations of the sweep are invalid: tp=3; tp=5; tp=6; tp=7" in err
    assert "sweep the valid values only: --set tp=1,2,4,8" in err
    code, out, err = run("cost", str(repro), "--set", "tp=1,2,4,8", "--format", "csv", "--no-cache")
    assert code == 0 and len(out.strip().splitlines()) == 5, err


def test_a_sweep_over_two_names_judges_every_point(repro):
    code, _, err = run("compare", str(repro), "--set", "tp=2,4", "--set", "pp=2,3")
    assert code == 2 and "2 of the 4 configurations of the sweep are invalid: tp=2, pp=3; tp=4, pp=3" in err


def test_a_let_the_size_is_made_of_folds_through(tmp_path):
    """``dp = n * 2`` with ``--set n=1/4``: the axis size 1/2 is PL107 at the axis, as the let
    written with that value is."""
    f = tmp_path / "s.place"
    f.write_text(_text(BASE))
    code, _, err = run("cost", str(f), "--set", "n=1/4", "--no-cache")
    assert code == 2 and "[PL107]" in err and "the size of axis 'dp' must be a positive integer, not 1/2" in err


def test_the_api_holds_re_bound_values_to_the_same_checks():
    spec = load_string(REPRO, "r.place")
    with pytest.raises(DiagnosticError) as info:
        pl.check_spec(spec, pinned={"tp": 3})
    assert info.value.diagnostics[0].code == "PL130"
    with pytest.raises(DiagnosticError) as info:
        pl.cost_report(spec, sets={"pp": Fraction(3)})
    assert "the layer count (80) cannot be split evenly over pp (3)" in info.value.diagnostics[0].message
    assert pl.cost_report(spec, sets={"pp": Fraction(4)}).plans  # a valid value still reports


FOLDED = """from std.data import zero1
from std.tensor import {tensor}

model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  vocab = 128  ffn = 128  experts = 8  top_k = 2 }}
  seq = 64
  microbatch = 1
  group experts {{ role = {{tp: expert, e: expert}} }}
}}

mesh {{
  dp = 4
  e = 2
  tp = {tp}
}}

plan p {{
  dp: zero1
  e: zero1
  tp: {tensor}
}}
"""


def test_folding_a_tensor_axis_without_sequence_parallelism_is_pl133(tmp_path):
    """The experts folded over tp (2) beside megatron_tp: the derived plan would be refuted; the
    spec is an input error at the binding. One tensor rank, or megatron_sp, is fine."""
    with pytest.raises(DiagnosticError) as info:
        load_string(FOLDED.format(tensor="megatron_tp", tp=2), "f.place")
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.column) == ("PL133", 20, 3)
    assert "When using expert parallelism and tensor parallelism, sequence parallelism must be used" in d.notes[-1]
    load_string(FOLDED.format(tensor="megatron_sp", tp=2), "f.place")
    one = load_string(FOLDED.format(tensor="megatron_tp", tp=1), "f.place")
    assert pl.check_spec(one, pinned={"tp": 1}).verdict.word == "proved"
    assert pl.check_spec(one).verdict.word == "refuted"  # for every size of tp: a tp of 2 breaks it
    # the re-bound path: tp = 2 by --set is the same error
    f = tmp_path / "f.place"
    f.write_text(FOLDED.format(tensor="megatron_tp", tp=1))
    code, out, err = run("check", str(f), "--set", "tp=2")
    assert code == 2 and "[PL133]" in err and f"{f}:20:3" in err and "PROVED" not in out


def test_non_folded_experts_beside_megatron_tp_are_left_alone():
    """Plain expert parallelism beside megatron_tp: every tensor rank routes the same tokens to
    the same experts, and the checker proves it."""
    text = FOLDED.format(tensor="megatron_tp", tp=2).replace("  group experts {{ role = {{tp: expert, e: expert}} }}\n"
                                                            .replace("{{", "{").replace("}}", "}"), "")
    text = text.replace("  e: zero1\n", "  e: expert_parallel\n").replace(
        "from std.data import zero1\n", "from std.data import zero1\nfrom std.expert import expert_parallel\n")
    spec = load_string(text, "f.place")
    assert pl.check_spec(spec).verdict.word == "proved"


def test_megatron_import_of_folding_without_sequence_parallelism_is_pl133(tmp_path):
    """The issue's import: tensor 2, expert tensor 1, MoE, no --sequence-parallel. Megatron-LM
    asserts against it; the import is an input error located at the argument."""
    f = tmp_path / "a.args"
    f.write_text("--tensor-model-parallel-size 2 --expert-model-parallel-size 4 --expert-tensor-parallel-size 1 "
                 "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --padded-vocab-size 128 "
                 "--position-embedding-type rope --num-experts 8 --ffn-hidden-size 128 --seq-length 64 --bf16 "
                 "--use-distributed-optimizer --disable-bias-linear --swiglu\n")
    code, out, err = run("import", "megatron", str(f), "--devices", "16")
    col = f.read_text().index("--expert-tensor-parallel-size") + 1
    assert code == 2 and out == "" and f"{f}:1:{col}: error:" in err and "[PL133]" in err, err
    assert "^" + "~" * (len("--expert-tensor-parallel-size 1") - 1) + "\n" in err
    f.write_text(f.read_text().replace("--swiglu", "--swiglu --sequence-parallel"))
    code, out, err = run("import", "megatron", str(f), "--devices", "16")
    assert code == 0, err
    spec = load_string(out, "imported.place")
    assert pl.check_spec(spec).verdict.word == "proved"


SEARCH_MODEL = """model {
  transformer {
    hidden = 2048
    layers = 16
    heads = 16
    kv_heads = 4
    ffn = 5632
    vocab = 32002
    norm = rmsnorm
    gated_mlp
    bias = false
  }
}
"""


@pytest.mark.parametrize("mask_vocab", [True, False], ids=["mask", "one-check-only"])
def test_search_never_ranks_a_row_whose_sizes_a_file_refuses(tmp_path, monkeypatch, mask_vocab):
    """A vocabulary of 32002 splits over 1 or 2 tensor ranks, not 4 or 8. Every ranked and frontier
    row, written as a spec with literal sizes, loads (the oracle: the file's own checks). Without
    the vocabulary in the numpy mask (``one-check-only``) the check every re-bound value meets
    still keeps those rows out."""
    pytest.importorskip("numpy")
    from placement_logic import search
    from placement_logic.search import enumeration

    if not mask_vocab:
        from dataclasses import replace

        real = enumeration.enumerate_space
        monkeypatch.setattr(search, "enumerate_space", lambda space, t: real(space, replace(t, vocab=None)))
    f = tmp_path / "m.place"
    f.write_text(SEARCH_MODEL)
    space = search.Space(devices=16, global_batch=64, seq=4096, device="l40s", tp=(1, 2, 4, 8), pp=(1, 2),
                         microbatch=(1,), chunks=(2,), strategies=("zero1", "zero3"), recompute=("none", "full"))
    result = search.run(str(f), space, top=200, check=False)
    rows = result.ranked + result.frontier
    assert rows and {c.sizes["tp"] for c in rows} <= {1, 2} and any(c.sizes["tp"] == 2 for c in rows)
    for c in rows:
        load_string(search.concrete_spec(c, result.block, space), "row.place")
