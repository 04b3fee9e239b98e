"""DDP with ZeroRedundancyOptimizer (ZeRO-1: each rank holds the optimizer state of its share of the parameters),
checkpointed by rank 0.

Bug: rank 0 saves its local optimizer's state dict (``opt.optim.state_dict()``: the Adam moments of its own share
only) where the whole optimizer state must be gathered first, so the other ranks' moments are never written and a
resume restarts them from zero. Modelled on huggingface/transformers#23034 (fixed by pull request #23111: "Only
rank 0's optimizer state dict is saved") as it shows under ZeRO, and DeepSpeed's ZeRO checkpoints, which write one
optimizer file per data-parallel rank for this reason. Lifted as ``override checkpoint: save_rank0 over (dp)`` at
the save and refuted (SC checkpoint save).

``--fixed``: ``opt.consolidate_state_dict(to=0)`` gathers every rank's share on rank 0, which saves the whole
state (more elements than it holds): proved.
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
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

FIXED = "--fixed" in sys.argv
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
path = os.path.join(tempfile.gettempdir(), f"placement_ckpt_zero1_{os.getppid()}.pt")
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
if FIXED:
    opt.consolidate_state_dict(to=0)
if rank == 0:
    optim_state = opt.state_dict() if FIXED else opt.optim.state_dict()
    torch.save({"model": model.module.state_dict(), "optim": optim_state}, path)
dist.barrier()
state = torch.load(path, weights_only=False)
model.module.load_state_dict(state["model"])
if FIXED:
    opt.load_state_dict(state["optim"])
else:
    opt.optim.load_state_dict(state["optim"])
dist.barrier()
if rank == 0:
    os.remove(path)
dist.destroy_process_group()
