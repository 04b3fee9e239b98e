"""A tiny decoder-only transformer and its data, shared by the traced examples.

Pre-norm blocks (LayerNorm, causal self-attention, LayerNorm, MLP), a token embedding, a
final norm and an output head. ``batch(rank, step)`` gives one data-parallel rank's token
ids and targets; every sequence is full length (no padding), so every rank holds the
same number of tokens.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, HIDDEN, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 8, 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN)
        self.k = nn.Linear(HIDDEN, HIDDEN)
        self.v = nn.Linear(HIDDEN, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (f(x).view(b, s, -1, HIDDEN // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.fc2 = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(HIDDEN)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(seed=0):
    torch.manual_seed(seed)
    return Tiny()


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


IGNORE = -100  # target of a padding position


def padded_batch(rank, step):
    """Like ``batch``, with each sequence cut to a random length and padded: ranks hold different token counts."""
    x, y = batch(rank, step)
    g = torch.Generator().manual_seed(7000 + 1000 * step + rank)
    valid = torch.randint(1, SEQ + 1, (BATCH, 1), generator=g)
    y = y.clone()
    y[torch.arange(SEQ).expand(BATCH, -1) >= valid] = IGNORE
    return x, y
