"""Impossible shapes are located errors (PL130), and sizes of 1 move and gather nothing.

Oracle for the second half: a mesh axis of one device has no peer, so a collective over it
sends nothing and an S* state gathered over it is already whole; the report for `--set
pp=1` (or dp=1) must equal the report of a spec written with that size, and must list no
point-to-point transfer and no gathered-layer buffer."""

from __future__ import annotations

import json

import pytest

from placement_logic.cli import main

BASE = """from std.data import ddp, zero3
from std.tensor import megatron_sp
from std.pipeline import interleaved_1f1b, one_f_one_b
from std.context import context_parallel
model {{
  transformer {{
    hidden = 4096
    layers = {L}
    heads = {a}
    kv_heads = {kv}
    ffn = {f}
    vocab = {V}
  }}
  seq = {s}
  microbatch = 1
  microbatches = 8
}}
mesh {{
  dp = 2
  cp = {c}
  tp = {t}
  pp = {p}
}}
plan x {{
  dp: {data}
  cp: context_parallel
  tp: megatron_sp
  pp: {pipe}
}}
"""

GOOD = dict(L=32, a=32, kv=8, f=14336, V=32000, s=4096, c=2, t=4, p=4, data="ddp", pipe="one_f_one_b")


def _run(tmp_path, capsys, argv, **kw):
    f = tmp_path / "s.place"
    f.write_text(BASE.format(**{**GOOD, **kw}))
    status = main([argv[0], str(f), *argv[1:]])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_good_shape_passes(tmp_path, capsys):
    assert _run(tmp_path, capsys, ["cost"])[0] == 0


@pytest.mark.parametrize("kw,words,line", [
    (dict(a=30), "the attention heads (30) cannot be split evenly over tp (4)", 27),
    (dict(kv=3), "the kv heads (3) cannot be split evenly over tp (4)", 27),
    (dict(f=14337), "the MLP width (14337)", 27),
    (dict(V=50257), "the vocabulary (50257)", 27),
    (dict(L=30), "the layer count (30) cannot be split evenly over pp (4)", 28),
    (dict(L=36, pipe="interleaved_1f1b(v = 4)"), "over pp × 4 chunks (16)", 28),
    (dict(s=4095), "the sequence length (4095) cannot be split evenly over cp×tp (8)", 26),
])
def test_impossible_shapes_are_located_errors(tmp_path, capsys, kw, words, line):
    status, _, err = _run(tmp_path, capsys, ["cost"], **kw)
    assert status == 2
    assert "[PL130]" in err and words in err and f"s.place:{line}:3" in err and "Traceback" not in err


def test_fewer_kv_heads_than_ranks_is_a_copy_not_an_error(tmp_path, capsys):
    assert _run(tmp_path, capsys, ["cost"], kv=2)[0] == 0  # each of 2 heads copied on 2 of 4 ranks


def _collectives(out: str, plan: str = "x") -> list[dict]:
    return next(p for p in json.loads(out)["plans"] if p["plan"] == plan)["communication"]["collectives"]


def test_a_pipeline_of_one_stage_sends_nothing(tmp_path, capsys):
    status, out, _ = _run(tmp_path, capsys, ["cost", "--format", "json", "--set", "pp=1"])
    assert status == 0
    assert not [c for c in _collectives(out) if c["kind"] == "p2p" and c["axis"] == "pp"]
    written, out1, _ = _run(tmp_path, capsys, ["cost", "--format", "json"], p=1)
    assert json.loads(out)["plans"] == json.loads(out1)["plans"]
    status, out4, _ = _run(tmp_path, capsys, ["cost", "--format", "json"])
    assert [c for c in _collectives(out4) if c["kind"] == "p2p" and c["axis"] == "pp"]


