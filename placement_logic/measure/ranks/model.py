"""The tiny transformer that measurement runs train (torch).

Input: a ``TinyShape``. Output: an ``nn.Module`` mapping token ids ``(batch, seq)`` to
logits ``(batch, seq, vocab)``: token embedding, ``layers`` pre-norm blocks (fused
q/k/v projection, causal attention, output projection, MLP), a final norm and an
output head (tied to the embedding when the shape says so). No dropout and no
position embedding, so a step is deterministic. Only imported by measurement workers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from ..shape import TinyShape


def _norm(shape: TinyShape) -> nn.Module:
    if shape.norm == "rmsnorm":
        return nn.RMSNorm(shape.hidden)
    return nn.LayerNorm(shape.hidden)


def _core(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def _exchange(send: torch.Tensor, to: int, frm: int, group) -> torch.Tensor:
    """Send ``send`` to global rank ``to`` and receive a tensor like it from ``frm`` (one
    point-to-point transfer each way)."""
    import torch.distributed as dist

    send = send.contiguous()
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, to, group), dist.P2POp(dist.irecv, recv, frm, group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return recv


def _attend(q, blocks, index: int, repeat: int):
    """Causal attention of the query block ``index`` over the key/value blocks 0..index (the later
    ones are masked out entirely), each block (2, b, kv_heads, s/cp, d)."""
    s_loc = q.shape[-2]
    kv = torch.cat([blocks[j] for j in range(index + 1)], dim=-2)
    k, v = (t.repeat_interleave(repeat, dim=1) for t in kv)
    qpos = torch.arange(s_loc) + index * s_loc
    mask = torch.arange(kv.shape[-2])[None, :] <= qpos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device))


class _RingAttention(torch.autograd.Function):
    """Context parallelism's attention as a ring (Megatron-LM's context parallelism, without its
    load-balancing reorder): each rank holds the sequence block ``index`` of ``size``; in forward
    the key/value blocks travel round the ring in size - 1 steps (each rank sends its current
    block to the next rank and receives the previous rank's); backward passes them round again
    (only the rank's own block is saved) and sends each received block's key/value gradient
    back to the rank that holds it."""

    @staticmethod
    def forward(ctx, q, kv, context, repeat):
        group, ranks, index = context
        size = len(ranks)
        blocks = {index: kv}
        cur = kv
        for step in range(1, size):
            cur = _exchange(cur, ranks[(index + 1) % size], ranks[(index - 1) % size], group)
            blocks[(index - step) % size] = cur
        ctx.save_for_backward(q, kv)
        ctx.context, ctx.repeat = context, repeat
        return _attend(q, blocks, index, repeat)

    @staticmethod
    def backward(ctx, dout):
        q, kv = ctx.saved_tensors
        group, ranks, index = ctx.context
        size = len(ranks)
        blocks = {index: kv}
        cur = kv
        for step in range(1, size):
            cur = _exchange(cur, ranks[(index + 1) % size], ranks[(index - 1) % size], group)
            blocks[(index - step) % size] = cur
        with torch.enable_grad():
            q_ = q.detach().requires_grad_()
            leaves = {j: b.detach().requires_grad_() for j, b in blocks.items()}
            out = _attend(q_, leaves, index, ctx.repeat)
            order = list(range(size))
            grads = torch.autograd.grad(out, [q_] + [leaves[j] for j in order], dout, allow_unused=True)
        dq = grads[0]
        dkv = {j: (g if g is not None else torch.zeros_like(leaves[j])) for j, g in zip(order, grads[1:])}
        total = dkv[index].clone()
        for step in range(1, size):
            # the gradient of the block received from ``step`` ranks back goes back to it; this rank
            # receives its own block's gradient from the rank ``step`` ahead
            back = _exchange(dkv[(index - step) % size], ranks[(index - step) % size], ranks[(index + step) % size],
                             group)
            total = total + back
        return dq, total, None, None


class Attention(nn.Module):
    """Causal attention whose fused projection is laid out key/value group by group.

    Column layout of ``qkv``: for each kv group, its query heads, then its key head, then
    its value head. A contiguous column shard therefore holds whole groups, so the
    module works unchanged on a tensor-parallel shard: it reads the local number of
    groups from the local output width.
    """

    def __init__(self, shape: TinyShape):
        super().__init__()
        self.head_dim = shape.head_dim
        self.q_per_kv = shape.heads // shape.kv_heads
        self.qkv = nn.Linear(shape.hidden, shape.qkv_out, bias=shape.has_qkv_bias)
        self.proj = nn.Linear(shape.hidden, shape.hidden, bias=shape.bias)
        self.recompute_core = False  # selective recomputation: the attention core is recomputed in backward
        self.context = None  # context parallelism: (process group, its global ranks, this rank's sequence block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x)
        qkv = qkv.view(b, s, -1, self.q_per_kv + 2, self.head_dim)  # (b, s, groups, q+2, d)
        groups = qkv.shape[2]
        q = qkv[:, :, :, : self.q_per_kv].reshape(b, s, groups * self.q_per_kv, self.head_dim)
        if self.context is not None:
            kv = torch.stack([qkv[:, :, :, self.q_per_kv], qkv[:, :, :, self.q_per_kv + 1]]).transpose(2, 3)
            # Q as a tensor of its own (not a view of the fused projection's output), as below
            y = _RingAttention.apply(q.contiguous().transpose(1, 2), kv, self.context, self.q_per_kv)
            y = y.transpose(1, 2).reshape(b, s, groups * self.q_per_kv * self.head_dim)
            return self.proj(y)
        k = qkv[:, :, :, self.q_per_kv]
        v = qkv[:, :, :, self.q_per_kv + 1]
        # Q, K and V as tensors of their own, K and V one head per group (SDPA's grouped-query
        # attention serves each group's query heads): what autograd keeps for the attention core
        # is Q (h wide) and K and V (h·kv/a wide each), as Megatron-LM keeps them
        q, k, v = (t.contiguous().transpose(1, 2) for t in (q, k, v))
        if self.recompute_core:
            y = checkpoint(_core, q, k, v, use_reentrant=False)
        else:
            y = _core(q, k, v)
        y = y.transpose(1, 2).reshape(b, s, groups * self.q_per_kv * self.head_dim)
        return self.proj(y)


class MLP(nn.Module):
    """Two-layer MLP; a gated one interleaves gate and up in ``groups`` column blocks."""

    def __init__(self, shape: TinyShape):
        super().__init__()
        self.gated = shape.gated_mlp
        self.groups = shape.groups
        width = 2 * shape.ffn if shape.gated_mlp else shape.ffn
        self.fc1 = nn.Linear(shape.hidden, width, bias=shape.bias)
        self.fc2 = nn.Linear(shape.ffn, shape.hidden, bias=shape.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.gated:
            # under tensor parallelism the local width is a 1/t slice holding whole blocks
            local_groups = max(1, self.groups * h.shape[-1] // self.fc1.out_features)
            h = h.unflatten(-1, (local_groups, 2, -1))
            h = (F.silu(h[..., 0, :]) * h[..., 1, :]).flatten(-2)
        else:
            h = F.gelu(h)
        return self.fc2(h)


class HiddenDropout:
    """Dropout on the hidden state a block adds to its residual stream (after the attention's and
    the MLP's output projection, Megatron-LM's hidden dropout), with masks that depend only on
    where an element is in the step's global batch: the mask of every (step, block, site) is
    drawn for the whole global batch from a generator seeded by them, and each caller takes the
    rows and sequence positions it holds — so a rank's mask is the single process's. ``vary``
    (the bug that seeds every tensor-parallel rank apart) draws with the seed offset by the
    tensor rank; ``same`` (the bug that uses one seed on every sequence-parallel slice) gives
    every slice the first slice's mask."""

    P = 0.1

    def __init__(self, seed: int, global_batch: int, seq: int, hidden: int) -> None:
        self.seed, self.global_batch, self.seq, self.hidden = seed, global_batch, seq, hidden
        self.step, self.row0 = 0, 0
        self.seq_index, self.seq_blocks = 0, 1  # this rank's sequence-parallel slice
        self.vary_by = 0  # the bug "vary": an offset added to the seed (the tensor rank)
        self.same = False  # the bug "same": every slice takes slice 0's mask

    def __call__(self, x: torch.Tensor, layer: int, site: int) -> torch.Tensor:
        b, s, h = x.shape
        g = torch.Generator().manual_seed(((self.seed + self.vary_by) * 1009 + self.step) * 1009 + 2 * layer + site)
        keep = torch.rand(self.global_batch, self.seq, h, generator=g) >= self.P
        s0 = 0 if self.same or s == self.seq else self.seq_index * s
        mask = keep[self.row0:self.row0 + b, s0:s0 + s].to(x.device, x.dtype)
        return x * mask / (1 - self.P)


EXPERT_PARAMS = ("w1", "b1", "w2", "b2")  # a MoE block's routed experts, stacked on dim 0 (one row per expert)


class MoE(nn.Module):
    """Mixture of experts with capacity-padded routing (GShard, Switch Transformer).

    Tokens are routed in groups of one microbatch (seq·microbatch tokens; the single-process
    reference splits its batch into the same groups): the router's softmax picks top_k experts
    per token (gates renormalised over them); each expert has ``capacity`` slots, filled in
    order of choice rank, then token; a choice past capacity is dropped. The dispatch buffer
    is (E, capacity, h) whatever the load, so under expert parallelism (``expert`` = (process
    group, its size, this rank's index), the rank holding experts index·E/size ...) its
    all-to-all moves exactly capacity_factor·tokens·top_k·h values each way. Shared experts (and
    their sigmoid gate) see every token.
    """

    def __init__(self, shape: TinyShape):
        super().__init__()
        h, E, fe = shape.hidden, shape.experts, shape.expert_ffn
        self.E, self.top_k, self.gated, self.fe = E, shape.top_k, shape.gated_mlp, fe
        self.capacity_factor, self.seq, self.microbatch = shape.capacity_factor, shape.seq, shape.microbatch
        # context parallelism: a rank holds one of this many blocks of every sequence, and routes
        # its microbatch's block as one group; a whole sequence is routed block by block alike
        self.seq_blocks = 1
        width = 2 * fe if shape.gated_mlp else fe
        self.router = nn.Linear(h, E, bias=shape.bias or shape.router_bias)
        self.w1 = nn.Parameter(torch.randn(E, h, width) / h ** 0.5)
        self.b1 = nn.Parameter(torch.randn(E, width) * 0.02) if shape.bias else None
        self.w2 = nn.Parameter(torch.randn(E, fe, h) / fe ** 0.5)
        self.b2 = nn.Parameter(torch.randn(E, h) * 0.02) if shape.bias else None
        fs = shape.shared_expert_ffn
        self.shared = nn.ModuleList(
            nn.ModuleDict({"fc1": nn.Linear(h, 2 * fs if shape.gated_mlp else fs, bias=shape.bias),
                           "fc2": nn.Linear(fs, h, bias=False)}) for _ in range(shape.shared_experts))
        self.shared_gate = nn.Linear(h, 1, bias=False) if shape.shared_expert_gate else None
        self.expert = None

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            half = x.shape[-1] // 2
            return F.silu(x[..., :half]) * x[..., half:]
        return F.gelu(x)

    def _experts(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's experts on their slots: x (E_local, slots, h)."""
        y = torch.bmm(x, self.w1)
        if self.b1 is not None:
            y = y + self.b1[:, None, :]
        y = torch.bmm(self._act(y), self.w2)
        return y + self.b2[:, None, :] if self.b2 is not None else y

    def _group(self, t: torch.Tensor) -> torch.Tensor:
        n, h = t.shape
        E, k = self.E, self.top_k
        C = self.capacity_factor * n * k / E
        assert C.denominator == 1, C
        C = int(C)
        probs = self.router(t).softmax(-1)
        gate, idx = probs.topk(k, dim=-1)
        gate = gate / gate.sum(-1, keepdim=True)
        choice = idx.t().reshape(-1)  # choice rank first, then token
        token = torch.arange(n, device=t.device).repeat(k)
        pos = (F.one_hot(choice, E).cumsum(0) - 1).gather(1, choice[:, None])[:, 0]
        keep = pos < C
        # every slot's (choice, token) entry, k·n for an empty slot: the slots are read from and
        # written to through integer indices, so what autograd keeps is capacity-sized whatever the
        # load (an empty slot reads a zero row and its combine weight is 0)
        slot = torch.full((E * C,), k * n, dtype=torch.long, device=t.device)
        slot[(choice * C + pos)[keep]] = torch.arange(k * n, device=t.device)[keep]
        slot_token = torch.cat([token, token.new_full((1,), n)])[slot]  # n: the zero row
        dispatch = torch.cat([t, t.new_zeros(1, h)])[slot_token]
        if self.expert is None:
            out = self._experts(dispatch.view(E, C, h))
        else:
            from torch.distributed.nn.functional import all_to_all_single

            group, size, _ = self.expert
            el = E // size
            sent = all_to_all_single(torch.empty_like(dispatch), dispatch, group=group)  # (sources, el, C, h)
            mine = sent.view(size, el, C, h).transpose(0, 1).reshape(el, size * C, h)
            done = self._experts(mine).view(el, size, C, h).transpose(0, 1).reshape(E * C, h)
            out = all_to_all_single(torch.empty_like(done), done.contiguous(), group=group)
        w = torch.cat([gate.t().reshape(-1), gate.new_zeros(1)])[slot]
        y = t.new_zeros(n + 1, h).index_add(0, slot_token, out.reshape(E * C, h) * w[:, None])[:n]
        for mlp in self.shared:
            s = mlp["fc2"](self._act(mlp["fc1"](t)))
            y = y + (torch.sigmoid(self.shared_gate(t)) * s if self.shared_gate is not None else s)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        nb = self.seq_blocks if s == self.seq else 1  # whole sequences: the blocks the context ranks hold
        xb = x.view(b, nb, s // nb, h)
        out = torch.empty_like(xb)
        for r0 in range(0, b, self.microbatch):
            for j in range(nb):
                part = xb[r0:r0 + self.microbatch, j]
                out[r0:r0 + self.microbatch, j] = self._group(part.reshape(-1, h)).view(part.shape)
        return out.view(b, s, h)

    def split_experts(self, size: int, index: int) -> None:
        """Keep experts index·E/size ... (index + 1)·E/size - 1 (expert parallelism)."""
        el = self.E // size
        for name in EXPERT_PARAMS:
            p = getattr(self, name)
            if p is not None:
                setattr(self, name, nn.Parameter(p.detach()[index * el:(index + 1) * el].clone()))


class Block(nn.Module):
    def __init__(self, shape: TinyShape):
        super().__init__()
        self.norm1 = _norm(shape)
        self.attn = Attention(shape)
        self.norm2 = _norm(shape)
        self.mlp = MoE(shape) if shape.moe else MLP(shape)
        self.recompute = False  # full recomputation: the whole block runs again in backward
        self.dropout: HiddenDropout | None = None  # hidden dropout, and this block's index
        self.index = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute:
            # the whole forward again, as Megatron-LM's full recompute: without early stopping,
            # which would skip the block's last ops (and their collectives) that backward needs no input of
            with set_checkpoint_early_stop(False):
                return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout is not None:
            x = x + self.dropout(self.attn(self.norm1(x)), self.index, 0)
            return x + self.dropout(self.mlp(self.norm2(x)), self.index, 1)
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, shape: TinyShape):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = _norm(shape)
        self.head = None if shape.tied_embeddings else nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # A pipeline stage is this model with the parts of other stages removed: without
        # an embedding its input is the previous stage's hidden state, without a final
        # norm it returns its own hidden state (``measure.pipeline``).
        x = self.embed(tokens) if self.embed is not None else tokens
        for block in (self.blocks.values() if isinstance(self.blocks, nn.ModuleDict) else self.blocks):
            x = block(x)
        if self.norm is None:
            return x
        x = self.norm(x)
        if self.head is None:
            return x @ self.embed.weight.t()
        return self.head(x)


def build(shape: TinyShape, seed: int, recompute: str = "none") -> TinyTransformer:
    """The model with deterministic initial values (the same for every rank and the reference);
    ``recompute`` full checkpoints every block, selective the attention core of every block."""
    torch.manual_seed(seed)
    m = TinyTransformer(shape)
    for block in m.blocks:
        block.recompute = recompute == "full"
        block.attn.recompute_core = recompute == "selective"
    return m


def use_dropout(m: TinyTransformer, dropout: HiddenDropout) -> None:
    """Hidden dropout on every block of ``m``."""
    for i, block in enumerate(m.blocks.values() if isinstance(m.blocks, nn.ModuleDict) else m.blocks):
        block.dropout, block.index = dropout, i
