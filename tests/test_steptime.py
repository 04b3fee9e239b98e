"""The hardware catalogue, the hardware lines of a mesh, the fit verdict and the step-time
model, against published formulas and first-principles counts written here."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic import hardware as hw
from placement_logic.cli import main
from placement_logic.costs import derive
from placement_logic.costs.steptime import flops_per_token, step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out, err), out.getvalue(), err.getvalue()


def shape_spec(transformer: str, extra_model: str = "", mesh: str = "dp = 8", plan: str = "dp: ddp",
               imports: str = "from std.data import ddp") -> str:
    return (f"{imports}\nmodel {{\n  transformer {{ {transformer} }}\n  seq = 2048\n  microbatch = 1\n"
            f"  microbatches = 1\n{extra_model}}}\nmesh {{\n{mesh}\n}}\nplan p {{\n{plan}\n}}\n")


# --------------------------------------------------------------------------- the catalogue


def test_catalogue_has_the_devices_and_links_the_issue_names():
    for d in ("a100_40gb", "a100_80gb", "h100_sxm", "h100_pcie", "h200", "b200", "mi300x", "l40s"):
        dev = hw.device(d)
        assert dev is not None and dev.sources and dev.memory % 2**30 == 0
        assert dev.flops["bf16"] > 0 and dev.hbm_bandwidth > 0
        assert hw.link(dev.intra_link) is not None and hw.link(dev.inter_link) is not None
    for k in hw.LINKS.values():
        assert k.bandwidth > 0 and k.latency >= 0 and k.sources


def test_catalogue_figures_are_the_dense_datasheet_figures():
    # dense = half the datasheets' "with sparsity" figures; GiB for HBM capacities
    assert hw.device("h100_sxm").flops["bf16"] == Fraction(9894, 10) * 10**12
    assert hw.device("a100_80gb").memory == 80 * 2**30 == 85_899_345_920
    assert hw.link("nvlink4").bandwidth == 450 * 10**9  # 900 GB/s bidirectional
    assert hw.link("ib_ndr").bandwidth == 400 * 10**9 // 8  # 400 Gb/s


# --------------------------------------------------------------------------- FLOPs


def _matmuls_of_layer(h, a, kv, dh, f, gated, s, causal):
    """The matrix products one token takes part in, forward, written from the architecture:
    (rows of the weight, columns) for the projections, and the attention core's products."""
    mats = [(h, a * dh), (h, kv * dh), (h, kv * dh), (a * dh, h)]  # q, k, v, o
    mats += [(h, f), (h, f), (f, h)] if gated else [(h, f), (f, h)]
    weights = sum(2 * r * c for r, c in mats)
    core = 2 * s * a * dh * 2  # q·kᵀ over s keys, and the weighted sum of s values
    return weights + (Fraction(core, 2) if causal else core)


