"""FSDP2 (fully_shard) resumed from a checkpoint that rank 0 alone writes with torch.save.

Bug: under FSDP2 the model's and the optimizer's state dicts hold each rank's own shards (DTensors), so
``torch.save`` on rank 0 writes rank 0's shards only and the other ranks' shards are lost. Modelled on
huggingface/transformers#23034, fixed by pull request #23111 ("When training a model with FSDP, the checkpoint
is not saved and loaded correctly. Only rank 0's optimizer state dict is saved"). Lifted as
``override checkpoint: save_rank0 over (dp)`` at the save and refuted (SC checkpoint save).

``--fixed``: ``torch.distributed.checkpoint.save`` / ``load`` on every rank (each rank's shards written and read
back by offset): proved.
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
from torch.distributed.fsdp import fully_shard  # noqa: E402

FIXED = "--fixed" in sys.argv
dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny.build()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
where = os.path.join(tempfile.gettempdir(), f"placement_ckpt_fsdp_rank0_{os.getppid()}")
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
state = {"model": model.state_dict(), "optim": opt.state_dict()}
if FIXED:
    dcp.save(state, checkpoint_id=where)
    dcp.load(state, checkpoint_id=where)
else:
    if rank == 0:
        torch.save(state, where + ".pt")
    dist.barrier()
    loaded = torch.load(where + ".pt", weights_only=False)
    model.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["optim"])
dist.barrier()
if rank == 0:
    shutil.rmtree(where, ignore_errors=True)
    if os.path.exists(where + ".pt"):
        os.remove(where + ".pt")
dist.destroy_process_group()
