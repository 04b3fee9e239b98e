"""Gradient reductions within blocks of an axis's ranks (``override grads: reduce_blocks``) priced
on the block's group and link (docs/costs.md, "Reductions over blocks of an axis"), and the
statements that move no bytes costing what the plan without them costs. Expected figures are
ring formulas written out here for the block's size, not read back from the engine."""

from __future__ import annotations

import io
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic import hardware as hw
from placement_logic.cli import main
from placement_logic.costs import derive
from placement_logic.costs.steptime import step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string

ROOT = Path(__file__).resolve().parent.parent
PSI = 7 * 10**9


def spec(mesh: str, override: str = "", plan: str = "dp: ddp", params: str = str(PSI), lets: str = "") -> str:
    return (f"{lets}from std.data import ddp\nfrom std.tensor import megatron_tp\nmodel {{\n  params = {params}\n}}\n"
            f"mesh {{\n{mesh}\n}}\nplan p {{\n  {plan}\n  {override}\n}}\n")


def grad_sync(text: str):
    plan = load_string(text).plans[0]
    pc = derive(plan)
    return [x for x in pc.communication.collectives if x.collective.phase.value == "grad_sync"], pc


def test_block_all_reduce_of_eight_in_sixteen_is_an_in_node_ring_of_eight(tmp_path):
    """dp = 16 on 8-GPU H100 nodes, blocks of 8: bf16 gradients (2Ψ bytes) all-reduced on 8 ranks,
    2·(8−1)/8·2Ψ per device, inside a node; the whole axis would be 2·15/16·2Ψ across nodes."""
    f = tmp_path / "blk.place"
    f.write_text(spec("  device = h100_sxm\n  dp = 16 @ inter_node", "override grads: reduce_blocks over (dp) by 8"))
    out, err = io.StringIO(), io.StringIO()
    main(["cost", str(f), "--format", "json"], out, err)
    doc = json.loads(out.getvalue())
    comm = doc["plans"][0]["communication"]
    coll = [c for c in comm["collectives"] if c["phase"] == "grad_sync"]
    assert len(coll) == 1
    assert coll[0]["link"] == "intra_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * (8 - 1), 8) * 2 * PSI
    assert Fraction(comm["per_link"]["intra_node"]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI
    assert "inter_node" not in comm["per_link"]
    whole, _ = grad_sync(spec("  device = h100_sxm\n  dp = 16 @ inter_node"))
    assert whole[0].collective.link == "inter_node"
    assert whole[0].bytes_per_device.xreplace({symbol("dp"): 16}) == Fraction(2 * 15, 16) * 2 * PSI


def test_a_block_whose_ranks_span_nodes_stays_on_the_network():
    """dp outside tp = 8 on 8-GPU nodes: consecutive dp ranks are 8 devices apart, a block of 2
    spans 16 devices, two nodes: a group of 2 on inter_node (2·(2−1)/2 of the tp shard)."""
    colls, pc = grad_sync(spec("  device = h100_sxm\n  dp = 4 @ inter_node\n  tp = 8 @ intra_node",
                               "override grads: reduce_blocks over (dp) by 2", plan="dp: ddp\n  tp: megatron_tp"))
    dp = [x for x in colls if x.collective.axes == ("dp",)]
    assert len(dp) == 1 and dp[0].collective.link == "inter_node" and dp[0].group == 2
    whole, _ = grad_sync(spec("  device = h100_sxm\n  dp = 4 @ inter_node\n  tp = 8 @ intra_node",
                              plan="dp: ddp\n  tp: megatron_tp"))
    buf = [x for x in whole if x.collective.axes == ("dp",)][0].buffer
    assert dp[0].buffer == buf and dp[0].bytes_per_device == 1 * buf  # 2·(2−1)/2 = 1


def test_without_a_catalogue_device_the_axis_keeps_its_link():
    colls, _ = grad_sync(spec("  dp = 16 @ inter_node", "override grads: reduce_blocks over (dp) by 8"))
    assert colls[0].collective.link == "inter_node"
    assert colls[0].bytes_per_device == Fraction(14, 8) * 2 * PSI


def test_a_symbolic_block_size_is_the_minimum_of_b_and_the_axis():
    colls, _ = grad_sync(spec("  dp = 16 @ inter_node", "override grads: reduce_blocks over (dp) by k", params="psi",
                              lets="let psi = 7e9\nlet k = 4\n"))
    b = sympy.Min(symbol("k"), symbol("dp"))
    assert sympy.simplify(colls[0].bytes_per_device - 2 * (b - 1) / b * 2 * symbol("psi")) == 0
    assert colls[0].bytes_per_device.xreplace({symbol("k"): 4, symbol("dp"): 16, symbol("psi"): PSI}) == 3 * PSI


def test_block_step_time_counts_the_blocks_ring_steps_on_the_node_link():
    """α–β with a stated MFU: 2(B−1) steps of the node link's latency plus 2(B−1)/B·2Ψ over its
    bandwidth (A100 nodes: NVLink 3), where the whole axis pays 2(n−1) steps on InfiniBand."""
    t = "hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000 bias = false norm = rmsnorm"
    text = ("from std.data import ddp\nmodel {\n  transformer { " + t + " }\n  seq = 2048\n  microbatch = 1\n"
            "  microbatches = 1\n}\nmesh {\n  dp = 16 @ inter_node\n  device = a100_80gb\n  mfu = 0.5\n}\n"
            "plan p {\n  dp: ddp\n  override grads: reduce_blocks over (dp) by 8\n}\n")
    plan = load_string(text).plans[0]
    pc = derive(plan)
    st = step_time(pc, plan.mesh.hardware)
    (c,) = [x for x in st.collectives if x.sized.collective.phase.value == "grad_sync"]
    nv = hw.link(hw.device("a100_80gb").intra_link)
    b, psi = 8, pc.shape.psi
    want = 2 * (b - 1) * Fraction(nv.latency) + Fraction(2 * (b - 1), b) * psi * 2 / Fraction(nv.bandwidth)
    assert c.link == "intra_node"
    assert sympy.nsimplify(c.seconds.xreplace({symbol("dp"): 16})) == want


def test_a_statement_of_one_group_splits_the_buffer():
    """grads[norms] in blocks of 2 of dp = 8: the norms' part reduced on 2 ranks, the rest on 8;
    the two parts' buffers add up to the whole buffer."""
    t = "hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000"
    head = ("from std.data import ddp\nmodel {\n  transformer { " + t + " }\n  seq = 2048\n  microbatch = 1\n"
            "}\nmesh {\n  dp = 8 @ inter_node\n}\nplan p {\n  dp: ddp\n")
    whole, _ = grad_sync(head + "}\n")
    parts, _ = grad_sync(head + "  override grads[norms]: reduce_blocks over (dp) by 2\n}\n")
    assert len(whole) == 1 and len(parts) == 2
    by_size = {x.group: x for x in parts}
    assert set(by_size) == {2, symbol("dp")}
    assert sympy.simplify(by_size[2].buffer + by_size[symbol("dp")].buffer - whole[0].buffer) == 0
    assert by_size[2].collective.payload.groups is not None and by_size[2].buffer != 0
    assert by_size[2].bytes_per_device == by_size[2].buffer  # 2·(2−1)/2


def test_strided_groups_of_sixteen_by_four_are_rings_of_four_on_the_network():
    """dp = 16 on 8-GPU H100 nodes, stride 4: groups {r, r+4, r+8, r+12} of 4 ranks, spanning both
    nodes: 2·(4−1)/4·2Ψ per device on inter_node (the whole axis: 2·15/16·2Ψ)."""
    colls, _ = grad_sync(spec("  device = h100_sxm\n  dp = 16 @ inter_node",
                              "override grads: reduce_strided over (dp) by 4"))
    assert len(colls) == 1 and colls[0].group == 4 and colls[0].collective.link == "inter_node"
    assert colls[0].bytes_per_device == Fraction(2 * 3, 4) * 2 * PSI
    assert "within strided groups of stride 4" in colls[0].collective.rule


def test_a_stride_that_does_not_divide_the_axis_prices_the_largest_group():
    """dp = 10, stride 4: groups {0,4,8}, {1,5,9}, {2,6}, {3,7}: the largest holds ⌈10/4⌉ = 3 ranks."""
    colls, _ = grad_sync(spec("  dp = 10 @ inter_node", "override grads: reduce_strided over (dp) by 4"))
    assert colls[0].group == 3 and colls[0].bytes_per_device == Fraction(2 * 2, 3) * 2 * PSI


def test_a_symbolic_stride_is_the_ceiling_of_the_axis_over_it():
    colls, _ = grad_sync(spec("  dp = 16 @ inter_node", "override grads: reduce_strided over (dp) by s", params="psi",
                              lets="let psi = 7e9\nlet s = 2\n"))
    m = sympy.ceiling(symbol("dp") / symbol("s"))
    assert sympy.simplify(colls[0].bytes_per_device - 2 * (m - 1) / m * 2 * symbol("psi")) == 0
    assert colls[0].bytes_per_device.xreplace({symbol("s"): 2, symbol("dp"): 16, symbol("psi"): PSI}) == \
        Fraction(2 * 7, 8) * 2 * PSI


def test_the_first_k_ranks_are_a_block_of_k_inside_a_node():
    """dp = 16 on 8-GPU H100 nodes, the first 8 ranks only: a ring of 8 inside the first node
    (2·7/8·2Ψ on intra_node); the other 8 ranks run no collective."""
    colls, _ = grad_sync(spec("  device = h100_sxm\n  dp = 16 @ inter_node",
                              "override grads: reduce_first over (dp) by 8"))
    assert len(colls) == 1 and colls[0].group == 8 and colls[0].collective.link == "intra_node"
    assert colls[0].bytes_per_device == Fraction(2 * 7, 8) * 2 * PSI
    assert "within the first 8 ranks only" in colls[0].collective.rule


# the statements that move no bytes: each file's costs equal those of the file without the statement
NO_BYTES = re.compile(r"^\s*override (grads(\[\w+\])?: (bucket_order|divide_except_last|divide_last_only|"
                      r"divide_rank0_only|clip_rank0_only)|loss_scale: (local|growth_local)|amax(\[\w+\])?: (local|reduce)|clip_norm: (eps_before_reduce|"
                      r"reduce_blocks|reduce_strided|reduce_first)|clip_norm(\[\w+\])?: count_on_ranks)\b.*$", re.M)
FILES = ["tests/corpus/mutants/buckets_ddp.place", "tests/corpus/mutants/buckets_hsdp_nodes.place",
         "tests/corpus/mutants/update_divide_except_last_pp.place",
         "tests/corpus/mutants/update_divide_last_only_pp.place", "tests/corpus/mutants/update_clip_rank0_ddp.place",
         "tests/corpus/mutants/update_divide_rank0_tp.place", "tests/corpus/mutants/loss_scale_local_zero2.place",
         "tests/corpus/mutants/loss_scale_local_pp.place", "examples/bugs/mimo_scaler_counters_distributed_optimizer.place",
         "examples/bugs/te_sp_amax_not_reduced_over_tp.place", "examples/safe/te_fp8_group_world.place",
         "tests/corpus/mutants/clip_eps_tp.place",
         "tests/corpus/mutants/clip_blocks_zero2.place", "examples/bugs/moe_expert_norm_in_mp_blocks.place",
         "tests/corpus/mutants/clip_strided_zero2.place", "tests/corpus/mutants/clip_first_zero2.place",
         "examples/bugs/grad_norm_in_first_shard_group.place", "examples/bugs/tied_embedding_counted_first_and_last.place",
         "tests/corpus/mutants/count_ranks_norms_every_rank_tp.place"]


def _costs(text: str):
    out = []
    for plan in load_string(text).plans:
        pc = derive(plan)
        out.append((pc.memory.device, pc.communication.total_bytes, pc.communication.total_volume,
                    pc.communication.per_link(), [(x.collective.axes, x.collective.kind.value, x.collective.link,
                                                        x.group, x.bytes_per_device)
                                                       for x in pc.communication.collectives]))
    return out


@pytest.mark.parametrize("name", FILES)
def test_statements_that_move_no_bytes_cost_nothing(name):
    text = (ROOT / name).read_text()
    assert NO_BYTES.search(text), name
    assert _costs(text) == _costs(NO_BYTES.sub("", text))
