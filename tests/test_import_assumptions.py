"""Imports that state what they assumed: link classes from the devices per node and the
framework's rank order, the keys read and dropped (with why), a Hugging Face Trainer
DeepSpeed config's "auto" values filled by the Trainer's rules or all reported at once.
Expectations are derived by hand from the configuration text written here."""

from __future__ import annotations

import io
import json

import pytest

from placement_logic.cli import main
from placement_logic.frontend.loader import load_string


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _links(spec_text: str) -> dict[str, tuple[int, str | None]]:
    spec = load_string(spec_text, "<import>")
    plan = spec.plans[0]
    return {a.name: (int(a.size.value), a.link) for a in plan.mesh.axes}


LAUNCH = """#!/bin/bash
torchrun --nproc_per_node 4 --nnodes 16 --master_addr node0 pretrain_gpt.py \\
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --context-parallel-size 2 \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --lr 3e-4 --train-iters 1000 \\
    --padded-vocab-size 128256 --seq-length 8192 --micro-batch-size 1 --global-batch-size 256 --bf16 \\
    --position-embedding-type rope
"""


def test_a_launch_line_gives_the_devices_and_the_node_size(tmp_path):
    """16 nodes × 4 processes = 64 devices; tensor 2 × context 2 = 4 ranks fill a 4-device
    node; data 64 / (2 · 4 · 2) = 4 and pipeline 4 cross nodes. A continued shell line
    (backslash, newline) is one line: the tensor size after it is read."""
    f = tmp_path / "launch.sh"
    f.write_text(LAUNCH)
    status, out, err = _run(["import", "megatron", str(f)])
    assert status == 0, err
    assert _links(out) == {"dp": (4, "inter_node"), "cp": (2, "intra_node"), "tp": (2, "intra_node"),
                           "pp": (4, "inter_node")}
    assert "assumed: 4 devices per node (the launch line's --nproc_per_node)" in err
    assert "# assumed: 4 devices per node" in out
    # --master_addr, --lr and --train-iters are not read; each is listed with why under --verbose
    assert "read 14 arguments, dropped 3 (--verbose lists them, each with why)" in err
    _, _, verbose = _run(["import", "megatron", str(f), "--verbose"])
    dropped = [line.split(":")[1].strip() for line in verbose.splitlines() if line.startswith("dropped:")]
    assert dropped == ["--master_addr", "--lr", "--train-iters"]
    read = next(line for line in verbose.splitlines() if line.startswith("read: "))
    assert "--tensor-model-parallel-size" in read and "--nproc_per_node" in read


def test_gpus_per_node_wins_and_a_pair_that_does_not_fit_crosses_nodes(tmp_path):
    """Two devices per node: tensor 2 fills it; context's groups (tensor × context = 4) cross."""
    f = tmp_path / "launch.sh"
    f.write_text(LAUNCH)
    status, out, err = _run(["import", "megatron", str(f), "--gpus-per-node", "2"])
    assert status == 0, err
    assert _links(out) == {"dp": (4, "inter_node"), "cp": (2, "inter_node"), "tp": (2, "intra_node"),
                           "pp": (4, "inter_node")}
    assert "2 devices per node (--gpus-per-node, over the launch line's --nproc_per_node 4)" in err


def test_the_default_node_is_stated(tmp_path):
    """No launch line: 8 devices per node, said to be the default. Tensor 8 fills a node."""
    f = tmp_path / "args"
    f.write_text("--tensor-model-parallel-size 8 --num-layers 2 --hidden-size 64 --num-attention-heads 8 "
                 "--padded-vocab-size 128 --seq-length 64 --position-embedding-type rope")
    status, out, err = _run(["import", "megatron", str(f), "--devices", "32"])
    assert status == 0, err
    assert _links(out) == {"dp": (4, "inter_node"), "tp": (8, "intra_node")}
    assert "assumed: 8 devices per node (the default" in err


def test_launch_line_and_devices_that_disagree(tmp_path):
    f = tmp_path / "launch.sh"
    f.write_text(LAUNCH)
    status, _, err = _run(["import", "megatron", str(f), "--devices", "32"])
    assert status == 2
    # --nnodes is on line 2, after "torchrun --nproc_per_node 4 " (27 characters)
    assert f"{f}:2:29: error: the launch line starts --nnodes 16 × --nproc_per_node 4 = 64 processes, not --devices " \
           "32 [PL162]" in err


