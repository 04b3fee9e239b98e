"""What the resolver makes of specs: modes per state per axis, roles, options, settings,
overrides, units and types, checked against hand-written expectations."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from placement_logic import ir
from placement_logic.frontend.loader import load_string
from placement_logic.ir import Mode, Residency, Role, ScheduleKind

HEAD = """
model {
  params = 1e9
  seq = 2048
  microbatch = 2
  microbatches = 8
}
"""


def plan_of(body: str, mesh: str = "dp = 8", imports: str = "", name: str = "p"):
    spec = load_string(f"{imports}\n{HEAD}\nmesh {{ {mesh} }}\n{body}\n", "t.place")
    return spec.plan(name)


def modes(plan, state):
    return dict(plan.placement(state).modes)


@pytest.mark.parametrize("strategy,expected", [
    ("ddp", "R R R R"),
    ("zero1", "R S R R"),
    ("zero2", "R S S R"),
    ("zero3", "S* S S R"),
    ("fsdp_full_shard", "S* S S R"),
    ("fsdp_shard_grad_op", "S* S S R"),
])
def test_data_parallel_tuples(strategy, expected):
    plan = plan_of(f"plan p {{ dp: {strategy} }}", imports=f"from std.data import {strategy}")
    got = " ".join(modes(plan, s)["dp"].value for s in ir.STATES)
    assert got == expected
    assert plan.role("dp") is Role.DATA


def test_fsdp_variants_differ_in_resharding_only():
    imports = "from std.data import fsdp_full_shard, fsdp_shard_grad_op"
    full = plan_of("plan p { dp: fsdp_full_shard }", imports=imports)
    grad_op = plan_of("plan p { dp: fsdp_shard_grad_op }", imports=imports)
    assert full.placement("params").reshard_after_forward is True
    assert grad_op.placement("params").reshard_after_forward is False
    assert full.placement("params").unit == grad_op.placement("params").unit == "block"


def test_hybrid_shard_maps_formal_axes_in_order():
    plan = plan_of("plan p { [node, gpu]: hybrid_shard }", mesh="node = 2 gpu = 4",
                   imports="from std.data import hybrid_shard")
    assert modes(plan, "params") == {"node": Mode.R, "gpu": Mode.S_STAR}
    assert modes(plan, "grads") == {"node": Mode.R, "gpu": Mode.S}
    # swapping the binding order swaps the roles of the axes
    swapped = plan_of("plan p { [gpu, node]: hybrid_shard }", mesh="node = 2 gpu = 4",
                      imports="from std.data import hybrid_shard")
    assert modes(swapped, "params") == {"node": Mode.S_STAR, "gpu": Mode.R}


def test_three_d_composition():
    plan = plan_of(
        "plan p { dp: zero1 tp: megatron_sp pp: interleaved_1f1b(v = 3) use full_recompute }",
        mesh="dp = 2 tp = 4 pp = 2",
        imports="from std.data import zero1\nfrom std.tensor import megatron_sp\n"
                "from std.pipeline import interleaved_1f1b\nfrom std.recompute import full_recompute")
    assert modes(plan, "optimizer") == {"dp": Mode.S, "tp": Mode.S, "pp": Mode.S}
    assert modes(plan, "params") == {"dp": Mode.R, "tp": Mode.S, "pp": Mode.S}
    assert [plan.role(a) for a in ("dp", "tp", "pp")] == [Role.DATA, Role.TENSOR, Role.PIPELINE]
    assert plan.sequence_parallel is True
    assert plan.recompute is ir.Recompute.FULL
    assert plan.schedule == ir.Schedule(ScheduleKind.INTERLEAVED, "pp", ir.const(3), ir.const(1))


def test_strategy_parameter_defaults_and_symbols():
    src = "let chunks = 4\nplan p { dp: ddp pp: interleaved_1f1b } plan q { dp: ddp pp: interleaved_1f1b(v = chunks) }"
    imports = "from std.data import ddp\nfrom std.pipeline import interleaved_1f1b"
    p = plan_of(src, mesh="dp = 2 pp = 4", imports=imports)
    q = plan_of(src, mesh="dp = 2 pp = 4", imports=imports, name="q")
    assert p.schedule.chunks == ir.const(2)
    assert q.schedule.chunks == ir.Sym("chunks")


def test_zeropp_unit_and_chunks():
    plan = plan_of("plan p { [s, i, o]: zeropp_zero1(v = 2, U = 8) }", mesh="s = 4 i = 8 o = 2",
                   imports="from std.zeropp import zeropp_zero1")
    assert plan.schedule.kind is ScheduleKind.ZEROPP
    assert (plan.schedule.chunks, plan.schedule.unit) == (ir.const(2), ir.const(8))
    assert modes(plan, "params") == {"s": Mode.S, "i": Mode.S_STAR, "o": Mode.R}
    assert modes(plan, "optimizer") == {"s": Mode.S, "i": Mode.S, "o": Mode.S}
    assert plan.placement("params").unit == "chunk"


def test_offload_residency():
    imports = "from std.offload import zero_offload, zero_infinity"
    off = plan_of("plan p { dp: zero_offload }", imports=imports)
    inf = plan_of("plan p { dp: zero_infinity }", imports=imports)
    assert off.placement("optimizer").residency is Residency.HOST
    assert modes(off, "optimizer")["dp"] is Mode.O
    assert off.placement("params").residency is Residency.DEVICE
    assert inf.placement("params").residency is Residency.NVME
    assert inf.placement("params").prefetch == 2


def test_shorthand_O_defaults_to_host():
    plan = plan_of("strategy s = data(R, O, S, R)\nplan p { dp: s }")
    assert plan.placement("optimizer").residency is Residency.HOST


def test_plan_level_placement_overrides_one_axis():
    plan = plan_of("plan p { dp: ddp tp: megatron_tp grads: {dp: S} }", mesh="dp = 2 tp = 2",
                   imports="from std.data import ddp\nfrom std.tensor import megatron_tp")
    assert modes(plan, "grads") == {"dp": Mode.S, "tp": Mode.S}
    assert modes(plan, "params") == {"dp": Mode.R, "tp": Mode.S}


def test_plan_extends_plan():
    src = ("plan base { dp: zero3 }\n"
           "plan tuned extends base { params: S* (prefetch = 3) recompute = selective }")
    plan = plan_of(src, imports="from std.data import zero3", name="tuned")
    assert plan.placement("params").prefetch == 3
    assert plan.recompute is ir.Recompute.SELECTIVE
    assert [b.strategy for b in plan.bindings] == ["std.data.zero3"]


def test_overrides_are_carried_in_order():
    src = ("plan p { dp: ddp tp: megatron_sp\n"
           "  override grads[norms]: reduce over (dp)\n"
           "  override grads[experts]: divide by dp * 2\n"
           "  override loss: per_device_mean }")
    plan = plan_of(src, mesh="dp = 4 tp = 2", imports="from std.data import ddp\nfrom std.tensor import megatron_sp")
    first, second, third = plan.overrides
    assert (first.target, first.group, first.verb, first.axes) == ("grads", "norms", "reduce", ("dp",))
    assert second.by == ir.Op("*", (ir.Sym("dp"), ir.const(2)))
    assert (third.target, third.verb, third.axes) == ("loss", "per_device_mean", None)


def test_units_are_exact_bytes():
    spec = load_string("let a = 80 GiB\nlet b = 1.5 GB\nlet c = 3 KiB / 1 KB\n", "u.place")
    values = spec.binding_map
    assert values["a"] == ir.Const(Fraction(80 * 2**30))
    assert values["b"] == ir.Const(Fraction(1_500_000_000))
    dims = dict(spec.dims)
    assert (dims["a"], dims["b"], dims["c"]) == (ir.Dim.BYTES, ir.Dim.BYTES, ir.Dim.COUNT)


def test_scientific_numbers_are_exact():
    spec = load_string("let a = 7.5e9\nlet b = 1.25e-3\nlet c = 70_000\n", "n.place")
    v = spec.binding_map
    assert v["a"].value == 7_500_000_000
    assert v["b"].value == Fraction(1, 800)
    assert v["c"].value == 70000


def test_questions_are_typed():
    spec = load_string(
        "from std.data import ddp, zero3\n" + HEAD + "mesh { dp = 8 }\nplan a { dp: ddp }\nplan b { dp: zero3 }\n"
        'assert "fits": memory(b, params) <= 80 GiB\nclaim model_state(a) / model_state(b) == 8\n', "q.place")
    a, c = spec.questions
    assert a.kind == "assert" and a.label == "fits" and a.dim is ir.Dim.BYTES
    assert a.left == ir.Query("memory", "b", "params")
    assert c.kind == "claim" and c.dim is ir.Dim.COUNT


def test_transformer_defaults():
    spec = load_string("model { transformer { hidden = 1024 layers = 2 heads = 16 vocab = 1000 } }\n", "m.place")
    t = spec.model.transformer
    assert t.kv_heads == ir.const(16)
    assert t.ffn == ir.Op("*", (ir.const(4), ir.const(1024)))
    assert (t.norm, t.gated_mlp, t.bias, t.tied_embeddings) == ("layernorm", False, True, False)
    assert spec.model.params is None


def test_ir_is_immutable():
    plan = plan_of("plan p { dp: ddp }", imports="from std.data import ddp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.name = "other"


def test_import_of_a_user_module(tmp_path):
    (tmp_path / "layouts.place").write_text("strategy mine = data(S*, S, S, R)\n")
    src = "import layouts\n" + HEAD + "mesh { dp = 4 }\nplan p { dp: layouts.mine }\n"
    spec = load_string(src, str(tmp_path / "main.place"), tmp_path)
    assert dict(spec.plan("p").placement("params").modes) == {"dp": Mode.S_STAR}
    assert spec.plan("p").bindings[0].strategy == "layouts.mine"


def test_import_cycle(tmp_path):
    from placement_logic.diagnostics import DiagnosticError

    (tmp_path / "a.place").write_text("import b\n")
    (tmp_path / "b.place").write_text("import a\n")
    with pytest.raises(DiagnosticError) as info:
        load_string("import a\n", str(tmp_path / "main.place"), tmp_path)
    assert "PL112" in {d.code for d in info.value.diagnostics}
