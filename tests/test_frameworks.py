"""DeepSpeed configs and Megatron-LM arguments in and out.

Oracle: round trips through the framework's own vocabulary (a config imported and exported
again keeps every field that means something to the cost model and the checker), the
placements the library documents for each ZeRO stage and Megatron-LM flag, and the
framework's own batch arithmetic (train_batch_size = micro × accumulation × devices;
global batch = micro × microbatches × data-parallel size)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from placement_logic import ir
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec, load_string

DATA = Path(__file__).resolve().parent / "data" / "frameworks"
ROOT = Path(__file__).resolve().parent.parent


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


ZERO = [
    ({"stage": 0}, ("R", "R", "R")),
    ({"stage": 1}, ("R", "S", "R")),
    ({"stage": 2}, ("R", "S", "S")),
    ({"stage": 3}, ("S*", "S", "S")),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, ("R", "O", "O")),
    ({"stage": 3, "offload_optimizer": {"device": "nvme"}}, ("S*", "O", "O")),
    ({"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, ("S*", "O", "O")),
]


@pytest.mark.parametrize("zero,modes", ZERO, ids=[json.dumps(z) for z, _ in ZERO])
def test_deepspeed_round_trip(tmp_path, zero, modes):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_batch_size": 64,
           "bf16": {"enabled": True}, "zero_optimization": zero}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    status, spec_text, _ = _run(["import", "deepspeed", str(tmp_path / "ds.json"), "--devices", "8",
                                 "--params", "1000000"])
    assert status == 0
    plan = load_string(spec_text).plan("deepspeed")
    got = tuple(plan.placement(s).mode("dp").value for s in (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS))
    assert got == modes
    (tmp_path / "s.place").write_text(spec_text)
    status, back, err = _run(["export", "deepspeed", str(tmp_path / "s.place"), "--plan", "deepspeed"])
    assert status == 0, err
    back = json.loads(back)
    assert back["zero_optimization"] == zero
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "bf16"):
        assert back[key] == cfg[key]


def test_megatron_round_trip_and_the_recipe(tmp_path):
    status, spec_text, _ = _run(["import", "megatron", str(DATA / "megatron_llama70b.args"), "--devices", "256"])
    assert status == 0
    plan = load_string(spec_text).plan("megatron")
    assert [(a.name, a.size.value) for a in plan.mesh.axes] == [("dp", 8), ("tp", 8), ("pp", 4)]
    assert plan.sequence_parallel and plan.recompute is ir.Recompute.SELECTIVE
    assert plan.schedule.kind is ir.ScheduleKind.INTERLEAVED and plan.schedule.chunks.value == 2  # 80/(4·10)
    assert plan.placement(ir.State.OPTIMIZER).mode("dp") is ir.Mode.S  # the distributed optimizer
    assert plan.model.microbatches.value == 64  # 512 / (1 × 8)
    (tmp_path / "m.place").write_text(spec_text)
    status, args, _ = _run(["export", "megatron", str(tmp_path / "m.place"), "--plan", "megatron"])
    assert status == 0
    (tmp_path / "again.args").write_text(args)
    status, again, _ = _run(["import", "megatron", str(tmp_path / "again.args"), "--devices", "256"])
    assert load_string(again).plan("megatron").placements == plan.placements
    assert load_string(again).model == load_string(spec_text).model


def test_exporting_the_llama_example_to_megatron():
    spec = load_spec(ROOT / "examples" / "llama70b_3d.place")
    status, args, err = _run(["export", "megatron", str(ROOT / "examples" / "llama70b_3d.place"),
                              "--plan", spec.plans[0].name])
    assert "--tensor-model-parallel-size 8" in args and "--pipeline-model-parallel-size 4" in args


def test_what_deepspeed_cannot_express_is_listed():
    status, out, err = _run(["export", "deepspeed", str(ROOT / "examples" / "llama70b_3d.place"),
                             "--plan", "megatron_3d"])
    assert status == 1 and "not expressible in deepspeed" in err and "tp" in err


@pytest.mark.parametrize("cfg,words", [
    ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage must be an integer from 0 to 3, not 5"),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, "offload_param needs ZeRO stage 3"),
    ({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 2}, "is not micro batch 2"),
    ({"train_micro_batch_size_per_gpu": 0}, "must be a positive integer"),
])
def test_bad_deepspeed_configs(tmp_path, cfg, words):
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    status, _, err = _run(["import", "deepspeed", str(tmp_path / "ds.json"), "--devices", "8", "--params", "10"])
    assert status == 2 and "[PL141]" in err and words in err and "Traceback" not in err


@pytest.mark.parametrize("args,words", [
    ("--tensor-model-parallel-size 3 --num-layers 2 --hidden-size 8 --num-attention-heads 1", "not a multiple"),
    ("--tensor-model-parallel-size 2", "no --num-layers"),
    ("--num-layers two", "needs a positive integer"),
])
def test_bad_megatron_arguments(tmp_path, args, words):
    (tmp_path / "a.args").write_text(args)
    status, _, err = _run(["import", "megatron", str(tmp_path / "a.args"), "--devices", "8"])
    assert status == 2 and "[PL141]" in err and words in err


def test_import_needs_devices_and_a_model(tmp_path):
    assert _run(["import", "megatron", str(DATA / "megatron_llama70b.args")])[0] == 2
    assert _run(["import", "deepspeed", str(DATA / "ds_zero1.json"), "--devices", "4"])[0] == 2


def test_torchtitan_round_trip(tmp_path):
    """HSDP 2 × (64 / (2·4)) with TP 4: the shard degree -1 takes the rest of the devices; the
    global batch 32 over 16 data ranks of 1 sample is 2 microbatches."""
    hf = ROOT / "tests" / "data" / "hf" / "llama3_8b.json"
    status, spec_text, err = _run(["import", "torchtitan", str(DATA / "torchtitan_llama3_8b.toml"), "--devices", "64",
                                   "--model", str(hf)])
    assert status == 0, err
    spec = load_string(spec_text)
    plan = spec.plan("torchtitan")
    assert [(a.name, a.size.value) for a in plan.mesh.axes] == [("replicate", 2), ("shard", 8), ("tp", 4)]
    assert plan.placement(ir.State.PARAMS).mode("shard") is ir.Mode.S_STAR
    assert plan.placement(ir.State.PARAMS).mode("replicate") is ir.Mode.R
    assert plan.model.microbatches.value == 2 and plan.recompute is ir.Recompute.SELECTIVE
    (tmp_path / "t.place").write_text(spec_text)
    status, toml_text, err = _run(["export", "torchtitan", str(tmp_path / "t.place"), "--plan", "torchtitan"])
    assert status == 0, err
    import tomllib

    back = tomllib.loads(toml_text)
    assert back["parallelism"]["data_parallel_replicate_degree"] == 2
    assert back["parallelism"]["data_parallel_shard_degree"] == 8
    assert back["parallelism"]["tensor_parallel_degree"] == 4
    assert back["training"]["global_batch_size"] == 32 and back["activation_checkpoint"]["mode"] == "selective"


def test_torchtitan_cannot_express_zero1(tmp_path):
    status, _, err = _run(["export", "torchtitan", str(ROOT / "examples" / "llama70b_3d.place"),
                           "--plan", "megatron_3d"])
    assert status == 1 and "(R, S, R, R) over dp: torchtitan's data parallelism places them (R, R, R, R) or " \
        "(S*, S, S, R)" in err


@pytest.mark.parametrize("source,text,extra,words", [
    ("deepspeed", json.dumps({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}),
     ["--params", "1000"], "zero_hpz_partition_size 8"),
    ("megatron", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2 --num-layers 4 "
     "--hidden-size 64 --num-attention-heads 4 --padded-vocab-size 128 --position-embedding-type rope", [],
     "--recompute-method uniform --recompute-num-layers 2"),
    ("megatron", "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block "
     "--recompute-num-layers 1 --num-layers 4 --hidden-size 64 --num-attention-heads 4 --padded-vocab-size 128 "
     "--position-embedding-type rope", [], "--recompute-method block --recompute-num-layers 1: recomputing only 1 of "
     "the 2 layers"),
    ("torchtitan", "[parallelism]\nexpert_parallel_degree = 2\n", ["--params", "1000"], "expert_parallel_degree 2"),
    ("torchtitan", '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n', ["--params", "1000"],
     "selective_ac_option '2'"),
])
def test_what_the_plan_cannot_hold_is_stated(tmp_path, source, text, extra, words):
    """An imported setting without a placement is a comment in the spec, a line on stderr and exit 1."""
    f = tmp_path / "config"
    f.write_text(text)
    status, spec_text, err = _run(["import", source, str(f), "--devices", "8", *extra])
    assert status == 1 and f"not expressed in the plan: {words}" in err
    assert f"# not expressed: {words}" in spec_text
    load_string(spec_text)  # the spec is still usable


@pytest.mark.parametrize("args,recompute", [
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", ir.Recompute.FULL),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 2", ir.Recompute.FULL),
    ("--recompute-granularity selective", ir.Recompute.SELECTIVE),
])
def test_megatron_recompute_methods_the_plan_holds(tmp_path, args, recompute):
    """Uniform over single layers, and block over every layer of a stage (4 layers / 2 stages), are per-layer
    full recompute exactly."""
    (tmp_path / "a.args").write_text(args + " --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64 "
                                     "--num-attention-heads 4 --padded-vocab-size 128 --position-embedding-type rope")
    status, spec_text, err = _run(["import", "megatron", str(tmp_path / "a.args"), "--devices", "4"])
    assert status == 0, err
    assert load_string(spec_text).plan("megatron").recompute is recompute


@pytest.mark.parametrize("flags,grads", [("--bf16", 4), ("--fp16", 2), ("--fp16 --accumulate-allreduce-grads-in-fp32", 4)])
def test_megatron_gradient_width_follows_its_precision(tmp_path, flags, grads):
    (tmp_path / "a.args").write_text(flags + " --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                                     "--padded-vocab-size 128 --position-embedding-type rope")
    status, spec_text, _ = _run(["import", "megatron", str(tmp_path / "a.args"), "--devices", "2"])
    model = load_string(spec_text).model
    assert status == 0 and (model.bytes_params.value, model.bytes_grads.value) == (2, grads)


def test_megatron_defaults_follow_megatron(tmp_path):
    """Learned absolute positions (Megatron-LM's default) with --max-position-embeddings rows, and
    --vocab-size padded to 128 × the tensor size; the global batch counts the expert devices as data."""
    (tmp_path / "a.args").write_text("--tensor-model-parallel-size 2 --expert-model-parallel-size 2 --num-layers 2 "
                                     "--hidden-size 64 --num-attention-heads 4 --vocab-size 50257 "
                                     "--max-position-embeddings 1024 --num-experts 4 --micro-batch-size 2 "
                                     "--global-batch-size 32")
    status, spec_text, err = _run(["import", "megatron", str(tmp_path / "a.args"), "--devices", "8"])
    assert status == 0, err
    spec = load_string(spec_text)
    t = spec.model.transformer
    assert (t.position_embeddings.value, t.vocab.value, t.vocab_multiple.value) == (1024, 50257, 256)
    plan = spec.plan("megatron")
    assert [(a.name, a.size.value) for a in plan.mesh.axes] == [("dp", 2), ("ep", 2), ("tp", 2)]
    assert spec.model.microbatches.value == 4  # 32 / (2 × Megatron-LM's data-parallel size 4)


@pytest.mark.parametrize("freq,fields", [
    ("'([0]*3+[1]*5)'", {"dense_layers": 3}),
    ("2", {"moe_every": 2}),
    ("'[0,1,0,1,0,1,0,1]'", {"moe_every": 2, "moe_offset": 1}),
    ("'([0]*4+[1,0]*2)'", {"moe_every": 2, "dense_layers": 4}),
])
def test_megatron_moe_layer_freq(tmp_path, freq, fields):
    """--moe-layer-freq (an integer k: MoE on layers i with i mod k = 0; or a list of 0/1 per layer)
    becomes dense_layers / moe_every / moe_offset, and goes back out as the same layers."""
    base = ("--num-layers 8 --hidden-size 64 --ffn-hidden-size 256 --num-attention-heads 4 --padded-vocab-size 128 "
            "--position-embedding-type rope --num-experts 4 --moe-layer-freq ")
    (tmp_path / "a.args").write_text(base + freq)
    status, spec_text, err = _run(["import", "megatron", str(tmp_path / "a.args"), "--devices", "1"])
    assert status == 0, err
    t = load_string(spec_text).model.transformer
    got = {k: int(getattr(t, k).value) for k in ("dense_layers", "moe_every", "moe_offset") if getattr(t, k) is not None}
    assert got == fields
    (tmp_path / "s.place").write_text(spec_text)
    status, args, err = _run(["export", "megatron", str(tmp_path / "s.place"), "--plan", "megatron"])
    assert status == 0, err
    (tmp_path / "b.args").write_text(args)
    _, again, _ = _run(["import", "megatron", str(tmp_path / "b.args"), "--devices", "1"])
    assert load_string(again).model.transformer == t


@pytest.mark.parametrize("freq,words", [
    ("'[1,1,0]'", "lists 3 layers, not --num-layers 8"),
    ("'[0]*8'", "no layer an MoE layer"),
    ("'[1,1,0,1,0,0,1,0]'", "not every k-th layer"),
    ("'__import__(\"os\")'", "neither an integer nor a list"),
])
def test_bad_moe_layer_freq(tmp_path, freq, words):
    (tmp_path / "a.args").write_text("--num-layers 8 --hidden-size 64 --num-attention-heads 4 --padded-vocab-size 128 "
                                     "--position-embedding-type rope --num-experts 4 --moe-layer-freq " + freq)
    status, _, err = _run(["import", "megatron", str(tmp_path / "a.args"), "--devices", "1"])
    assert status == 2 and "[PL141]" in err and words in err


def test_the_api_warns_what_the_plan_cannot_hold():
    import warnings

    import placement_logic as pl

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = pl.import_deepspeed({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}, devices=16,
                                   params=10 ** 6, seq=2048)
    assert [str(w.message) for w in caught if "zero_hpz_partition_size 8" in str(w.message)]
    assert spec.model.seq.value == 2048 and spec.plan("deepspeed").placement(ir.State.PARAMS).mode("dp").value == "S*"


LLAMA3_8B = 8_030_261_248  # Meta's model card: 8.03 B parameters (embedding and head untied)


@pytest.mark.parametrize("argv", [
    ["import", "megatron", "examples/configs/megatron_llama3_8b.args", "--devices", "64"],
    ["import", "deepspeed", "examples/configs/ds_zero3.json", "--devices", "64", "--model",
     "examples/configs/llama3_8b.json", "--seq", "8192"],
], ids=["megatron", "deepspeed"])
def test_shipped_configurations_import_check_and_cost(argv, tmp_path, monkeypatch):
    """The README's path from a framework configuration: import, then check proves and cost
    names the exact parameter count and a fit verdict."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    status, _, err = _run(argv + ["-o", "plan.place"])
    assert status == 0, err
    status, out, _ = _run(["check", "plan.place"])
    assert status == 0 and out.rstrip().endswith("PROVED")
    status, out, _ = _run(["cost", "plan.place", "--device", "h100_sxm", "--format", "json"])
    rep = json.loads(out)
    assert rep["model"]["params"]["count"] == LLAMA3_8B
    fit = rep["plans"][0]["fit"]
    # Megatron's recipe (TP 2, selective recompute, flash attention) fits an 80 GiB H100; the
    # DeepSpeed configuration states no attention kernel or checkpointing, so its attention
    # scores at 8,192 tokens do not fit, and cost says so with exit status 1.
    assert fit["fits"] is (argv[1] == "megatron") and status == (0 if argv[1] == "megatron" else 1)
