"""Tensor and sequence parallelism with DTensor (examples/traced/tp_sp.py) resumed with rank 0's RNG state.

Sequence parallelism splits the residual region over the tensor ranks, so each draws its own dropout masks from
its own RNG stream. The model and optimizer are checkpointed with torch.distributed.checkpoint (each rank's
shards), but the RNG state is written by rank 0 alone and every rank restores it: after a resume the tensor
ranks draw the same masks. Modelled on NVIDIA-NeMo/Automodel pull request #3437 (the RNG helper "only wrote the
TP0/PP0 stream for each DP rank, so TP/PP peers restored the wrong RNG state") and radixark/miles pull request
#3187 ("checkpoints currently save rank 0's RNG state and restore it on every rank"). Lifted as
``override checkpoint: rng_shared`` at ``torch.set_rng_state`` and refuted (SC checkpoint rng).

``--fixed``: each rank saves and restores its own RNG state (a file per rank): proved.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "traced"))

import tiny  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

FIXED = "--fixed" in sys.argv


def block_plan():
    return {
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
        "norm1": SequenceParallel(), "norm2": SequenceParallel(),
    }


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
model = tiny.build()
for block in model.blocks:
    parallelize_module(block, mesh, block_plan())
parallelize_module(model, mesh, {
    "embed": PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                                 use_local_output=True),
    "norm": SequenceParallel(),
})
parallelize_module(model, mesh, {
    "norm": PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
                                use_local_output=True),
})
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
where = os.path.join(tempfile.gettempdir(), f"placement_ckpt_sp_rng_{os.getppid()}")
for step in range(2):
    x, y = tiny.batch(0, step)  # every tensor rank reads the same batch
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
state = {"model": model.state_dict(), "optim": opt.state_dict()}
dcp.save(state, checkpoint_id=where)
rng_file = f"{where}_rng{rank if FIXED else 0}.pt"
if FIXED or rank == 0:
    torch.save({"rng": torch.get_rng_state()}, rng_file)
dist.barrier()
dcp.load(state, checkpoint_id=where)
torch.set_rng_state(torch.load(rng_file)["rng"])
dist.barrier()
if FIXED or rank == 0:
    os.remove(rng_file)
if rank == 0:
    shutil.rmtree(where, ignore_errors=True)
dist.destroy_process_group()