@pytest.mark.parametrize("h,a,kv,f,gated,L,V", [
    (4096, 32, 32, 16384, False, 24, 50304),  # GPT-style
    (4096, 32, 8, 14336, True, 32, 128256),  # Llama-3-8B
    (8192, 64, 8, 28672, True, 80, 128256),  # Llama-3-70B
    (1024, 16, 4, 2816, True, 12, 32000),
])
@pytest.mark.parametrize("causal", [True, False])
def test_flops_per_token_against_an_enumeration_of_the_products(h, a, kv, f, gated, L, V, causal):
    spec = load_string(shape_spec(f"hidden = {h} layers = {L} heads = {a} kv_heads = {kv} ffn = {f} vocab = {V} "
                                  + ("gated_mlp " if gated else "") + "bias = false norm = rmsnorm"))
    s = 2048
    fl = flops_per_token(spec.model.transformer, sympy.Integer(s), causal)
    expected = L * _matmuls_of_layer(h, a, kv, h // a, f, gated, s, causal) + 2 * V * h
    assert fl.forward == expected


@pytest.mark.parametrize("h,L,a,V,s", [(12288, 96, 96, 51200, 2048), (8192, 80, 64, 51200, 2048),
                                       (4096, 32, 32, 51200, 4096), (2048, 24, 16, 50304, 1024)])
def test_megatron_formula_with_full_recompute_and_full_attention(h, L, a, V, s):
    """Narayanan et al. (2021), eq. (3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) FLOPs per iteration
    with full recomputation (MHA, ffn = 4h, no gate, the attention counted in full)."""
    B = 8
    spec = load_string(shape_spec(f"hidden = {h} layers = {L} heads = {a} ffn = {4 * h} vocab = {V}"))
    fl = flops_per_token(spec.model.transformer, sympy.Integer(s), causal=False)
    executed = B * s * (4 * (fl.layer + fl.attention) + 3 * fl.head)  # forward, backward (2x), recompute
    megatron = 96 * B * s * L * h * h * (1 + sympy.Rational(s, 6 * h) + sympy.Rational(V, 16 * L * h))
    assert sympy.simplify(executed - megatron) == 0


def test_model_flops_are_six_n_plus_the_attention_term():
    """PaLM's count (Chowdhery et al. 2022, appendix B): 6N + 12·L·H·Q·T per token, N the
    non-embedding matrix parameters (the output layer included), attention counted in full."""
    t = "hidden = 4096 layers = 32 heads = 32 kv_heads = 8 ffn = 14336 vocab = 128256 gated_mlp bias = false " \
        "norm = rmsnorm"
    spec = load_string(shape_spec(t, "  conventions { attention_flops = full }\n", mesh="dp = 8 @ inter_node\n"
                                  "  device = h100_sxm"))
    plan = spec.plans[0]
    pc = derive(plan)
    st = step_time(pc, plan.mesh.hardware)
    psi = pc.shape.psi
    norms = 32 * 2 * 4096 + 4096
    n = psi - 128256 * 4096 - norms  # without the embedding lookup and the norms
    tokens = 2048 * 1 * 1 * symbol("dp")
    assert sympy.simplify(st.model_flops - tokens * (6 * n + 12 * 32 * 32 * 128 * 2048)) == 0


def test_recompute_adds_a_forward():
    t = "hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000"
    base = {}
    for rec in ("", "selective_recompute", "full_recompute"):
        imports = "from std.data import ddp" + (f"\nfrom std.recompute import {rec}" if rec else "")
        spec = load_string(shape_spec(t, mesh="dp = 4\n  device = a100_80gb", plan="dp: ddp" +
                                      (f"\n  use {rec}" if rec else ""), imports=imports))
        plan = spec.plans[0]
        pc = derive(plan)
        st = step_time(pc, plan.mesh.hardware)
        base[rec] = st.device_flops.xreplace({symbol("dp"): 4})
    fl = flops_per_token(spec.model.transformer, sympy.Integer(2048), True)
    assert base["full_recompute"] - base[""] == 2048 * (fl.layer + fl.attention)
    assert base["selective_recompute"] - base[""] == 2048 * fl.attention


# --------------------------------------------------------------------------- time


def test_ddp_step_from_first_principles():
    """One data axis: compute = 6·N-style FLOPs / (peak · MFU), the gradient all-reduce (ring,
    α–β) overlaps with it; the step is the larger."""
    t = "hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000 bias = false norm = rmsnorm"
    spec = load_string(shape_spec(t, mesh="dp = 16 @ inter_node\n  device = a100_80gb\n  mfu = 0.5"))
    plan = spec.plans[0]
    pc = derive(plan)
    st = step_time(pc, plan.mesh.hardware)
    n, s = 16, 2048
    fl = flops_per_token(spec.model.transformer, sympy.Integer(s), True)
    peak = Fraction(312 * 10**12) * Fraction(1, 2)
    compute = 3 * fl.forward * s / peak
    psi = pc.shape.psi
    bw, lat = Fraction(25 * 10**9), Fraction(5, 10**6)  # a100's network link: InfiniBand HDR
    allreduce = 2 * (n - 1) * lat + Fraction(2 * (n - 1), n) * psi * 2 / bw  # bf16 gradients
    sub = {symbol("dp"): n}
    assert st.compute.xreplace(sub) == compute
    assert st.overlapped.xreplace(sub) == allreduce
    assert st.exposed == 0
    assert st.step.xreplace(sub) == max(compute, allreduce)


# NCCL's tuning model (src/graph/tuning.cc of NVIDIA/nccl, 2.9.9): ring with the LL128 protocol,
# 10 µs per call and 1.9 µs per step on NVLink, its bus bandwidth 0.92 of the link's; written out here
LL128_CALL, LL128_NVLINK, LL128_BUS = Fraction(10, 10**6), Fraction(19, 10**7), Fraction(92, 100)


def test_an_h100_all_reduce_is_nccls_fastest_protocol():
    """Two all-reduces of one 16 MiB activation on 8 H100s over NVLink 4 (no published curve for
    it: NCCL's model alone, tests/test_nccl_model.py checks it against NCCL's own code): the ring
    with LL128 beats Simple (8.4 + 14 × 3.4 µs, the full 370 GB/s) and the trees, at 2 × (10 µs + 14
    × 1.9 µs + 2(n − 1)/n × bytes / (0.92 × 370 GB/s))."""
    t = "hidden = 4096 layers = 1 heads = 32 ffn = 16384 vocab = 32000"
    spec = load_string(shape_spec(t, mesh="device = h100_sxm\n  precision = fp16\n  tp = 8 @ intra_node",
                                  plan="tp: megatron_tp", imports="from std.tensor import megatron_tp"))
    plan = spec.plans[0]
    st = step_time(derive(plan), plan.mesh.hardware)
    c = next(x for x in st.collectives if x.sized.collective.rule.startswith("Megatron TP: 2 all-reduces per layer "
                                                                               "per microbatch in forward"))
    n, m, bus = 8, 2048 * 4096 * 2, Fraction(370 * 10**9)
    ll128 = LL128_CALL + 2 * (n - 1) * LL128_NVLINK + Fraction(2 * (n - 1), n) * m / (bus * LL128_BUS)
    simple = Fraction(84, 10**7) + 2 * (n - 1) * Fraction(34, 10**7) + Fraction(2 * (n - 1), n) * m / bus
    assert ll128 < simple
    assert c.seconds.xreplace({symbol("tp"): 8}) == 2 * ll128


def test_pipeline_bubble_is_p_minus_one_over_v_m():
    t = "hidden = 1024 layers = 16 heads = 16 ffn = 4096 vocab = 32000"
    src = ("from std.data import ddp\nfrom std.pipeline import interleaved_1f1b\n"
           "model {\n  transformer { " + t + " }\n  seq = 1024\n  microbatch = 1\n  microbatches = 8\n}\n"
           "mesh {\n  device = h100_sxm\n  dp = 2 @ inter_node\n  pp = 4 @ inter_node\n}\n"
           "plan p {\n  dp: ddp\n  pp: interleaved_1f1b(v = 2)\n}\n")
    spec = load_string(src)
    plan = spec.plans[0]
    st = step_time(derive(plan), plan.mesh.hardware)
    sub = {symbol("dp"): 2, symbol("pp"): 4}
    compute, bubble = st.compute.xreplace(sub), st.bubble.xreplace(sub)
    assert bubble / (compute - bubble) == Fraction(4 - 1, 2 * 8)


# --------------------------------------------------------------------------- the command line


def test_cost_reports_the_fit_and_exits_one_when_it_does_not(tmp_path):
    base = shape_spec("hidden = 8192 layers = 80 heads = 64 kv_heads = 8 ffn = 28672 vocab = 128256 gated_mlp "
                      "bias = false norm = rmsnorm", mesh="dp = 8 @ inter_node\n  device = h100_sxm",
                      plan="dp: zero3\n  use full_recompute\n  flash_attention",
                      imports="from std.data import zero3\nfrom std.recompute import full_recompute")
    f = tmp_path / "s.place"
    f.write_text(base)
    status, out, err = run_cli("cost", str(f), "--no-cache")
    assert status == 1 and "DOES NOT FIT on NVIDIA H100 SXM5 80GB" in out and "over by" in out
    status, out, _ = run_cli("cost", str(f), "--no-cache", "--set", "dp=512")
    assert status == 0 and "fit: fits on NVIDIA H100 SXM5 80GB" in out and "headroom" in out
    assert "step time" in out and "MFU" in out


def test_device_flag_and_its_diagnostic(tmp_path):
    f = tmp_path / "s.place"
    f.write_text(shape_spec("hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000"))
    status, out, _ = run_cli("cost", str(f), "--no-cache", "--device", "b200")
    assert status == 0 and "NVIDIA B200" in out and "fits" in out
    status, _, err = run_cli("cost", str(f), "--no-cache", "--device", "h100")
    assert status == 2 and "[PL150]" in err and "h100_sxm" in err and "Traceback" not in err


@pytest.mark.parametrize("mesh,words,code", [
    ("device = h100\n  dp = 8", "'h100' is not a device of the catalogue", "PL150"),
    ("device = h100_sxm\n  dp = 8 @ fabric", "link class 'fabric' has no bandwidth", "PL150"),
    ("device = h100_sxm\n  fabric = ib_nd\n  dp = 8 @ fabric", "'ib_nd' is not a link of the catalogue", "PL150"),
    ("device = h100_sxm\n  mfu = 1.5\n  dp = 8", "'mfu' must lie in (0, 1]", "PL107"),
    ("mfu = 0.5\n  dp = 8", "needs its device", "PL150"),
    ("device = a100_80gb\n  precision = fp8\n  dp = 8", "has no fp8 peak", "PL150"),
    ("device = mygpu(memory = 24 GiB)\n  dp = 8", "give both its memory and its flops", "PL150"),
    ("device = mygpu(memory = 24, flops = 1e14)\n  dp = 8", "'memory' needs bytes", "PL114"),
    ("device = h100_sxm\n  x = link(bandwidth = 0 GB, latency = 1e-6)\n  dp = 8 @ x", "'bandwidth' must be positive",
     "PL107"),
])
def test_hardware_lines_are_checked(tmp_path, mesh, words, code):
    f = tmp_path / "s.place"
    f.write_text(shape_spec("hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000", mesh=mesh))
    status, _, err = run_cli("cost", str(f), "--no-cache")
    assert status == 2 and f"[{code}]" in err and words in err and "Traceback" not in err


def test_own_device_and_link_figures_are_used():
    src = shape_spec("hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000",
                     mesh="device = mygpu(memory = 24 GiB, flops = 100e12)\n  net = link(bandwidth = 10 GB, "
                     "latency = 1e-5)\n  dp = 4 @ net")
    spec = load_string(src)
    hwr = spec.mesh.hardware
    assert hwr.device == "mygpu" and hwr.memory.value == 24 * 2**30 and hwr.flops.value == 10**14
    assert hwr.link("net").bandwidth.value == 10**10 and hwr.link("net").latency.value == Fraction(1, 10**5)
    assert spec.mesh.names == ("dp",)  # the hardware lines are not axes


def test_compare_with_a_device_adds_fit_and_time_rows():
    status, out, err = run_cli("compare", str(ROOT / "examples/llama70b_3d.place"), "--device", "h100_sxm", "--format", "markdown")
    assert status == 0, err
    for row in ("fit.headroom", "time.step", "time.tokens_per_second", "time.mfu"):
        assert f"| {row} |" in out
    status, out, _ = run_cli("compare", str(ROOT / "examples/llama70b_3d.place"), "--format", "markdown")
    assert "time.step" not in out  # no device, no time


def test_time_formulas_are_shown_while_symbols_are_unbound(tmp_path):
    f = tmp_path / "s.place"
    f.write_text("from std.data import zero3\nmodel {\n  transformer { hidden = 1024 layers = 8 heads = 16 "
                 "ffn = 4096 vocab = 32000 }\n  microbatch = 1\n}\nmesh {\n  device = a100_80gb\n"
                 "  dp = 64 @ inter_node\n}\nplan p { dp: zero3 }\n")
    status, out, _ = run_cli("cost", str(f), "--no-cache", "--width", "200")
    # the kernel model: each product's efficiency by its size class, a piecewise form in s
    assert "│ step " in out and "= Max(" in out.split("step time")[1] and "fit: undecided" in out
    assert "Piecewise((" in out.split("step time")[1]
    f.write_text(f.read_text().replace("  dp = 64", "  mfu = 0.5\n  dp = 64"))  # the MFU convention
    status, out, _ = run_cli("cost", str(f), "--no-cache", "--width", "200")
    assert "= Max(s*(s + " in out.split("step time")[1] and "Piecewise" not in out.split("step time")[1]
    status, out, _ = run_cli("cost", str(f), "--no-cache", "--set", "s=1024")
    assert status == 0 and "fit: fits" in out


def test_latex_carries_the_time_equations():
    status, out, _ = run_cli("cost", str(ROOT / "examples/llama70b_3d.place"), "--device", "h100_sxm",
                             "--format", "latex", "--no-cache")
    assert status == 0
    assert r"T_{\mathrm{step}} &=" in out and r"\mathrm{MFU} &=" in out and " s}" in out