@pytest.mark.parametrize("devices, link", [(8, "intra_node"), (16, "inter_node")])
def test_deepspeed_data_axis_inside_one_node_or_across(tmp_path, devices, link):
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    status, out, err = _run(["import", "deepspeed", str(f), "--devices", str(devices), "--params", "1000000"])
    assert status == 0, err
    assert _links(out) == {"dp": (devices, link)}
    assert "attention without flash_attention and no recompute" in err


TRAINER = """{
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "train_batch_size": "auto",
  "gradient_clipping": "auto",
  "bf16": {"enabled": "auto"},
  "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
"""


def _trainer(tmp_path, *options):
    f = tmp_path / "ds.json"
    f.write_text(TRAINER)
    return f, _run(["import", "deepspeed", str(f), "--devices", "16", "--params", "1000000", *options])


def _model(out: str) -> tuple:
    spec = load_string(out, "<import>")
    m = spec.plans[0].model
    return tuple(int(v.value) for v in (m.microbatch, m.microbatches, m.bytes_params, m.bytes_grads))


def test_every_unfilled_auto_is_reported_at_once_each_located(tmp_path):
    f, (status, out, err) = _trainer(tmp_path)
    assert status == 2 and out == ""
    assert err.count("[PL160]") == 1
    assert (f'{f}:2:3: error: 5 "auto" values the options do not fill: train_micro_batch_size_per_gpu, '
            "gradient_accumulation_steps, train_batch_size, bf16.enabled, fp16.enabled [PL160]") in err
    for where in (f'{f}:2:3: train_micro_batch_size_per_gpu', f'{f}:3:3: gradient_accumulation_steps',
                  f'{f}:4:3: train_batch_size', f'{f}:6:12: bf16.enabled', f'{f}:7:12: fp16.enabled'):
        assert where in err
    # the dropped keys (gradient_clipping, the optimizer's, the buckets) may stay "auto"
    assert "gradient_clipping" not in err and "reduce_bucket_size" not in err


def test_auto_filled_by_the_trainers_rules(tmp_path):
    """micro 4, accumulation 8 on 16 devices: train_batch_size 4 · 8 · 16 = 512; --bf16 gives
    2-byte weights with 2-byte gradients and the 12-byte Adam state."""
    _, (status, out, err) = _trainer(tmp_path, "--micro-batch", "4", "--grad-accum", "8", "--bf16")
    assert status == 0, err
    assert _model(out) == (4, 8, 2, 2)
    assert 'train_batch_size "auto" = 4 × 8 × 16 devices = 512' in err
    assert 'bf16.enabled "auto" = true' in err and 'fp16.enabled "auto" = false' in err


def test_auto_accumulation_derived_from_the_global_batch(tmp_path):
    """global 512 over micro 4 × 16 devices: 8 microbatches; --fp32 gives 4-byte widths."""
    _, (status, out, err) = _trainer(tmp_path, "--global-batch", "512", "--micro-batch", "4", "--fp32")
    assert status == 0, err
    assert _model(out) == (4, 8, 4, 4)
    assert 'gradient_accumulation_steps "auto" = 8' in err


def test_a_config_number_an_option_contradicts(tmp_path):
    f = tmp_path / "ds.json"
    f.write_text('{\n  "zero_optimization": {"stage": 2},\n  "train_micro_batch_size_per_gpu": 2\n}\n')
    status, _, err = _run(["import", "deepspeed", str(f), "--devices", "8", "--params", "1000", "--micro-batch", "4"])
    assert status == 2
    assert f"{f}:3:3: error: train_micro_batch_size_per_gpu is 2 in the config but 4 from --micro-batch [PL161]" in err


def test_deepspeed_keys_read_and_dropped_each_with_why(tmp_path):
    _, (status, _, err) = _trainer(tmp_path, "--micro-batch", "1", "--grad-accum", "1", "--bf16", "--verbose")
    assert status == 0, err
    lines = err.splitlines()
    read = set(next(x for x in lines if x.startswith("read: "))[6:].split(", "))
    buckets = {"zero_optimization." + k for k in (
        "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance")}
    assert read == {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                    "bf16.enabled", "fp16.enabled", "zero_optimization.stage"} | buckets
    dropped = {x.split(": ")[1]: x.split(": ", 2)[2] for x in lines if x.startswith("dropped: ")}
    # every other key of the document, hand-listed
    assert set(dropped) == {
        "gradient_clipping", "fp16.loss_scale", "fp16.initial_scale_power", "optimizer.type", "optimizer.params.lr",
        "optimizer.params.weight_decay", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "steps_per_print", "wall_clock_breakdown"}
    assert "read 13 keys, dropped 9" in err
    # "auto" bucket sizes need the model's hidden size (here --params only): DeepSpeed's defaults, said so
    assert 'reduce_bucket_size "auto": the Trainer sets hidden² from the model' in err
    assert dropped["gradient_clipping"].endswith('("auto": the Trainer fills it at run time)')
    assert all(why for why in dropped.values())