def test_zero3_on_one_device_gathers_nothing(tmp_path, capsys):
    status, out, _ = _run(tmp_path, capsys, ["cost", "--format", "json", "--set", "dp=1"], data="zero3")
    terms = json.loads(out)["plans"][0]["memory"]["transient_terms"]
    assert not [k for k in terms if "gathered" in k or "bucket" in k]
    status, out2, _ = _run(tmp_path, capsys, ["cost", "--format", "json"], data="zero3")
    assert [k for k in json.loads(out2)["plans"][0]["memory"]["transient_terms"] if "gathered" in k]


def test_kv_heads_follow_the_set_tensor_size(tmp_path, capsys):
    # kv = 8 heads: split 1/4 at t = 4, one head per rank (1/8 of them) at t = 16
    _, out4, _ = _run(tmp_path, capsys, ["cost", "--format", "json"])
    _, out16, _ = _run(tmp_path, capsys, ["cost", "--format", "json", "--set", "tp=16"])

    def kv(out):
        groups = json.loads(out)["plans"][0]["memory"]["param_groups"]
        return next(g for g in groups if g["name"] == "kv")["per_device"]["params"]["bytes"]

    per_layer = 2 * 4096 * 1024 + 2 * 1024  # K and V: h·d_kv weights and d_kv biases each
    assert kv(out4) == 2 * 32 * per_layer // 4 // 4  # bytes · L · per layer ÷ t ÷ pp
    assert kv(out16) == 2 * 32 * per_layer // 8 // 4


@pytest.mark.parametrize("multiple,ok", [(256, True), (128, True), (3, False), (None, False)])
def test_a_padded_vocabulary_is_judged_padded(tmp_path, capsys, multiple, ok):
    """50257 rows padded to a multiple of 256 (or 128) split evenly over 2 tensor ranks; padded to
    a multiple of 3 (50259 rows) or not padded, they do not."""
    pad = f"    vocab_multiple = {multiple}\n" if multiple else ""
    f = tmp_path / "s.place"
    f.write_text("from std.tensor import megatron_tp\nmodel {\n  transformer {\n    hidden = 64\n    layers = 2\n"
                 f"    heads = 4\n    ffn = 256\n    vocab = 50257\n{pad}  }}\n}}\nmesh {{ tp = 2 }}\n"
                 "plan p { tp: megatron_tp }\n")
    status = main(["cost", str(f)])
    err = capsys.readouterr().err
    assert (status == 0) == ok and (("[PL130]" in err) != ok)
    if multiple == 3:
        assert "the vocabulary padded to a multiple of 3 (50259)" in err


@pytest.mark.parametrize("tied", [False, True])
def test_a_pipeline_of_one_stage_holds_the_whole_model(tied):
    """One stage is the first and the last: it holds the embedding, every layer, the final norm
    and the (untied) head, so its parameters are Ψ; with two stages each holds its end."""
    from placement_logic import costs
    from placement_logic.frontend.loader import load_string
    from placement_logic.ir import State

    h, L, a, V = 16, 8, 2, 32
    text = ("from std.data import ddp\nfrom std.pipeline import one_f_one_b\nmodel {\n  transformer {\n"
            f"    hidden = {h}\n    layers = {L}\n    heads = {a}\n    vocab = {V}\n"
            f"    tied_embeddings = {str(tied).lower()}\n  }}\n  bytes {{ params = 1 }}\n}}\n"
            "mesh {\n  dp = 2\n  pp = PP\n}\nplan x {\n  dp: ddp\n  pp: one_f_one_b\n}\n")
    layer = 4 * h * h + 4 * h + 2 * h * 4 * h + 4 * h + h + 2 * 2 * h  # attention, MLP (4h), their biases, 2 norms
    psi = L * layer + V * h + 2 * h + (0 if tied else V * h)
    one = costs.derive(load_string(text.replace("PP", "1")).plan("x"))
    assert one.shape.psi == psi and one.memory.device[State.PARAMS] == psi
    two = costs.derive(load_string(text.replace("PP", "2")).plan("x"))
    first, last = (s.device[State.PARAMS].subs({costs.symbol("pp"): 2}) for s in two.memory.stages)
    assert first == L // 2 * layer + V * h and last == L // 2 * layer + 2 * h + V * h
