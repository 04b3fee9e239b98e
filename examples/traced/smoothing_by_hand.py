"""Data parallelism with DDP whose loss is label smoothing written by hand, Megatron-style: (1 − α) · CE + α ·
(lse − mean logit), averaged over the tokens (what ``F.cross_entropy(..., label_smoothing=α)`` computes).
``--alpha A`` sets α (default 0.5). At α = 0.5 the term's value is also that of CE + 1 · smooth (c = α / (1 − α)
= 1, a coefficient as written), which read the cross-entropy operand 0.5 · CE as a loss halved; the operand's own
multiplier 1 − α tells the readings apart. Lifted as ``losses { label_smoothing = true }`` with the plain
cross-entropy's normalisation, for α = 0.5 and α = 0.1 alike: proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ALPHA = float(sys.argv[sys.argv.index("--alpha") + 1]) if "--alpha" in sys.argv else 0.5

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(tiny.build())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.batch(rank, step)
    logits = model(x).flatten(0, 1)
    labels = y.flatten()
    ce = F.cross_entropy(logits, labels)
    smooth = (logits.logsumexp(-1) - logits.mean(-1)).mean()
    loss = (1 - ALPHA) * ce + ALPHA * smooth
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
