"""Measurement logic that needs no torch: scaling, realisation, grouping, comparison, rendering."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from fractions import Fraction

import pytest

from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.measure import render
from placement_logic.measure.compare import axes_of_group, compare
from placement_logic.measure.predict import PredictedCollective, Prediction
from placement_logic.measure.realise import Realisation, Unrealised, realise
from placement_logic.measure.session import mesh_sizes, run_bindings
from placement_logic.measure.shape import scale_down


def _realise(path, plan_name):
    spec = load_spec(path)
    plan = spec.plan(plan_name)
    sizes = mesh_sizes(plan, None)
    return realise(plan, sizes, run_bindings(spec, sizes)), spec, plan, sizes


@pytest.mark.parametrize("overrides,divide", [
    ("", 2),  # global-mean loss, no division: the mean
    ("override grads: divide by 1", 2),  # the same, said explicitly
    ("override grads: divide by dp", 4),  # global mean divided again: half the gradient
    ("override loss: per_device_mean", 2),  # per-device means averaged (divided by dp)
    ("override loss: per_device_mean\n  override grads: divide by 1", 1),  # per-device means summed
])
def test_gradient_divisor_follows_the_loss_convention(overrides, divide):
    spec = load_string("from std.data import ddp\nmodel { params = 1e9 }\nmesh { dp = 8 }\n"
                       f"plan p {{\n  dp: ddp\n  {overrides}\n}}\n", file="<t>")
    plan = spec.plan("p")
    r = realise(plan, {"dp": 2}, run_bindings(spec, {"dp": 2}))
    assert r.grad_divide == divide


@pytest.mark.parametrize("path,plan,data,raf", [
    ("examples/library/ddp.place", "ddp", "ddp", True),
    ("examples/library/zero1.place", "zero1", "zero1", True),
    ("examples/library/zero2.place", "zero2", "zero2", True),
    ("examples/library/zero3.place", "zero3", "fsdp", True),
    ("examples/library/fsdp_full_shard.place", "fsdp_full_shard", "fsdp", True),
    ("examples/library/fsdp_shard_grad_op.place", "fsdp_shard_grad_op", "fsdp", False),
    ("examples/library/hybrid_shard.place", "hybrid_shard", "hsdp", True),
], ids=lambda x: str(x))
def test_data_strategies_map_to_pytorch(path, plan, data, raf):
    r, *_ = _realise(path, plan)
    assert isinstance(r, Realisation)
    assert (r.data, r.reshard_after_forward) == (data, raf)
    # ZeRO-1 and ZeRO-2 are realised as the ZeRO paper states them: no approximation is left
    assert not r.approximations


@pytest.mark.parametrize("path,plan,why", [
    ("examples/library/zero_offload.place", "zero_offload", "offloaded"),
    ("examples/models/deepseek_v3.place", "ep64", "latent attention (MLA)"),
    ("examples/models/mixtral_8x7b.place", "moe", "no tensor or pipeline axis"),
    ("examples/bugs/zero2_pipeline_no_buffer.place", "zero2_with_pipeline", "no_accumulation_buffer"),
    ("examples/bugs/sp_bias_grads.place", "sp_biases_dp_only", "nothing to act on"),
    ("examples/safe/compositions.place", "megatron_4d", "context parallelism is realised only"),
    ("examples/bugs/overflow_not_agreed.place", "overflow_local", "overflow"),
    # a learned position table the harness's model does not have: refused, never run without it
    ("examples/models/gpt3_175b.place", "megatron", "position_embeddings"),
    ("examples/bugs/moe_aux_loss_accumulation.place", "pipelined", "loss terms besides the language-model loss"),
    # DDP over tensor parallelism holds local shards: clip_grad_norm_ there is each rank's own norm
    ("examples/safe/tp_clip_duplicate_filter.place", "tp_clip_filtered", "clip norm over the tensor axis"),
])
def test_unrealisable_plans_say_why(path, plan, why):
    r, *_ = _realise(path, plan)
    assert isinstance(r, Unrealised)
    assert any(why in reason for reason in r.reasons)


def test_bug_overrides_are_realised():
    path = "examples/measure/grad_sync_bugs.place"
    assert _realise(path, "ddp_no_allreduce")[0].grad_reduce == "none"
    # per-device-mean loss summed and divided by 1: the reduced sum is divided by 1 (dp=2 is right)
    assert _realise(path, "ddp_sum_not_mean")[0].grad_divide == 1
    assert _realise(path, "ddp_ok")[0].grad_divide == 2
    assert _realise(path, "zero3_local_clip")[0].clip == "local"
    assert _realise(path, "zero3_clip_ok")[0].clip == "global"
    assert _realise(path, "ddp_ok")[0].optimizer == "sgd_momentum"  # optimizer = 4 bytes


SPEC = """
model {
  transformer { hidden = 8192 layers = 80 heads = 64 kv_heads = 8 ffn = 28672 vocab = 32000
                gated_mlp norm = rmsnorm bias = false }
  seq = 2048 microbatch = 1
}
mesh { dp = 8 tp = 8 }
plan p { dp: fsdp_full_shard tp: megatron_tp }
"""


def test_scaled_shape_keeps_structure_and_divides():
    spec = load_string("from std.data import fsdp_full_shard\nfrom std.tensor import megatron_tp\n" + SPEC, file="<t>")
    plan = spec.plan("p")
    sizes = {"dp": 2, "tp": 2}
    sh = scale_down(plan, run_bindings(spec, sizes), sizes, "tp")
    assert (sh.gated_mlp, sh.norm, sh.bias) == (True, "rmsnorm", False)
    assert sh.heads // sh.kv_heads == 64 // 8  # GQA group size kept
    # ffn/hidden kept up to rounding ffn to a multiple of the device count (4)
    assert abs(Fraction(sh.ffn, sh.hidden) - Fraction(28672, 8192)) <= Fraction(4, sh.hidden)
    for dim in (sh.hidden, sh.ffn, sh.vocab, sh.qkv_out):
        assert dim % 4 == 0  # every sharded dimension splits over dp × tp without padding
    assert sh.kv_heads % 2 == 0 and sh.seq % 2 == 0


def test_param_count_brute_force():
    """TinyShape.param_count against a count of every weight written out by hand."""
    spec = load_spec("examples/library/ddp.place")
    sh = scale_down(spec.plan("ddp"), spec.binding_map, {"dp": 2}, None)
    h, f, v, L = sh.hidden, sh.ffn, sh.vocab, sh.layers
    d = h // sh.heads
    per_layer = (
        2 * (h + h)  # two layernorms, weight + bias
        + h * (sh.heads * d) + sh.heads * d  # q
        + 2 * (h * (sh.kv_heads * d) + sh.kv_heads * d)  # k, v
        + h * h + h  # output projection
        + h * f + f + f * h + h  # MLP
    )
    assert sh.param_count() == v * h + L * per_layer + 2 * h + v * h


@pytest.mark.parametrize("sizes", [(2,), (2, 2), (2, 3, 2)])
def test_axes_of_group_brute_force(sizes):
    names = tuple("abc"[: len(sizes)])
    mesh = tuple(zip(names, sizes))
    grid = list(itertools.product(*(range(n) for n in sizes)))  # row-major order = rank order
    for _rank, coords in enumerate(grid):
        for k in range(1, len(names) + 1):
            for axes in itertools.combinations(names, k):
                group = tuple(r for r, c in enumerate(grid)
                              if all(c[i] == coords[i] for i, a in enumerate(names) if a not in axes))
                assert axes_of_group(group, dict(zip(names, coords)), mesh) == axes


def _result(rank, held, colls, **extra):
    base = {"rank": rank, "coords": {"dp": rank}, "held": {k: {"storage": v, "elements": v} for k, v in held.items()},
            "collectives": [colls], "param_count": 100, "param_tensors": 4, "tensor_replicated_param_bytes": 0,
            "losses": [1.0], "param_abs_diff": 0.0, "param_rel_diff": 0.0, "param_worst": "w", "loss_abs_diff": 0.0,
            "loss_rel_diff": 0.0, "fingerprint": 1.0}
    base.update(extra)
    return base


def test_stand_in_collectives_are_mismatches_not_explanations():
    """A collective of another kind never stands in for the predicted one: DDP's all-reduce for
    ZeRO-1's reduce-scatter and a broadcast for its all-gather are two differing rows each."""
    r = Realisation("z", (("dp", 2),), "x", data="zero1", data_axes=("dp",))
    pred = Prediction("test", Fraction(100), (("params", Fraction(400)), ("grads", Fraction(400)),
                                              ("optimizer", Fraction(400))),
                      (PredictedCollective("reduce_scatter", ("dp",), Fraction(400), Fraction(1), "grad_sync"),
                       PredictedCollective("all_gather", ("dp",), Fraction(400), Fraction(1), "refresh")),
                      byte_widths=(("params", 4), ("grads", 4), ("optimizer", 8), ("activations", 4)))
    colls = [{"kind": "all_reduce", "ranks": [0, 1], "bytes": 400, "phase": "backward"},
             {"kind": "broadcast", "ranks": [0, 1], "bytes": 300, "phase": "optimizer"},
             {"kind": "broadcast", "ranks": [0, 1], "bytes": 100, "phase": "optimizer"}]
    held = {"params": 400, "grads": 400, "optimizer": 400, "optimizer_step_counters": 4}
    results = [_result(i, held, colls, optimizer_param_tensors=1) for i in range(2)]
    shape = scale_down(load_spec("examples/library/zero1.place").plan("zero1"), {}, {"dp": 2}, None)
    rows, eq = compare(pred, r, results, shape)
    by = {row.quantity.split(",")[0]: row for row in rows}
    assert [by[k].status for k in ("reduce_scatter over dp", "all_gather over dp", "all_reduce over dp",
                                   "broadcast over dp")] == ["differs"] * 4
    assert by["optimizer held per rank"].status == "match"
    counters = by["optimizer step counters per rank"]
    assert (counters.status, counters.mechanism) == ("explained", "optimizer-step-counters")
    # the same run measuring the plan's own collectives matches row for row
    colls[:] = [{"kind": "reduce_scatter", "ranks": [0, 1], "bytes": 400, "phase": "backward"},
                {"kind": "all_gather", "ranks": [0, 1], "bytes": 400, "phase": "optimizer"}]
    rows, _ = compare(pred, r, results, shape)
    assert [row.status for row in rows] == ["match", "match", "match", "match", "explained", "match", "match"]
    # an unexplained extra collective is reported as a difference
    results[0]["collectives"][0].append({"kind": "all_to_all", "ranks": [0, 1], "bytes": 8, "phase": "forward"})
    rows, _ = compare(pred, r, results, shape)
    assert [row.status for row in rows if "all_to_all" in row.quantity] == ["differs"]
    # a one-time set-up collective (DDP's bucket rebuild) is not part of the compared step
    results[0]["collectives"][0][-1]["phase"] = results[1]["collectives"][0][-1]["phase"] = "setup"
    rows, _ = compare(pred, r, results, shape)
    assert not [row for row in rows if "all_to_all" in row.quantity]



