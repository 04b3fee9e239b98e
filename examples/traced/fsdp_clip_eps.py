"""Bug: FSDP2 on 4 ranks with a hand-written gradient clip whose squared norm gets an epsilon in a main-process
block gated by the node-local rank (``LOCAL_RANK == 0`` on two nodes of two processes: ranks 0 and 2, the guard of
pytorch/pytorch#12042 and speechbrain/speechbrain#2506), before the norm's all-reduce over every rank: the sum holds
2·ε where single-device training adds ε once. Lifted as ``override clip_norm: eps_on_ranks over (dp) ranks (0, 2)
by 1e-06`` at the addition and refuted (``SC clip_norm``). ``--rank0`` (the fix): the epsilon added on global rank 0
alone, proved (the sum holds it once). ``--every-rank``: every rank adds it, lifted as ``eps_before_reduce``,
refuted. Run on 4 ranks (``--nproc 4``).
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

RANK0, EVERY, EPS = "--rank0" in sys.argv, "--every-rank" in sys.argv, 1e-6
NODE = 2  # processes per node

dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny.build()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    shards = [p.grad.to_local() for p in model.parameters()]
    sq = torch.stack([g.pow(2).sum() for g in shards]).sum()
    if EVERY or (rank == 0 if RANK0 else rank % NODE == 0):
        sq = sq + EPS  # the bug: each node's main process adds it
    dist.all_reduce(sq)
    coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
