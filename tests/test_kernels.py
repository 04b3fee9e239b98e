"""The kernel model of compute time (costs/kernels.py, docs/time.md) against figures derived here
from the roofline, the catalogue's tables and an enumeration of a layer's operations."""

from __future__ import annotations

import io
from fractions import Fraction

import pytest
import sympy

from placement_logic import hardware as hw
from placement_logic.cli import main
from placement_logic.costs import derive, kernels
from placement_logic.costs.steptime import compute_mode, step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string

A100 = hw.device("a100_80gb")
PEAK, HBM = Fraction(312 * 10**12), Fraction(2039 * 10**9)


def _fraction(table, x):
    """The table's fraction for size x, read the way docs/hardware.md states it."""
    for bound, f in table:
        if x >= bound:
            return f
    raise AssertionError("the last bound is 0")


def _gemm(m, n, k, batch=1):
    flops = 2 * m * n * k * batch
    moved = 2 * (m * k + k * n + m * n) * batch
    return max(Fraction(flops) / PEAK, Fraction(moved) / HBM) / _fraction(A100.efficiency.gemm, flops)


def _mem(moved):
    return Fraction(moved) / HBM / _fraction(A100.efficiency.memory, moved)


DEV = kernels.Device(sympy.Integer(312 * 10**12), sympy.Integer(2039 * 10**9), A100.efficiency, sympy.Integer(2))


def test_tables_are_exact_monotone_and_sourced():
    for d in hw.DEVICES.values():
        e = d.efficiency
        assert e is not None and e.sources
        for table in (e.gemm, e.memory):
            bounds = [b for b, _ in table]
            assert bounds == sorted(bounds, reverse=True) and bounds[-1] == 0
            assert all(isinstance(f, Fraction) and 0 < f <= 1 for _, f in table)
            assert [f for _, f in table] == sorted((f for _, f in table), reverse=True)
        assert 0 < e.flash <= 1
    # the A100's largest products: MAMF 271.2 of 312 TFLOPS, times the fitted 7/8
    assert A100.efficiency.gemm[0] == (128 * 10**9, Fraction(2712, 3120) * Fraction(7, 8))
    # NVLink 3 at the published curve's 235.14 GB/s plateau of 300 (docs/hardware.md), HDR at 9/10
    assert hw.link("nvlink3").efficiency == Fraction(47, 60) and hw.link("ib_hdr").efficiency == Fraction(9, 10)
    assert abs(float(hw.link("nvlink3").efficiency) * 300 - 235.14) < 0.2
    for k in hw.LINKS.values():  # the bus-bandwidth curves: size classes down to 0, fractions in (0, 1]
        if k.bus_curve:
            bounds = [b for b, _ in k.bus_curve]
            assert bounds == sorted(bounds, reverse=True) and bounds[-1] == 0
            assert [f for _, f in k.bus_curve] == sorted((f for _, f in k.bus_curve), reverse=True)
            assert k.bus_curve[0][1] == 1 and all(0 < f <= 1 for _, f in k.bus_curve)


def test_a_large_product_is_compute_bound_at_the_top_fraction():
    n = 8192
    t = kernels.gemm(DEV, n, n, n)
    assert t == Fraction(2 * n**3) / (PEAK * Fraction(113, 130) * Fraction(7, 8))
    assert t == _gemm(n, n, n)


def test_a_matrix_vector_product_is_memory_bound():
    t = kernels.gemm(DEV, 1, 8192, 8192)
    moved = 2 * (8192 + 8192 * 8192 + 8192)
    assert t == Fraction(moved) / HBM / Fraction(1, 10)  # under 1 GFLOP: the last class
    assert t > Fraction(2 * 8192 * 8192) / PEAK * 10  # far from the compute roof


def test_memory_bound_kernel_classes():
    for moved, f in ((200 * 10**6, Fraction(63, 100)), (50 * 10**6, Fraction(21, 40)),
                     (5 * 10**6, Fraction(21, 50)), (1000, Fraction(21, 100))):
        assert kernels.memory_bound(DEV, sympy.Integer(moved)) == Fraction(moved) / (HBM * f)