def test_allocator_peak_is_reported_only_where_the_platform_has_one():
    """CPU ranks report no allocator peak (None): no peak row, a note instead, never a 0. CUDA
    ranks report one: a row beside the engine's peak, outside the outcome."""
    from placement_logic.measure.compare import peak_note, peak_rows

    pred = Prediction("test", Fraction(100), (("params", Fraction(400)),), (), device_peak=Fraction(2000))
    cpu = [{"allocator_peak": None}, {"allocator_peak": None}]
    assert peak_rows(pred, cpu) == [] and peak_note(cpu) and "not available" in peak_note(cpu)[0]
    gpu = [{"allocator_peak": 2100}, {"allocator_peak": 1900}]
    (row,) = peak_rows(pred, gpu)
    assert (row.group, row.status, row.predicted, row.measured, row.per_rank) == (
        "peak", "reported", 2000, 2100, (2100, 1900))
    assert peak_note(gpu) == ()
    # one rank without statistics: nothing is compared
    assert peak_rows(pred, [{"allocator_peak": 5}, {"allocator_peak": None}]) == []
    # no number from the engine at the run's sizes: no row either
    assert peak_rows(Prediction("test", Fraction(1), (), ()), gpu) == []

def test_measure_without_torch_is_an_input_error(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    import io

    out, err = io.StringIO(), io.StringIO()
    status = main(["measure", "examples/library/ddp.place", "--plan", "ddp"], out=out, err=err)
    assert status == 2 and "[PL601]" in err.getvalue()


def test_bad_devices_is_a_diagnostic():
    import io

    out, err = io.StringIO(), io.StringIO()
    status = main(["measure", "examples/library/hybrid_shard.place", "--plan", "hybrid_shard", "--devices", "2"],
                  out=out, err=err)
    assert status == 2 and "[PL602]" in err.getvalue()


def test_unrealised_plan_exit_status_and_json():
    import io

    out, err = io.StringIO(), io.StringIO()
    status = main(["measure", "examples/library/zero_offload.place", "--plan", "zero_offload", "--format", "json",
                   "--no-check"],
                  out=out, err=err)
    doc = json.loads(out.getvalue())
    assert status == 4
    assert doc["schema_version"] == render.SCHEMA_VERSION and doc["tool"] == "placement-logic"
    plan = doc["plans"][0]
    assert plan["outcome"] == "unrealised" and plan["rows"] == [] and plan["reasons"]


def test_importing_the_package_does_not_import_torch():
    code = ("import sys, placement_logic.cli, placement_logic.commands.measure, placement_logic.measure.session, "
            "placement_logic.measure.validate; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("path,plan,schedule,chunks", [
    ("examples/library/gpipe.place", "gpipe", "gpipe", 1),
    ("examples/library/one_f_one_b.place", "one_f_one_b", "1f1b", 1),
    ("examples/library/interleaved_1f1b.place", "interleaved_1f1b", "interleaved", 4),
])
def test_pipeline_schedules_map_to_pipelining(path, plan, schedule, chunks):
    r, spec, p, sizes = _realise(path, plan)
    assert (r.schedule, r.chunks, r.pipeline_axis, r.data) == (schedule, chunks, "pp", "ddp")
    sh = scale_down(p, run_bindings(spec, sizes), sizes, None, r.stages, r.chunks)
    assert sh.layers % (r.stages * r.chunks) == 0 and sh.microbatches == 2 * r.stages


