"""Bug: a loss computed on the sequence gathered over the sequence-parallel group, its token count all-reduced
over the whole world (dp=2 x sp=2, 4 ranks).

Modelled on verl's SFT trainer under Ulysses sequence parallelism (verl-project/verl#1963, fixed by
verl-project/verl#3691): each sp rank holds a slice of every sequence, computes its tokens' logits, and the
logits are all-gathered over the sp group (an autograd function whose backward keeps the rank's own slice of
the gradient) so that every sp rank computes the loss of the whole sequence. Its token count is then already
the whole sequence's; all-reducing it over dp x sp counts every token sp times, and the loss and the gradient
are sp times too small. Lifted as `override loss: on_gathered_sequence over (sp)` at the gather and
`override tokens: reduce over (dp, sp)`, refuted (`GI grads[dense] normalisation`).

``--fixed``: the count all-reduced over the dp group only, proved.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

VOCAB, HIDDEN, SEQ, BATCH, IGNORE = 32, 16, 8, 2, -100
FIXED = "--fixed" in sys.argv


class GatherSequence(torch.autograd.Function):
    """Every sp rank's slice of the sequence (dimension 1), gathered in order; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.size, ctx.rank = dist.get_world_size(group), dist.get_rank(group)
        out = torch.empty((ctx.size * t.shape[0], *t.shape[1:]), dtype=t.dtype)
        dist.all_gather_into_tensor(out, t.contiguous(), group=group)
        b, s, v = t.shape
        return out.view(ctx.size, b, s, v).permute(1, 0, 2, 3).reshape(b, ctx.size * s, v)

    @staticmethod
    def backward(ctx, g):
        return g.chunk(ctx.size, dim=1)[ctx.rank].contiguous(), None


dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "sp"))
rank, world = dist.get_rank(), dist.get_world_size()
dp_rank, sp_rank, sp = mesh["dp"].get_local_rank(), mesh["sp"].get_local_rank(), mesh["sp"].size()
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, VOCAB))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    g = torch.Generator().manual_seed(100 * step + dp_rank)  # the same sequences on the sp ranks of a dp rank
    seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    tokens, labels = seq[:, :-1], seq[:, 1:].clone()
    labels[:, SEQ - 1 - dp_rank - step:] = IGNORE  # padding: the dp ranks hold different numbers of tokens
    x = tokens.chunk(sp, dim=1)[sp_rank]  # this rank's slice of every sequence
    logits = GatherSequence.apply(model(x), mesh["sp"].get_group())  # the whole sequence's logits
    count = (labels != IGNORE).sum()  # the whole sequence's labelled tokens, the same on every sp rank
    group = mesh["dp"].get_group() if FIXED else None  # the bug: over the world, every token counted sp times
    dist.all_reduce(count, group=group)
    loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    loss = loss_sum * world / count
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
