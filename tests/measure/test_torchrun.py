"""``placement measure --torchrun``: the rank, the job's size, the device and the backend come from
torchrun's environment; the CUDA path (device by LOCAL_RANK, NCCL, the allocator's peak) is checked
here on CPU by standing in for ``torch.cuda``, and the whole path runs for real under torchrun on
CPU processes (gloo) in the slow tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.measure.dist_env import DistEnv, EnvError, device_choice, from_environ, local_env

ENV = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "node0",
       "MASTER_PORT": "29500"}


def test_torchrun_environment_is_read():
    assert from_environ(ENV) == DistEnv(rank=5, world=16, local_rank=1, local_world=8, master_addr="node0",
                                        master_port=29500)
    # LOCAL_WORLD_SIZE absent: one node
    assert from_environ({k: v for k, v in ENV.items() if k != "LOCAL_WORLD_SIZE"} | {"RANK": "1"}).local_world == 16


@pytest.mark.parametrize("change,what", [
    ({"RANK": None}, "RANK"), ({"MASTER_PORT": None, "LOCAL_RANK": None}, "LOCAL_RANK, MASTER_PORT"),
    ({"RANK": "16"}, "RANK=16"), ({"LOCAL_RANK": "8"}, "LOCAL_RANK=8"), ({"WORLD_SIZE": "x"}, "not numeric"),
])
def test_a_missing_or_inconsistent_environment_is_named(change, what):
    env = {k: v for k, v in (ENV | change).items() if v is not None}
    with pytest.raises(EnvError, match=what):
        from_environ(env)


@pytest.mark.parametrize("local,local_world,cuda,count,want", [
    (1, 8, True, 8, ("cuda", 1, "nccl")),
    (7, 8, True, 8, ("cuda", 7, "nccl")),
    (1, 8, True, 4, ("cpu", None, "gloo")),  # fewer GPUs than local ranks: no rank of the node uses one
    (0, 2, False, 0, ("cpu", None, "gloo")),
])
def test_device_and_backend_by_local_rank(local, local_world, cuda, count, want):
    assert device_choice(local, local_world, cuda, count) == want


def test_the_local_launcher_is_one_node():
    assert local_env(3, 4, 1234) == DistEnv(3, 4, 3, 4, "127.0.0.1", 1234)


def test_measure_outside_torchrun_is_a_diagnostic(monkeypatch, capsys):
    for v in ENV:
        monkeypatch.delenv(v, raising=False)
    code = main(["measure", "examples/library/ddp.place", "--plan", "ddp", "--torchrun"])
    err = capsys.readouterr().err
    assert code == 2 and "PL620" in err and "RANK" in err and "error:" in err


def test_devices_other_than_the_world_size_is_a_diagnostic(monkeypatch, capsys):
    for k, v in (ENV | {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}).items():
        monkeypatch.setenv(k, v)
    code = main(["measure", "examples/library/ddp.place", "--plan", "ddp", "--torchrun", "--devices", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "PL621" in err and "--devices 4" in err


# the CUDA code path, with torch.cuda stood in for (no GPU here)

@pytest.fixture
def cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: calls.setdefault("peak_of", d) and 123456789)
    return torch, calls


@pytest.mark.torch
def test_the_cuda_path_selects_the_local_gpu_and_nccl(cuda, monkeypatch):
    torch, calls = cuda
    from placement_logic.measure.ranks import torchrun, worker

    env = from_environ(ENV)
    device = worker._device(env)
    assert device == torch.device("cuda", 1) and worker.backend_of(device) == "nccl"
    assert worker.allocator_peak(device) == 123456789 and calls["peak_of"] == device
    assert worker.allocator_peak(torch.device("cpu")) is None
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.setdefault("init", (backend, kw)))
    assert torchrun.start(env) == torch.device("cuda", 1)
    backend, kw = calls["init"]
    assert backend == "nccl" and kw["init_method"] == "env://" and (kw["rank"], kw["world_size"]) == (5, 16)
    assert calls["set_device"] == torch.device("cuda", 1)


@pytest.mark.torch
def test_a_plan_of_another_size_fails_on_every_rank_alike():
    pytest.importorskip("torch")
    from placement_logic.measure.ranks import torchrun
    from placement_logic.measure.runner import LaunchError

    launch = torchrun.launcher(from_environ(ENV), None)
    with pytest.raises(LaunchError, match="torchrun started 16"):
        launch([], 4)


@pytest.mark.torch
@pytest.mark.slow
def test_measure_runs_under_torchrun(tmp_path):
    """Two CPU processes started by torchrun (gloo): the report of rank 0 only, every row compared."""
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("no torchrun beside this interpreter")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "placement_logic", "measure",
                           "examples/library/ddp.place", "--plan", "ddp", "--torchrun", "--no-check", "--steps", "2",
                           "--format", "json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # one document: rank 1 printed nothing
    (plan,) = doc["plans"]
    assert plan["outcome"] == "matched" and plan["mesh"] and plan["rows"]
