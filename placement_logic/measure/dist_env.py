"""Where a measuring process runs: its rank, the job's size, and its device and backend (no torch).

Two launchers start the ranks. The local one (``runner.launch``) starts N processes on this
machine, meeting over TCP on 127.0.0.1: rank r is local rank r of N. Under ``torchrun`` (one
or many nodes) torchrun starts them and says who each is in the environment: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and the rendezvous ``MASTER_ADDR`` /
``MASTER_PORT`` (``init_method="env://"``). Either way a rank runs on the GPU of its local
rank with NCCL when the node has a GPU for every local rank, and on the CPU with gloo
otherwise (every rank of a node decides alike, so the job never mixes backends on a node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class EnvError(Exception):
    """torchrun's environment is missing or inconsistent (the message names the variable)."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int


def from_environ(env: Mapping[str, str]) -> DistEnv:
    """The torchrun environment of this process; ``EnvError`` naming what is missing or wrong."""
    missing = [v for v in TORCHRUN_VARS if not env.get(v)]
    if missing:
        raise EnvError(f"{', '.join(missing)} not set: run it under torchrun (torchrun --nproc-per-node N -m "
                       "placement_logic measure FILE --plan NAME --torchrun)")
    try:
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
        local_world = int(env.get("LOCAL_WORLD_SIZE") or world)
        port = int(env["MASTER_PORT"])
    except ValueError as exc:
        raise EnvError(f"torchrun's environment is not numeric where it must be: {exc}") from None
    if not (0 <= rank < world and 0 <= local < local_world <= world):
        raise EnvError(f"RANK={rank}, LOCAL_RANK={local}, LOCAL_WORLD_SIZE={local_world}, WORLD_SIZE={world} do "
                       "not describe a rank of the job")
    return DistEnv(rank, world, local, local_world, env["MASTER_ADDR"], port)


def local_env(rank: int, world: int, port: int) -> DistEnv:
    """The local launcher's rank: every rank on this machine."""
    return DistEnv(rank, world, rank, world, "127.0.0.1", port)


def device_choice(local_rank: int, local_world: int, cuda_available: bool, cuda_count: int) -> tuple[str, int | None, str]:
    """(device type, device index, backend): ``cuda:LOCAL_RANK`` with NCCL when the node has a GPU for
    every local rank, the CPU with gloo otherwise."""
    if cuda_available and cuda_count >= local_world:
        return "cuda", local_rank, "nccl"
    return "cpu", None, "gloo"