def _spec(mesh="  dp = 4 @ inter_node", plan="  dp: ddp", imports="from std.data import ddp", conv=""):
    return (f"{imports}\nmodel {{\n  transformer {{ hidden = 1024 layers = 4 heads = 16 ffn = 4096 vocab = 32000 }}\n"
            f"  seq = 2048\n  microbatch = 2\n  microbatches = 3\n{conv}}}\n"
            f"mesh {{\n  device = a100_80gb\n{mesh}\n}}\nplan p {{\n{plan}\n}}\n")


def test_a_step_from_an_enumeration_of_the_operations():
    """DDP, no tensor parallelism, eager attention, no recompute: every operation of a layer
    listed from the architecture, timed with the tables, three microbatches, the output layer,
    the optimizer step; the gradient all-reduce (ring over InfiniBand HDR at 9/10, NCCL's
    latencies) overlaps."""
    spec = load_string(_spec())
    plan = spec.plans[0]
    pc = derive(plan)
    st = step_time(pc, plan.mesh.hardware)
    h, a, f, s, b, V, L = 1024, 16, 4096, 2048, 2, 32000, 4
    T, d = b * s, h // a
    gemms = _gemm(T, 3 * h, h) + _gemm(T, h, h) + _gemm(T, f, h) + _gemm(T, h, f)
    scores = b * a * s * s
    core = _gemm(s, s, d, b * a) + _gemm(s, d, s, b * a) + _mem(9 * scores)  # softmax and dropout: 4e + 1 bytes
    elementwise = 2 * _mem(4 * T * h) + 2 * _mem(7 * T * h) + _mem(4 * T * f)  # norms, bias-dropout-adds, GeLU
    layer = gemms + core + elementwise
    head = _gemm(T, V, h) + _mem(12 * T * V)
    microbatch = 3 * L * layer + 3 * head
    sub = {symbol("dp"): 4}
    assert st.compute.xreplace(sub) == 3 * microbatch
    psi = pc.shape.psi
    states = (2 + 2 + 12) * psi  # bf16 parameters and gradients, fp32 master, moments
    assert st.optimizer.xreplace(sub) == _mem(2 * states)
    # NCCL's ring/Simple (tuning.cc; the fastest here: tests/test_nccl_model.py): 8.4 µs a call, 9.6 µs a
    # step across the network, × 1.9 for a multi-node all-reduce of at least n/16 × 64 KiB
    ring = (Fraction(19, 10) * (Fraction(84, 10**7) + 2 * 3 * Fraction(96, 10**7))
            + Fraction(2 * 3, 4) * psi * 2 / (25 * 10**9 * Fraction(9, 10)))
    assert st.overlapped.xreplace(sub) == ring
    assert st.step.xreplace(sub) == max(3 * microbatch, ring) + _mem(2 * states)


def test_flash_attention_and_recompute():
    base = load_string(_spec(plan="  dp: ddp\n  flash_attention")).plans[0]
    st = step_time(derive(base), base.mesh.hardware)
    eager = load_string(_spec()).plans[0]
    st_e = step_time(derive(eager), eager.mesh.hardware)
    h, a, s, b, L = 1024, 16, 2048, 2, 4
    d = h // a
    flash = Fraction(b * a * s * s * 2 * 2 * d, 2) / (PEAK * Fraction(3, 5))  # causal: half the products
    eager_core = _gemm(s, s, d, b * a) + _gemm(s, d, s, b * a) + _mem(9 * b * a * s * s)
    sub = {symbol("dp"): 4}
    assert st_e.compute.xreplace(sub) - st.compute.xreplace(sub) == 3 * 3 * L * (eager_core - flash)
    sel = load_string(_spec(plan="  dp: ddp\n  use selective_recompute",
                            imports="from std.data import ddp\nfrom std.recompute import selective_recompute")).plans[0]
    st_s = step_time(derive(sel), sel.mesh.hardware)
    assert st_s.compute.xreplace(sub) - st_e.compute.xreplace(sub) == 3 * L * eager_core


