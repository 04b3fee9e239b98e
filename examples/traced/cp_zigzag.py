"""Bug: context parallelism over 2 ranks with the load-balanced (zigzag) layout applied to the input tokens but
not to the labels: each sequence is cut into 4 chunks, rank i holds the tokens of chunks i and 3 - i (so the
causal work is even), while the labels are cut into contiguous blocks (rank i: chunks 2i and 2i + 1). The loss
on rank 0 then scores chunk 3's predictions against chunk 1's labels (NVIDIA-BioNeMo/bionemo-recipes#1449:
labels shifted and split apart from the zigzag-split input ids). Keys and values pass around a ring of the two
ranks (a send and a receive each way, gradients sent back in backward), the causal mask from the position ids.
Lifted as `override layout[inputs]: zigzag` and `override layout[labels]: contiguous`, refuted
(`GI layout[labels]`).

``--position-ids`` (bug): the labels follow the tokens, but the position ids are those of a contiguous block
(NVIDIA/Megatron-LM#5243, rotary positions under CP): `override layout[position_ids]: contiguous`, refuted.
``--fixed``: the labels and the position ids cut as the tokens are, proved. ``--contiguous``: every tensor in
contiguous blocks (the derivation), proved.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, HIDDEN, SEQ, BATCH = 64, 16, 16, 2
FIXED, POSITIONS, CONTIGUOUS = ("--fixed" in sys.argv, "--position-ids" in sys.argv, "--contiguous" in sys.argv)


class Exchange(torch.autograd.Function):
    """This rank's keys and values to the other rank of the ring, the other's back; gradients the reverse way."""

    @staticmethod
    def forward(ctx, t):
        other = 1 - dist.get_rank()
        got = torch.empty_like(t)
        reqs = [dist.isend(t.contiguous(), other), dist.irecv(got, other)]
        for r in reqs:
            r.wait()
        return got

    @staticmethod
    def backward(ctx, g):
        return Exchange.forward(ctx, g)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(SEQ, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, x, pos):
        h = self.embed(x) + self.pos(pos)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        kv = Exchange.apply(torch.cat([k, v], dim=-1))
        pos_other = torch.empty_like(pos)
        reqs = [dist.isend(pos.contiguous(), 1 - dist.get_rank()), dist.irecv(pos_other, 1 - dist.get_rank())]
        for r in reqs:
            r.wait()
        k, v = torch.cat([k, kv[..., :HIDDEN]], dim=1), torch.cat([v, kv[..., HIDDEN:]], dim=1)
        keys = torch.cat([pos, pos_other], dim=-1)
        mask = pos[..., :, None] >= keys[..., None, :]  # causal, by position
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.head(h + y)


def split(t, rank, zigzag):
    """This rank's two chunks of every sequence (dimension 1), of 4: zigzag (rank, 3 - rank) or contiguous."""
    c = t.chunk(4, dim=1)
    return torch.cat([c[rank], c[3 - rank]] if zigzag else [c[2 * rank], c[2 * rank + 1]], dim=1)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Model())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    g = torch.Generator().manual_seed(100 + step)
    seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)  # the same sequences on both context ranks
    tokens, labels = seq[:, :-1], seq[:, 1:]
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    zigzag = not CONTIGUOUS
    x = split(tokens, rank, zigzag)
    y = split(labels, rank, zigzag and (FIXED or POSITIONS))  # the bug: the labels cut into contiguous blocks
    pos = split(positions, rank, zigzag and not POSITIONS)
    logits = model(x, pos)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
