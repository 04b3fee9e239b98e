"""Data parallelism with DDP whose loss holds the cross-entropy's own extra terms: label smoothing passed to
``F.cross_entropy`` (``label_smoothing=0.1``) and PaLM's z-loss on the output logits, 1e-4 · lse² averaged over
the tokens the cross-entropy averages over. Lifted as ``losses { label_smoothing = true  logit_z_loss = true }``
in the model block (with whole logits on every rank both terms are what single-device training computes):
proved. With ``--padded`` the batches hold ignored labels (-100) and the z-loss averages over every position
(``.mean()`` of the log-sum-exp), not over the labelled tokens the cross-entropy divides by: no z-loss of the
logits as the model states it, reported as an auxiliary loss at the loss line (PL614), unknown.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PADDED = "--padded" in sys.argv
SMOOTHING, Z_LOSS = 0.1, 1e-4

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.padded_batch(rank, step) if PADDED else tiny.batch(rank, step)
    logits = model(x).flatten(0, 1)
    labels = y.flatten()
    ce = F.cross_entropy(logits, labels, ignore_index=tiny.IGNORE, label_smoothing=SMOOTHING)
    lse = logits.logsumexp(-1)
    z = lse.pow(2).mean() if PADDED else lse[labels != tiny.IGNORE].pow(2).mean()
    loss = ce + Z_LOSS * z
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
