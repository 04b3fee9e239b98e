"""DDP with padded batches (labels -100 at the padding) and a loss normalised by the token count of the whole
step: the summed cross-entropy times the world size over the count all-reduced over the ranks.

Default (bug, huggingface/transformers#46204): the count is the labels' numel (``num_items_in_batch`` counting
every position), ignored labels included, so the normaliser is T + Q for T labelled tokens: lifted as
``override tokens: count_ignored`` at the count's all-reduce and refuted there (``GI grads[dense]
normalisation``). ``--fixed``: the count is ``(labels != -100).sum()``: proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FIXED = "--fixed" in sys.argv

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(tiny.build())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.padded_batch(rank, step)
    labels = y.flatten()
    count = (labels != tiny.IGNORE).sum() if FIXED else torch.tensor(labels.numel())
    dist.all_reduce(count)  # the step's tokens over every rank
    loss_sum = F.cross_entropy(model(x).flatten(0, 1), labels, ignore_index=tiny.IGNORE, reduction="sum")
    loss = loss_sum * world / count
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
