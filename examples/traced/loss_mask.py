"""DDP fine-tuning on the completions only: a loss mask (0 on each sequence's prompt, 1 on its completion)
multiplied into the per-token cross-entropy (``reduction='none'``), summed, times the world size over the
count all-reduced over the ranks. The prompts' lengths differ between sequences and ranks.

Default (bug): the count is every position of the batch (``labels.numel()``), the masked prompt tokens
included, where single-device training divides by the tokens the mask keeps (the normaliser T + Q):
Blaizzy/mlx-vlm#1392 ("the denominator here should be the number of masked elements included in the loss":
the completion mask weighs the cross-entropy, the sequence-length mask counts it), the pattern of
huggingface/transformers#46204's ``num_items_in_batch``. Lifted as ``override tokens: count_ignored`` at the
count's all-reduce and refuted there. ``--fixed``: the count is the mask's sum: proved.
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
    x, y = tiny.batch(rank, step)
    g = torch.Generator().manual_seed(9000 + 1000 * step + rank)
    prompt = torch.randint(1, tiny.SEQ, (tiny.BATCH, 1), generator=g)  # each sequence's prompt length
    mask = (torch.arange(tiny.SEQ).expand(tiny.BATCH, -1) >= prompt).float().flatten()
    count = mask.sum() if FIXED else torch.tensor(float(mask.numel()))
    dist.all_reduce(count)  # the step's tokens over every rank
    per_token = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none")
    loss = (per_token * mask).sum() * world / count
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