@pytest.mark.parametrize("path,plan,field,value", [
    ("examples/bugs/grad_reduced_twice.place", "ddp_plus_manual_allreduce", "grad_reduce", "twice"),
    ("examples/bugs/zero1_no_regather.place", "zero1_forgets_allgather", "regather", False),
    ("examples/bugs/tp_clip_local_shard.place", "tp_local_clip", "clip", "local"),
    ("examples/bugs/dp_mean_of_means.place", "mean_of_device_means", "loss", "per_device_mean"),
])
def test_catalogue_bugs_are_realised(path, plan, field, value):
    r, *_ = _realise(path, plan)
    assert isinstance(r, Realisation) and getattr(r, field) == value


@pytest.mark.parametrize("layers,p,v", [(2, 2, 1), (8, 2, 4), (12, 3, 2), (8, 4, 1)])
def test_stage_param_count_brute_force(layers, p, v):
    """Each rank's parameters, counted by listing which virtual stage holds each part."""
    spec = load_spec("examples/library/ddp.place")
    sh = scale_down(spec.plan("ddp"), spec.binding_map, {"dp": 2}, None)
    import dataclasses

    sh = dataclasses.replace(sh, layers=layers)
    h, V = sh.hidden, sh.vocab
    owner = {}  # part -> pipeline rank
    per = layers // (p * v)
    for block in range(layers):
        owner[f"block{block}"] = (block // per) % p
    owner["embed"], owner["final"] = 0, p - 1
    size = {f"block{b}": sh.block_params() for b in range(layers)}
    size["embed"] = V * h
    size["final"] = 2 * h + V * h  # layernorm weight and bias, untied head
    for rank in range(p):
        assert sh.stage_param_count(rank, p, v) == sum(n for part, n in size.items() if owner[part] == rank)
    assert sum(sh.stage_param_count(k, p, v) for k in range(p)) == sh.param_count()


@pytest.mark.parametrize("p,v", [(2, 1), (2, 4), (3, 2), (4, 1)])
def test_point_to_point_edges_brute_force(p, v):
    """Sends and receives per rank and phase, counted on the chain of virtual stages."""
    from placement_logic.measure.collective_rows import edge_share

    chain = p * v
    for rank in range(p):
        fwd_sent = sum(1 for k in range(chain - 1) if k % p == rank)
        fwd_recv = sum(1 for k in range(1, chain) if k % p == rank)
        # backward gradients flow k -> k-1: stage k sends if k > 0, receives if k < chain-1
        assert edge_share("p2p sent, forward", rank, p, v) * v == fwd_sent
        assert edge_share("p2p received, forward", rank, p, v) * v == fwd_recv
        assert edge_share("p2p sent, backward", rank, p, v) * v == fwd_recv
        assert edge_share("p2p received, backward", rank, p, v) * v == fwd_sent


@pytest.mark.parametrize("path,plan,data,tensor,pipeline,recompute", [
    ("examples/safe/pipeline_parallel.place", "gpipe", "ddp", None, "pp", "none"),  # tied across stages
    ("examples/llama70b_3d.place", "plain_3d", "ddp", "tp", "pp", "full"),
    ("examples/models/llama3_70b.place", "three_d", "zero1", "tp", "pp", "none"),
    ("examples/library/selective_recompute.place", "selective_recompute", "ddp", "tp", None, "selective"),
    ("examples/models/qwen25_7b.place", "zero2_tp4", "zero2", "tp", None, "none"),
])
def test_three_axes_and_recompute_are_realised(path, plan, data, tensor, pipeline, recompute):
    r, *_ = _realise(path, plan)
    assert isinstance(r, Realisation), r
    assert (r.data, r.tensor_axis, r.pipeline_axis, r.recompute) == (data, tensor, pipeline, recompute)
    assert not r.approximations


def test_zero2_under_a_pipeline_one_chunk_per_rank():
    src = ("from std.data import zero2\nfrom std.pipeline import gpipe, interleaved_1f1b\n"
           "model { transformer { hidden = 64 layers = 4 heads = 4 ffn = 256 vocab = 128 } seq = 16 "
           "microbatch = 1 microbatches = 4 }\nmesh { dp = 2 pp = 2 }\nplan p { dp: zero2 pp: gpipe }\n"
           "plan q { dp: zero2 pp: interleaved_1f1b(v = 2) }\n")
    spec = load_string(src, file="<t>")
    sizes = {"dp": 2, "pp": 2}
    r = realise(spec.plan("p"), sizes, run_bindings(spec, sizes))
    assert isinstance(r, Realisation) and (r.data, r.schedule) == ("zero2", "gpipe")
    r = realise(spec.plan("q"), sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised) and any("one model chunk per rank" in x for x in r.reasons)


@pytest.mark.parametrize("path,plan,fields", [
    ("examples/library/zeropp_dp.place", "zeropp_dp",
     {"data": "zeropp", "outer": "ddp", "schedule": "zeropp", "chunks": 2, "unit": 4, "data_axes": ("intra", "inter")}),
    ("examples/library/zeropp_zero1.place", "zeropp_zero1", {"data": "zeropp", "outer": "zero1"}),
    ("examples/library/context_parallel.place", "context_parallel", {"data": "ddp", "context_axis": "cp"}),
    ("examples/bugs/cp_tokens_dp_only.place", "tokens_counted_over_dp", {"context_axis": "cp", "tokens_over": ("dp",)}),
    ("examples/safe/context_expert.place", "long_context", {"data": "fsdp", "context_axis": "x", "expert_axis": None}),
    ("examples/library/expert_parallel.place", "expert_parallel", {"data": "ddp", "expert_axis": "ep"}),
    ("examples/models/qwen15_moe_a27b.place", "moe", {"data": "zero1", "expert_axis": "ep"}),
    # per-device-mean loss: the experts' sum divided by dp (2), where dp × ep (4) is right
    ("examples/bugs/expert_grads_wrong_divisor.place", "experts_divided_by_dp",
     {"expert_divide": 2, "grad_divide": 4, "loss": "per_device_mean"}),
    ("examples/safe/pipeline_parallel.place", "zero2_pipeline", {"data": "zero2", "schedule": "1f1b"}),
    ("examples/bugs/grad_accum_mean_of_means.place", "mean_of_microbatch_means", {"loss": "per_microbatch_mean"}),
    ("examples/bugs/tied_embedding_not_summed.place", "tied_not_summed", {"tie_reduce": False}),
    ("examples/bugs/tied_embedding_norm_twice.place", "tied_counted_twice", {"clip": "global", "clip_double_count": True}),
    ("examples/bugs/pipeline_clip_per_stage.place", "clip_without_stages", {"clip": "stage"}),
    ("examples/bugs/norms_reduced_over_tp.place", "tp_norms_reduced_twice",
     {"tensor_reduced_again": ("norms",), "tensor_unreduced": ()}),
    ("examples/bugs/sp_layernorm_grads.place", "sp_norms_dp_only",
     {"tensor_unreduced": ("norms",), "tensor_reduced_again": ()}),
    ("examples/bugs/dropout_seed_tp.place", "tp_seeds_vary", {"dropout": "vary"}),
    ("examples/bugs/sp_dropout_same_seed.place", "sp_same_seed", {"dropout": "same"}),
])
def test_further_plans_are_realised(path, plan, fields):
    r, *_ = _realise(path, plan)
    assert isinstance(r, Realisation), r
    for name, want in fields.items():
        assert getattr(r, name) == want, (name, getattr(r, name))


TP_CLIP = ("from std.data import ddp, zero3\nfrom std.tensor import megatron_tp\nmodel {{ params = 1e9 }}\n"
           "mesh {{ dp = 2\n tp = 2 }}\nplan p {{\n  dp: {data}\n  tp: megatron_tp\n  {overrides}\n}}\n")


@pytest.mark.parametrize("data,overrides,missing", [
    # the norm weights and biases are whole on every tp rank: a plain sum over tp counts them twice,
    # which the harness's clip_grad_norm_ on DTensors (a duplicate filter) does not do
    ("zero3", "override clip_norm: reduce over (dp, tp)", "norms over tp"),
    ("zero3", "override clip_norm: reduce over (dp, tp)\n  override clip_norm[norms]: dedupe over (tp)",
     "biases over tp"),
    # DDP gradients are whole on every dp rank: summing the norm over dp counts every copy
    ("ddp", "override clip_norm: reduce over (dp, tp)\n  override clip_norm: dedupe over (tp)",
     "biases, dense, embedding, norms over dp"),
])
def test_an_unfiltered_norm_sum_is_not_realised_as_a_filtered_one(data, overrides, missing):
    """A written clip-norm reduction is a plain sum; the harness's clip counts every parameter once, so it
    is reported unrealised (with the copies it would miscount) unless the plan states the filter."""
    spec = load_string(TP_CLIP.format(data=data, overrides=overrides), file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised), r
    assert any("plain sum" in x and missing in x for x in r.reasons), r.reasons


def test_a_stated_filter_is_realised_as_the_harness_clip():
    text = TP_CLIP.format(data="zero3", overrides="override clip_norm: reduce over (dp, tp)\n"
                                                  "  override clip_norm: dedupe over (tp)")
    spec = load_string(text, file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    assert isinstance(r, Realisation) and r.clip == "global", r


def test_zeropp_needs_one_unit_per_step():
    src = open("examples/library/zeropp_dp.place").read().replace("U = 4", "U = 2")
    spec = load_string(src, file="<t>")
    sizes = {"stage": 2, "intra": 2, "inter": 2}
    r = realise(spec.plan("zeropp_dp"), sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised) and any("one scheduling unit per step" in x for x in r.reasons)


@pytest.mark.parametrize("path,plan", [
    ("examples/library/expert_parallel.place", "expert_parallel"),
    ("examples/models/qwen15_moe_a27b.place", "moe"),
    ("examples/safe/context_expert.place", "moe"),
])
def test_mixture_of_experts_param_count_brute_force(path, plan):
    """The tiny MoE model's count, written out weight by weight, equals the cost engine's Ψ."""
    from placement_logic.measure.predict import predict

    r, spec, p, sizes = _realise(path, plan)
    sh = scale_down(p, run_bindings(spec, sizes), sizes, None, 1, 1, r.expert_axis)
    h, E, fe, fs = sh.hidden, sh.experts, sh.expert_ffn, sh.shared_expert_ffn
    mats, b = (3 if sh.gated_mlp else 2), int(sh.bias)
    col = lambda w: (2 * w if sh.gated_mlp else w) * b  # noqa: E731 - column biases
    norm = (2 if sh.norm == "layernorm" else 1) * h
    attention = 2 * norm + h * sh.qkv_out + sh.qkv_out * int(sh.has_qkv_bias) + h * h + b * h
    experts = E * (mats * h * fe + col(fe) + b * h)
    shared = sh.shared_experts * (mats * h * fs + col(fs))
    router = h * E + E * int(sh.bias or sh.router_bias) + h * int(sh.shared_expert_gate)
    total = sh.vocab * h + sh.layers * (attention + experts + shared + router) + norm + sh.vocab * h
    assert sh.param_count() == total
    assert predict(spec, p, sh, sizes, r.optimizer).psi == total
    ep = sizes.get(r.expert_axis, 1) if r.expert_axis else 1
    assert E % ep == 0 and (sh.capacity_factor * sh.seq * sh.microbatch * sh.top_k / E).denominator == 1


def test_qkv_only_bias_is_kept_in_the_scaled_model():
    r, spec, plan, sizes = _realise("examples/models/qwen25_7b.place", "zero2_tp4")
    sh = scale_down(plan, run_bindings(spec, sizes), sizes, r.tensor_axis)
    assert (sh.bias, sh.has_qkv_bias) == (False, True)
    h, L = sh.hidden, sh.layers
    # brute force: rmsnorm ×2, fused q/k/v with bias, output projection and gated MLP without biases
    per_layer = 2 * h + h * sh.qkv_out + sh.qkv_out + h * h + h * 2 * sh.ffn + sh.ffn * h
    assert sh.param_count() == sh.vocab * h + L * per_layer + h + sh.vocab * h


@pytest.mark.parametrize("group", [
    "group mlp { placement = {dp: S} }",
    "group norms { tensor = split }",
    "group vision { count = 1000  tensor = whole }",
    "group mlp { grads = {dp: S} }",
])
def test_a_group_block_is_realised_or_the_plan_is_unrealised(group):
    """A group restatement changes the plan; the harness never drops it silently."""
    spec = load_string("from std.data import ddp\nmodel {\n  transformer { hidden = 64  layers = 2  heads = 4  "
                       f"vocab = 128 }}\n  seq = 32\n  microbatch = 2\n  {group}\n}}\nmesh {{ dp = 2 }}\n"
                       "plan p { dp: ddp }\n", file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised)
    assert any(f"group {group.split()[1]}" in reason and "line 6" in reason for reason in r.reasons), r.reasons


def test_a_stated_activation_width_is_realised_or_unrealised():
    spec = load_string("from std.data import ddp\nmodel {\n  transformer { hidden = 64  layers = 2  heads = 4  "
                       "vocab = 128 }\n  seq = 32\n  microbatch = 2\n  bytes { params = 4  grads = 4  optimizer = 8  "
                       "activations = 2 }\n}\nmesh { dp = 2 }\nplan p { dp: ddp }\n", file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised) and any("activations of 2 bytes" in x for x in r.reasons), r
