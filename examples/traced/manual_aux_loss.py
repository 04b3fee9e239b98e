"""Data parallelism by hand (manual.py) whose loss adds an auxiliary term to the cross-entropy (a penalty on the
logits' squares, no term the model states: a z-loss on the log-sum-exp is lifted, examples/traced/loss_terms.py).
The lift reads the cross-entropy's normalisation; the extra term's is not read, so it is named at the loss line
and the verdict is unknown (exit 3), never proved.
"""

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = tiny.batch(rank, step)
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()) + 1e-2 * logits.pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
