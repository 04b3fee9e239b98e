"""``placement measure --torchrun``: this process is one rank of a torchrun job (torch).

Input: the torchrun environment (``dist_env.DistEnv``). ``start`` initialises the process
group from it (``env://``: torchrun's rendezvous, one node or many) on ``cuda:LOCAL_RANK``
with NCCL when the node has a GPU per local rank, else the CPU with gloo; ``launcher`` is a
``session.measure_many`` launcher that runs the jobs in this very process (every rank runs
the same jobs in the same order, as every rank prepares the same plans) and all-gathers the
ranks' results, so every rank holds what the local launcher's files would hold.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Callable

from ..dist_env import DistEnv
from ..job import Job
from ..runner import LaunchError
from .worker import TIMEOUT_S, _device, backend_of, run_jobs


def start(env: DistEnv):
    """Initialise the process group of a torchrun job; the device this rank runs on."""
    import torch
    import torch.distributed as dist

    device = _device(env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend_of(device), init_method="env://", rank=env.rank, world_size=env.world,
                                timeout=timedelta(seconds=TIMEOUT_S))
    return device


def stop() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def launcher(env: DistEnv, device) -> Callable[[list[Job], int], dict[str, list[dict]]]:
    def launch(jobs: list[Job], world: int) -> dict[str, list[dict]]:
        import torch.distributed as dist

        if world != env.world:
            raise LaunchError(f"the plan runs on {world} processes; torchrun started {env.world} (WORLD_SIZE): "
                              "give the axis sizes with --set so that they multiply to it")
        mine: dict[str, dict] = {}
        # each result as the local launcher reads it back (JSON: tuples become lists)
        run_jobs(jobs, env.rank, device, lambda job, result: mine.__setitem__(job.key, json.loads(json.dumps(result))))
        gathered: list[dict | None] = [None] * env.world
        dist.all_gather_object(gathered, mine)
        return {job.key: [g[job.key] for g in gathered] for job in jobs}

    return launch
