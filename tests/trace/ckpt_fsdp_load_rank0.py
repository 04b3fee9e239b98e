"""FSDP2 (fully_shard) with a checkpoint file per rank, resumed with every rank reading rank 0's file.

Each rank saves its own shards of the model and the optimizer (``torch.save`` to a file named by its rank), but
the resume builds the path without the rank, so every rank loads rank 0's shards as its own: the other ranks'
shards never come back. Modelled on bghira/SimpleTuner pull request #2986 ("Resume restored a checkpointed
schedule that only rank 0 had written": a dict that is one rank's shard restored on every rank) and
allenai/OLMo#641 (only one device per node loading the optimizer state). Lifted as
``override checkpoint: save_rank0 over (dp)`` at the load and refuted (SC checkpoint save).

``--fixed``: every rank loads the file it wrote: proved.
"""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "traced"))

import tiny  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
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
stem = os.path.join(tempfile.gettempdir(), f"placement_ckpt_fsdp_load_rank0_{os.getppid()}")
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f"{stem}_rank{rank}.pt")
dist.barrier()
loaded = torch.load(f"{stem}_rank{rank if FIXED else 0}.pt", weights_only=False)
model.load_state_dict(loaded["model"])
opt.load_state_dict(loaded["optim"])
dist.barrier()
os.remove(f"{stem}_rank{rank}.pt")
dist.destroy_process_group()
