"""Megatron-LM's asynchronous tensor-parallel backward (``conventions { tensor_backward =
overlapped }``, costs/tpbackward.py): the step it saves, derived here from the roofline, the
catalogue's product table and the collectives' own call times, per call max(0, call − product)."""

from __future__ import annotations

import io
from fractions import Fraction

import pytest
import sympy

from placement_logic import hardware as hw
from placement_logic.cli import main
from placement_logic.costs import derive
from placement_logic.costs.steptime import step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.costs.tpbackward import exposed
from placement_logic.frontend.loader import load_string

A100 = hw.device("a100_80gb")
PEAK, HBM = Fraction(312 * 10**12), Fraction(2039 * 10**9)


def _gemm(m, n, k):
    """A product's seconds as docs/hardware.md states the table: roofline over the size class's fraction."""
    flops = 2 * m * n * k
    moved = 2 * (m * k + k * n + m * n)
    top = Fraction(113, 130) * Fraction(7, 8)  # MAMF 271.2 of 312 TFLOPS × the fitted shape factor
    frac = next(f for b, f in ((128 * 10**9, top), (16 * 10**9, top * Fraction(9, 10)),
                               (10**9, top * Fraction(27, 50)), (0, Fraction(1, 10))) if flops >= b)
    return max(Fraction(flops) / PEAK, Fraction(moved) / HBM) / frac


def _spec(h, backward, sp=False, mfu=""):
    tensor = "megatron_sp" if sp else "megatron_tp"
    return (f"from std.tensor import {tensor}\nfrom std.recompute import full_recompute\n"
            f"model {{\n  transformer {{ hidden = {h} layers = 2 heads = 16 ffn = {4 * h} vocab = 51200 }}\n"
            f"  seq = 2048\n  microbatch = 4\n  microbatches = 3\n"
            f"  conventions {{ tensor_backward = {backward} }}\n}}\n"
            f"mesh {{\n  device = a100_80gb\n  precision = fp16\n{mfu}  tp = 8 @ intra_node\n}}\n"
            f"plan p {{\n  tp: {tensor}\n  use full_recompute\n}}\n")


def _step(src):
    plan = load_string(src).plans[0]
    st = step_time(derive(plan), plan.mesh.hardware)
    tp = {symbol("tp"): 8}
    calls = {(c.sized.collective.kind.value, c.sized.collective.rule): (Fraction(str(c.seconds.xreplace(tp))),
                                       int(c.sized.count.xreplace(tp)) if hasattr(c.sized.count, "xreplace")
                                       else int(c.sized.count)) for c in st.collectives}
    return Fraction(str(st.step.xreplace(tp))), calls


def test_the_formula_on_numbers():
    # 5 calls of 2 s; 2 behind each of two products of 1 s and 3 s: 1 call exposed whole (2 s),
    # behind the first 2 × (2 − 1), behind the second 2 × 0
    r = sympy.Rational
    assert exposed(r(10), r(5), r(2), (r(1), r(3))) == 4


@pytest.mark.parametrize("h", [8192, 512])
def test_the_saving_is_each_calls_overlap_with_its_product(h):
    """No sequence parallelism: per layer and microbatch, the 2 input-gradient all-reduces of
    the 4 in backward (2 are the recomputed forward's) run during QKV's and the up-projection's
    weight-gradient products; per microbatch the head's during the output layer's. At h = 8192
    the products outlast the calls (hidden whole); at h = 512 the calls outlast the products."""
    before, calls = _step(_spec(h, "exposed"))
    after, _ = _step(_spec(h, "overlapped"))
    layer_secs, layer_n = next(v for k, v in calls.items() if k[1].startswith("Megatron TP: 2 all-reduces per layer") and
                               "backward" in k[1])
    head_secs, head_n = next(v for k, v in calls.items() if k[1].startswith("vocabulary-parallel head: all-reduce"))
    m, L, T = 3, 2, 4 * 2048
    per = L * m
    assert layer_n == 4 * per and head_n == m
    c, ch = layer_secs / layer_n, head_secs / head_n
    g_qkv, g_up, g_head = _gemm(T, 3 * h // 8, h), _gemm(T, 4 * h // 8, h), _gemm(T, 51200 // 8, h)
    saved = sum(per * (c - max(0, c - g)) for g in (g_qkv, g_up)) + m * (ch - max(0, ch - g_head))
    assert after == before - saved
    if h == 8192:
        assert c < g_qkv and saved == 2 * per * c + m * ch
    else:
        assert c > g_up > g_qkv and saved == per * (g_qkv + g_up) + m * min(ch, g_head)


def test_sequence_parallel_hides_the_reduce_scatters_and_the_re_gathers():
    """With sequence parallelism the column-parallel inputs' gradients are reduce-scattered
    during the weight-gradient products and the inputs all-gathered again during the
    input-gradient products (the products of the same shapes)."""
    h = 8192
    before, calls = _step(_spec(h, "exposed", sp=True))
    after, _ = _step(_spec(h, "overlapped", sp=True))
    per = 2 * 3  # layers × microbatches
    rs_secs, rs_n = next(v for k, v in calls.items() if k[0] == "reduce_scatter" and "per layer in backward" in k[1])
    regather, n2 = calls[("all_gather", "Megatron SP (weight gradient): the 2 column-parallel inputs all-gathered "
                          "again per layer in backward")]
    assert n2 == 2 * per
    T = 4 * 2048
    assert max(rs_secs / rs_n, regather / n2) < _gemm(T, 3 * h // 8, h)  # every call shorter than its product
    assert rs_n == 4 * per  # 2 per layer the backward's, 2 the recomputed forward's
    head = sum(v[0] for k, v in calls.items() if k[1].startswith(("Megatron SP: the head's gradient",
                                                                "Megatron SP (weight gradient): the head's")))
    assert after == before - (rs_secs / 2 + regather + head)


def test_under_the_mfu_convention_products_take_their_flops_over_the_rate():
    h = 512
    mfu = "  mfu = 1/2\n"
    before, calls = _step(_spec(h, "exposed", mfu=mfu))
    after, _ = _step(_spec(h, "overlapped", mfu=mfu))
    layer_secs, layer_n = next(v for k, v in calls.items() if k[1].startswith("Megatron TP: 2 all-reduces per layer") and
                               "backward" in k[1])
    head_secs, head_n = next(v for k, v in calls.items() if k[1].startswith("vocabulary-parallel head: all-reduce"))
    m, per, T = 3, 6, 4 * 2048
    rate = PEAK / 2
    c, ch = layer_secs / layer_n, head_secs / head_n
    gs = [Fraction(2 * T * n * h) / rate for n in (3 * h // 8, 4 * h // 8)]
    gh = Fraction(2 * T * (51200 // 8) * h) / rate
    assert after == before - sum(per * (c - max(0, c - g)) for g in gs) - m * (ch - max(0, ch - gh))


def test_a_bad_word_is_a_located_diagnostic(tmp_path):
    f = tmp_path / "s.place"
    f.write_text(_spec(1024, "sideways"))
    out, err = io.StringIO(), io.StringIO()
    assert main(["cost", str(f), "--no-cache"], out, err) == 2
    assert "s.place:" in err.getvalue() and "tensor_backward" in err.getvalue() and "Traceback" not in err.getvalue()
