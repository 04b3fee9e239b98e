"""The attention FLOPs under a sliding window (``attention { window = W }``, costs.window): the share of the
score matrix against the unmasked (query, key) pairs counted one by one, and the step-time model's counts (the
FLOPs per token and the fused kernel's time) scaled by that share against the causal half."""

from __future__ import annotations

import sympy

from placement_logic.costs import derive
from placement_logic.costs.steptime import flops_per_token, step_time
from placement_logic.costs.window import causal_share
from placement_logic.frontend.loader import load_string

SHAPE = ("hidden = 4096 layers = 32 heads = 32 kv_heads = 8 ffn = 14336 vocab = 32000 gated_mlp bias = false "
         "norm = rmsnorm")


def _pairs(s: int, w: int) -> int:
    return sum(1 for p in range(s) for k in range(s) if 0 <= p - k < w)


def test_share_is_the_count_of_unmasked_pairs():
    for s in range(1, 14):
        for w in range(1, s + 3):
            share = causal_share(sympy.Integer(s), sympy.Integer(w))
            want = sympy.Rational(_pairs(s, w), s * s) if w < s else sympy.Rational(1, 2)  # no window: the half
            assert share == want, (s, w)


def _spec(window: str | None, device: str = "") -> str:
    att = f"  attention {{\n    window = {window}\n  }}\n" if window else ""
    return (f"from std.data import ddp\nfrom std.context import context_parallel\nmodel {{\n  transformer {{ {SHAPE} }}\n"
            f"  seq = 8192\n  microbatch = 1\n  microbatches = 1\n{att}}}\nmesh {{\n  dp = 2 @ inter_node\n"
            f"  cp = 4 @ intra_node\n{device}}}\nplan p {{\n  dp: ddp\n  cp: context_parallel\n}}\n")


def test_flops_per_token_count_the_window_keys():
    s, w = 8192, 1024
    t = load_string(_spec(None), "x.place").model.transformer
    causal = flops_per_token(t, sympy.Integer(s), True)
    window = flops_per_token(t, sympy.Integer(s), True, sympy.Integer(w))
    full = flops_per_token(t, sympy.Integer(s), False)
    # the core per token: 2·s·a·(d_qk + d_v) over the layers, times the share of the scores
    core = full.attention
    assert causal.attention == core / 2
    assert window.attention == core * sympy.Rational(_pairs(s, w), s * s)
    assert window.layer == causal.layer and window.head == causal.head


def test_step_time_reads_the_model_window():
    dev = "  device = h100_sxm\n"
    base, win = (load_string(_spec(x, dev), "x.place").plans[0] for x in (None, "1024"))
    a, b = step_time(derive(base), base.mesh.hardware), step_time(derive(win), win.mesh.hardware)
    t = base.model.transformer
    per_token = (flops_per_token(t, sympy.Integer(8192), True).attention
                 - flops_per_token(t, sympy.Integer(8192), True, sympy.Integer(1024)).attention)
    # the model FLOPs: 3 × forward × tokens (8192 per sequence × dp); the window takes its share off the core
    assert sympy.simplify(a.model_flops - b.model_flops - 3 * per_token * a.tokens) == 0
    assert per_token > 0 and any("sliding window" in x for x in b.assumptions)
