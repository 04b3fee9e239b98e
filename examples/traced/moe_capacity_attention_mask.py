"""Bug: a padded fine-tuning batch through a dropping MoE router (top-2 of 4 experts, capacity factor 1), the
padding marked only by the attention mask of a Hugging Face-style model call (``model(ids,
attention_mask=mask)``): no label at the ignore index, no loss mask (the loss is taken over the positions the
mask keeps, by indexing). The router never reads the mask: the padded positions are routed, take expert slots by
their router scores and count in the capacity C = ⌈capacity_factor · k · N / E⌉ of each call
(NVIDIA/Megatron-LM#5542, "Exclude padding tokens from MoE routing"; in a Hugging Face MoE model the padding is
known only from ``attention_mask``, which its router statistics first ignored: huggingface/transformers#28505,
"Exclude the load balancing loss of padding tokens in Mixtral-8x7B"). The recorder reads the padded positions from
the attention mask: lifted as ``override capacity: counts_padding`` at the capacity step's ``topk`` and refuted
there (``GI capacity``). ``--fixed``: the routing map masked by the attention mask and C computed from the real
tokens: ``capacity: masks_padding``, proved. The loss is the global token mean (the summed cross-entropy of the
real positions times the world size over the all-reduced count of real positions). Run on 2 ranks.
"""

import math
import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

FIXED = "--fixed" in sys.argv
EXPERTS, TOP_K, CAPACITY_FACTOR = 4, 2, 1.0
PAD = 0  # the pad token's id: the padded positions' ids and labels


class Routed(nn.Module):
    """The tiny transformer whose embedded tokens pass a top-k router with a capacity step (the kept experts'
    probabilities scale them); called as a Hugging Face model is, with an attention mask."""

    def __init__(self):
        super().__init__()
        self.body = tiny.build()
        self.router = nn.Linear(tiny.HIDDEN, EXPERTS, bias=False)

    def forward(self, input_ids, attention_mask=None):
        x = self.body.embed(input_ids)
        probs = F.softmax(self.router(x).flatten(0, 1), dim=-1)
        _, chosen = probs.topk(TOP_K, dim=-1)
        routing = torch.zeros_like(probs).scatter(1, chosen, 1.0)
        n = routing.shape[0]
        if FIXED:  # the padding masked out of the routing map, the capacity from the real tokens
            routing = routing * attention_mask.reshape(-1, 1).to(routing.dtype)
            n = int(attention_mask.sum())
        capacity = math.ceil(CAPACITY_FACTOR * TOP_K * n / EXPERTS)
        scores = probs * routing
        _, slots = scores.topk(capacity, dim=0)  # each expert keeps its C tokens of the highest scores
        kept = torch.zeros_like(probs).scatter(0, slots, 1.0) * routing
        x = x * (probs * kept).sum(-1).view(x.shape[0], x.shape[1], 1)
        for block in self.body.blocks:
            x = block(x)
        return self.body.head(self.body.norm(x))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(Routed())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x, y = tiny.padded_batch(rank, step)
    attention_mask = (y != tiny.IGNORE).long()  # 1 a real position, 0 padding: the only mark of the padding
    x = x.masked_fill(attention_mask == 0, PAD)
    y = y.masked_fill(attention_mask == 0, PAD)  # the padded labels are the pad token, never the ignore index
    keep = attention_mask.flatten().bool()
    count = attention_mask.sum()
    dist.all_reduce(count)  # the step's real positions over every rank
    logits = model(x, attention_mask=attention_mask)
    loss_sum = F.cross_entropy(logits.flatten(0, 1)[keep], y.flatten()[keep], reduction="sum")
    loss = loss_sum * world / count
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