@pytest.mark.parametrize("mesh,conv,mode", [
    ("  dp = 4 @ inter_node", "", "kernels"),
    ("  mfu = 0.4\n  dp = 4 @ inter_node", "", "mfu"),  # a stated mfu is the MFU convention
    ("  dp = 4 @ inter_node", "  conventions { compute_time = mfu }\n", "mfu"),
    ("  mfu = 0.4\n  dp = 4 @ inter_node", "  conventions { compute_time = kernels }\n", "kernels"),
])
def test_which_model_times_compute(mesh, conv, mode):
    plan = load_string(_spec(mesh=mesh, conv=conv)).plans[0]
    assert compute_mode(plan, plan.mesh.hardware) == mode
    st = step_time(derive(plan), plan.mesh.hardware)
    assert ("MFU" in st.assumptions[0]) == (mode == "mfu")
    assert (st.optimizer == 0) == (mode == "mfu")


def test_a_device_of_ones_own_needs_its_hbm_for_the_kernel_model():
    src = _spec(mesh="  dp = 4").replace("device = a100_80gb", "device = mygpu(memory = 24 GiB, flops = 100e12)")
    plan = load_string(src).plans[0]
    assert compute_mode(plan, plan.mesh.hardware) == "mfu"
    plan = load_string(src.replace("flops = 100e12", "flops = 100e12, hbm = 1 TB")).plans[0]
    hwr = plan.mesh.hardware
    assert compute_mode(plan, hwr) == "kernels" and hwr.hbm.value == 10**12
    assert hwr.efficiency is hw.GENERIC_EFFICIENCY


def test_a_measured_matmul_fraction_replaces_the_catalogues():
    """``device = a100_80gb(matmul = 0.9)``: the user's best-shape fraction (their mamf-finder
    run) builds the product table the catalogue's way: × 7/8, × 9/10, × 27/50 by class."""
    plan = load_string(_spec().replace("device = a100_80gb", "device = a100_80gb(matmul = 0.9)")).plans[0]
    eff = plan.mesh.hardware.efficiency
    top = Fraction(9, 10) * Fraction(7, 8)
    assert [f for _, f in eff.gemm] == [top, top * Fraction(9, 10), top * Fraction(27, 50), Fraction(1, 10)]
    assert eff.memory == A100.efficiency.memory and "matmul = 9/10" in eff.sources[0]
    n = 8192
    dev = kernels.Device(sympy.Integer(312 * 10**12), sympy.Integer(2039 * 10**9), eff, sympy.Integer(2))
    assert kernels.gemm(dev, n, n, n) == Fraction(2 * n**3) / (PEAK * top)


@pytest.mark.parametrize("src_change,code,words", [
    (("device = a100_80gb", "device = a100_80gb(matmul = 1.5)"), "PL107", "'matmul'"),
    (("device = a100_80gb", "device = a100_80gb(hbm = 0 GB)"), "PL107", "'hbm' must be positive"),
    (("device = a100_80gb", "device = a100_80gb(hbm = 2)"), "PL114", "'hbm' needs bytes"),
    (("microbatches = 3\n", "microbatches = 3\n  conventions { compute_time = roofline }\n"), "PL", "compute_time"),
])
def test_bad_kernel_model_lines_are_located_diagnostics(tmp_path, src_change, code, words):
    f = tmp_path / "s.place"
    f.write_text(_spec().replace(*src_change))
    out, err = io.StringIO(), io.StringIO()
    status = main(["cost", str(f), "--no-cache"], out, err)
    assert status == 2 and f"[{code}" in err.getvalue() and words in err.getvalue()
    assert "Traceback" not in err.getvalue() and "s.place:" in err.getvalue()