def test_torchtitan_keys_read_and_dropped(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[job]\ndump_folder = "./out"\n\n[model]\nname = "llama3"\n\n[training]\nlocal_batch_size = 2\n'
                 'seq_len = 2048\nsteps = 1000\n\n[parallelism]\ndata_parallel_shard_degree = -1\n'
                 "tensor_parallel_degree = 4\n")
    status, out, err = _run(["import", "torchtitan", str(f), "--devices", "32", "--params", "1000000", "--verbose"])
    assert status == 0, err
    # tensor 4 inside an 8-device node; data 8 (stride 4, 32 devices) across
    assert _links(out) == {"dp": (8, "inter_node"), "tp": (4, "intra_node")}
    dropped = {x.split(": ")[1] for x in err.splitlines() if x.startswith("dropped: ")}
    assert dropped == {"job.dump_folder", "model.name", "training.steps"}


def test_import_help_describes_all_four_importers():
    status, out, _ = _run(["import", "--help"])
    assert status == 0
    text = " ".join(out.split())
    for words in ("Hugging Face config.json", "DeepSpeed ds_config.json", "Megatron-LM arguments",
                  "torchtitan job.toml", "--gpus-per-node", "--micro-batch", '"auto"'):
        assert words in text, words
    assert "deepspeed, torchtitan: the model's Hugging Face config.json" in text
    assert "deepspeed, megatron, torchtitan: the number of devices" in text
    status, out, _ = _run(["--help"])
    assert "a Hugging Face, DeepSpeed, Megatron-LM or torchtitan configuration" in " ".join(out.split())


@pytest.mark.parametrize("args, word, line, message", [
    # 64 devices, data 64 / 2 = 32: a global batch of 48 is no multiple of 1 × 32
    ("--tensor-model-parallel-size 2\n--global-batch-size 48", "--global-batch-size", 2,
     "--global-batch-size 48 is not a multiple of micro batch 1 × data parallel 32"),
    ("--num-layers 2\n  --tensor-model-parallel-size 3", "--tensor-model-parallel-size", 2,
     "64 devices are not a multiple of tensor 3 × pipeline 1 × context 1"),
    ("--expert-model-parallel-size 3 --num-experts 8", "--expert-model-parallel-size", 1,
     "--expert-model-parallel-size 3 does not divide the data-parallel size 64"),
    ("--recompute-granularity\n\n   partial", "--recompute-granularity", 1,
     "--recompute-granularity 'partial' is not modelled (selective, full)"),
])
def test_megatron_errors_at_the_argument(tmp_path, args, word, line, message):
    f = tmp_path / "args"
    f.write_text(args + "\n--num-layers 2 --hidden-size 64 --num-attention-heads 4 --padded-vocab-size 128 "
                 "--seq-length 64 --position-embedding-type rope\n")
    status, _, err = _run(["import", "megatron", str(f), "--devices", "64"])
    text = f.read_text()
    at = text.index(word)
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    assert status == 2
    assert f"{f}:{line}:{col}: error: {message} [PL141]" in err, err


def test_torchtitan_errors_at_the_key(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text("[training]\nlocal_batch_size = 1\n\n[parallelism]\ntensor_parallel_degree = 3\n")
    status, _, err = _run(["import", "torchtitan", str(f), "--devices", "64", "--params", "1000"])
    # the [parallelism] table, line 4, its name from column 2
    assert status == 2 and f"{f}:4:2: error: 64 devices are not a multiple of the degrees given (3) [PL141]" in err
    f.write_text("[parallelism]\ndata_parallel_shard_degree = -1\nexpert_parallel_degree = 3\n")
    status, _, err = _run(["import", "torchtitan", str(f), "--devices", "64", "--params", "1000"])
    assert status == 2 and f"{f}:3:1: error: expert_parallel_degree 3 does not divide" in err
