"""``placement calibrate``: the mesh lines it writes are what its own sweep tables say (figures
recomputed here from the printed rows), and a spec with them pasted into its mesh is timed with
them. The sweep runs on the CPU with gloo (a tiny one: the mechanics, not a device)."""

from __future__ import annotations

import io
import re
import sys
from fractions import Fraction

import pytest

from placement_logic.cli import main
from placement_logic.costs import derive
from placement_logic.costs.steptime import step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_without_torch_a_located_diagnostic(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    status, out, err = run_cli("calibrate", "--quick")
    assert status == 2 and "[PL315]" in err and "torch" in err and "Traceback" not in err


def test_a_device_not_in_the_catalogue_is_refused():
    status, _, err = run_cli("calibrate", "--device", "h100sxm")
    assert status == 2 and "[PL150]" in err and "h100_sxm" in err


def test_counts_below_one_are_refused():
    status, _, err = run_cli("calibrate", "--ranks", "0")
    assert status == 2 and "[PL315]" in err


SPEC = """from std.data import ddp
model {{
  transformer {{ hidden = 512 layers = 4 heads = 8 ffn = 2048 vocab = 1024 }}
  seq = 256
  microbatch = 2
}}
mesh {{
{lines}  dp = 2 @ intra_node
}}
plan p {{
  dp: ddp
}}
"""


def _table(text: str, header: str) -> list[list[float]]:
    """The comment rows under a header line of the calibration."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# " + header))
    rows = []
    for ln in lines[start + 1:]:
        if not ln.startswith("#   "):
            break
        rows.append([float(x) for x in ln[4:].split(",")])
    return rows


@pytest.mark.slow
@pytest.mark.torch
def test_a_tiny_cpu_sweep_writes_mesh_lines_a_spec_uses():
    pytest.importorskip("torch")
    status, text, err = run_cli("calibrate", "--backend", "cpu", "--quick", "--repeats", "2", "--device", "h100_sxm")
    assert status == 0, err
    gemm = _table(text, "matrix products")
    mem = _table(text, "memory copies")
    coll = _table(text, "all_reduce over 2 ranks")
    assert [int(n) for n, _ in gemm] == [64, 128, 256] and all(r > 0 for _, r in gemm)
    assert len(mem) == 2 and len(coll) == 3
    for nbytes, secs, busbw in coll:  # nccl-tests' bus bandwidth of an all-reduce over 2 ranks: bytes / seconds
        assert busbw == pytest.approx(2 * (2 - 1) / 2 * nbytes / secs, rel=1e-3)
    m = re.search(r"^device = h100_sxm\(matmul = ([0-9.e+-]+), hbm = ([0-9.e+-]+) B\)$", text, re.M)
    assert m, text
    best = max(r for _, r in gemm)
    # fp32 products on the CPU: the fraction of the H100 SXM's fp32 peak, 66.9 TFLOP/s (bf16 ones on a GPU)
    assert float(m.group(1)) == pytest.approx(min(best / 66.9e12, 1), rel=1e-3)
    assert float(m.group(2)) == pytest.approx(max(r for _, r in mem), rel=1e-3)
    link = re.search(r"^intra_node = link\(bandwidth = ([0-9.e+-]+) B, latency = ([0-9.e+-]+)\)$", text, re.M)
    assert link and float(link.group(1)) == pytest.approx(coll[-1][2], rel=1e-3)
    assert float(link.group(2)) == pytest.approx(coll[0][1] / 2, rel=1e-3)  # 2(n − 1) ring steps of n = 2
    # the lines, pasted into a mesh: the spec is timed on the measured figures
    mesh = "".join("  " + ln + "\n" for ln in text.splitlines() if not ln.startswith("#"))
    plan = load_string(SPEC.format(lines=mesh)).plans[0]
    hwr = plan.mesh.hardware
    assert Fraction(hwr.hbm.value) == Fraction(m.group(2))
    assert Fraction(hwr.link("intra_node").bandwidth.value) == Fraction(link.group(1))
    st = step_time(derive(plan), hwr).step.xreplace({symbol("dp"): 2})
    assert st.is_number and st > 0


@pytest.mark.slow
@pytest.mark.torch
def test_a_device_of_ones_own_takes_the_measured_best_as_its_peak():
    pytest.importorskip("torch")
    status, text, err = run_cli("calibrate", "--backend", "cpu", "--quick", "--repeats", "2", "--ranks", "1",
                                "--name", "mybox")
    assert status == 0, err
    assert "all_reduce" not in text and "intra_node" not in text
    m = re.search(r"^device = mybox\(memory = (\d+) B, flops = ([0-9.e+-]+), hbm = ([0-9.e+-]+) B, matmul = 1\)$",
                  text, re.M)
    assert m, text
    assert float(m.group(2)) == pytest.approx(max(r for _, r in _table(text, "matrix products")), rel=1e-3)
    mesh = "".join("  " + ln + "\n" for ln in text.splitlines() if not ln.startswith("#"))
    plan = load_string(SPEC.format(lines=mesh + "  intra_node = pcie4\n")).plans[0]  # no link measured
    assert Fraction(plan.mesh.hardware.flops.value) == Fraction(m.group(2))
    st = step_time(derive(plan), plan.mesh.hardware).step.xreplace({symbol("dp"): 2})
    assert st.is_number and st > 0
