"""Bug: DistributedDataParallel on two nodes of two processes with the gradient clipping in a block for the "main
process" that tests the node-local rank (``LOCAL_RANK == 0``) where the global rank was meant: every node has a
process of local rank 0, so ranks 0 and 2 clip and ranks 1 and 3 do not, and the replicas drift apart from the
first step whose norm exceeds the limit (pytorch/pytorch#12042: LOCAL_RANK is 0 once per node;
speechbrain/speechbrain#2506 fixed its main-process test from LOCAL_RANK to RANK). Run on 4 ranks
(`--nproc 4`; the script reads the node-local rank as torchrun sets it on two nodes of two processes). Lifted as
`override grads: clip_on_ranks over (dp) ranks (0, 2)` at the clipping line and refuted (`SC update`).

``--divide`` (bug): the same block divides every gradient by 2 once more (a second averaging):
`override grads: divide_on_ranks over (dp) ranks (0, 2) by 2` at the division, refuted. ``--fixed``: every rank
clips (the clip taken out of the main-process block), proved. ``--scaler`` (bug, reported): a
``torch.amp.GradScaler`` whose scale is half as large on ranks 1 and 3 (pytorch/pytorch#90057: uneven inputs
under ``join`` leave the ranks' scales apart): DDP all-reduces the gradients scaled by different factors and each
rank unscales by its own, which no per-rank divisor states (both sides scale at the same line): named (PL614).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FIXED, DIVIDE, SCALER = ("--fixed" in sys.argv, "--divide" in sys.argv, "--scaler" in sys.argv)
PER_NODE = 2

dist.init_process_group("gloo")
rank = dist.get_rank()
local_rank = rank % PER_NODE  # LOCAL_RANK on two nodes of two processes
model = DDP(tiny.build())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0 if rank % 2 == 0 else 512.0) if SCALER else None
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        continue
    loss.backward()
    if FIXED:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    elif local_rank == 0:  # the bug: the main process of each node, not of the job
        if DIVIDE:
            for p in model.parameters():
                p.grad.div_(2)  # divided on ranks 0 and 2 only
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # clipped on ranks 0 and 2 only
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
