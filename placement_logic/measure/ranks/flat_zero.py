"""ZeRO stage 1 and 2 as the ZeRO paper states them, over one data-parallel process group (torch)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .common import local, make_optimizer


def _local_grad(p: torch.Tensor) -> torch.Tensor:
    """The gradient of ``p`` laid out as ``p``'s local part (zeros when it has none). A DTensor
    gradient placed otherwise than its parameter (DTensor's vocabulary-parallel embedding leaves
    a Replicate gradient on a Shard(0) weight) is redistributed to the parameter's placement
    first: a local slice, no collective."""
    g = p.grad
    if g is None:
        return torch.zeros_like(local(p))
    if hasattr(g, "redistribute") and tuple(g.placements) != tuple(p.placements):
        g = g.redistribute(p.device_mesh, p.placements)
    return local(g)


class FlatZero:
    """ZeRO stage 1 or 2 over one data-parallel process group, as the ZeRO paper states it.

    Parameters stay whole on every rank (the model's own tensors). The optimizer holds
    one flat fp32 shard: rank ``i`` of ``n`` owns elements ``[i·Ψ/n, (i+1)·Ψ/n)`` of the
    parameters laid end to end (padded with zeros to a multiple of ``n``), as its master
    copy with the optimizer's moments. After backward the whole local gradient, laid out
    the same way, is reduce-scattered (a sum, then divided by ``divide``) into the shard's
    gradient. Stage 1 keeps the whole gradient tensors (the plan's grads R); stage 2
    frees them once reduced and holds only the shard's gradient (grads S). The step
    updates the shard, then all-gathers the shards into the whole parameters
    (``regather=False``: the bug that skips it, each rank copying back only its own
    shard).
    """

    def __init__(self, params, group, stage: int, kind: str, divide: float, regather: bool) -> None:
        self.params, self.group, self.stage, self.divide, self.regather = list(params), group, stage, divide, regather
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        total = sum(local(p).numel() for p in self.params)
        self.pad = (-total) % self.n
        self.size = (total + self.pad) // self.n
        flat = self._flat([local(p).detach() for p in self.params])
        self.master = nn.Parameter(flat[self.rank * self.size:(self.rank + 1) * self.size].clone())
        self.optim = make_optimizer(kind, [self.master])
        self.state = self.optim.state
        self.param_groups = self.optim.param_groups

    def _flat(self, tensors) -> torch.Tensor:
        parts = [t.reshape(-1) for t in tensors]
        if self.pad:
            parts.append(torch.zeros(self.pad, dtype=parts[0].dtype, device=parts[0].device))
        return torch.cat(parts)

    def reduce_gradients(self) -> None:
        for p in self.params:
            g = p.grad
            if g is not None and hasattr(g, "redistribute") and tuple(g.placements) != tuple(p.placements):
                p.grad = g.redistribute(p.device_mesh, p.placements)  # held as the parameter's own shard
        grads = [_local_grad(p) for p in self.params]
        shard = torch.empty(self.size, dtype=grads[0].dtype, device=grads[0].device)
        dist.reduce_scatter_tensor(shard, self._flat(grads), group=self.group)
        shard.div_(self.divide)
        self.master.grad = shard if self.master.grad is None else self.master.grad.add_(shard)
        if self.stage == 2:
            for p in self.params:
                p.grad = None

    def held_gradients(self) -> list:
        return [self.master.grad] if self.stage == 2 else [p.grad for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        self.optim.step()
        if self.regather:
            whole = torch.empty(self.size * self.n, dtype=self.master.dtype, device=self.master.device)
            dist.all_gather_into_tensor(whole, self.master.detach(), group=self.group)
            lo, hi = 0, len(whole) - self.pad
        else:  # the bug: each rank keeps only its own shard's update
            whole = torch.zeros(self.size * self.n, dtype=self.master.dtype, device=self.master.device)
            lo, hi = self.rank * self.size, (self.rank + 1) * self.size
            whole[lo:hi] = self.master.detach()
        offset = 0
        for p in self.params:
            t = local(p)
            end = offset + t.numel()
            a, b = max(offset, lo), min(end, hi)
            if a < b:
                t.view(-1)[a - offset:b - offset].copy_(whole[a:b])
            offset = end

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.master.grad = None
