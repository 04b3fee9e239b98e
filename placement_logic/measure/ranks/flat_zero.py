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
    shard). ``keep_whole`` (the bug of override grads: reduce_accumulated_every_microbatch): the
    whole gradients are never cleared within the step, so each microbatch's backward adds into
    the earlier ones and every reduce-scatter reduces them again into the shard's gradient.

    The shard is fp32 whatever the parameters' dtype; gradients are reduce-scattered and the
    updated shard all-gathered in the parameters' dtype (bf16 parameters: bf16 collectives,
    the shard's gradient held in bf16 and cast to fp32 for the step). With ``master_copy``
    the fp32 shard is the optimizer's master copy and counted as its state.
    """

    def __init__(self, params, group, stage: int, kind: str, divide: float, regather: bool,
                 master_copy: bool = False, keep_whole: bool = False) -> None:
        self.params, self.group, self.stage, self.divide, self.regather = list(params), group, stage, divide, regather
        self.keep_whole = keep_whole
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        total = sum(local(p).numel() for p in self.params)
        self.pad = (-total) % self.n
        self.size = (total + self.pad) // self.n
        flat = self._flat([local(p).detach() for p in self.params])
        self.dtype = flat.dtype
        self.master = nn.Parameter(flat[self.rank * self.size:(self.rank + 1) * self.size].to(torch.float32, copy=True))
        self.master_copy = master_copy
        self.shard_grad = None  # the shard's reduced gradient, in the gradients' dtype
        self.optim = make_optimizer(kind, [self.master])
        self.param_groups = self.optim.param_groups

    @property
    def state(self) -> dict:
        if not self.master_copy:
            return self.optim.state
        return {0: {"master": self.master, **self.optim.state.get(self.master, {})}}

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
        self.shard_grad = shard if self.shard_grad is None else self.shard_grad.add_(shard)
        if self.stage == 2 and not self.keep_whole:
            for p in self.params:
                p.grad = None

    def held_gradients(self) -> list:
        if self.stage == 2 and self.keep_whole:  # the whole buffer kept beside the shard's gradient
            return [self.shard_grad] + [p.grad for p in self.params]
        return [self.shard_grad] if self.stage == 2 else [p.grad for p in self.params]

    @property
    def flat_params(self) -> list:
        """The parameters in the order ``whole_local`` returns their gradients."""
        return self.params

    def gradient_copy(self) -> torch.Tensor:
        """A copy of this rank's reduced gradient shard (no collective)."""
        return self.shard_grad.detach().clone()

    def whole_local(self, shard: torch.Tensor) -> list:
        """Every parameter's local gradient from a copy of this rank's reduced shard: the shards
        gathered over the group (a collective) and cut as the parameters were laid end to end."""
        whole = torch.empty(self.size * self.n, dtype=shard.dtype, device=shard.device)
        dist.all_gather_into_tensor(whole, shard.contiguous(), group=self.group)
        out, offset = [], 0
        for p in self.params:
            t = local(p)
            out.append(whole[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        return out

    @torch.no_grad()
    def step(self) -> None:
        self.master.grad = None if self.shard_grad is None else self.shard_grad.to(torch.float32)
        self.optim.step()
        updated = self.master.detach().to(self.dtype)
        if self.regather:
            whole = torch.empty(self.size * self.n, dtype=self.dtype, device=self.master.device)
            dist.all_gather_into_tensor(whole, updated, group=self.group)
            lo, hi = 0, len(whole) - self.pad
        else:  # the bug: each rank keeps only its own shard's update
            whole = torch.zeros(self.size * self.n, dtype=self.dtype, device=self.master.device)
            lo, hi = self.rank * self.size, (self.rank + 1) * self.size
            whole[lo:hi] = updated
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
        self.shard_grad = None


class ExpertZero:
    """ZeRO-1 over a data axis with expert parallelism: the optimizer state of the other
    parameters (replicated over the expert axis) is sharded over both axes, the experts' (split
    over the expert axis) over the data axis.

    Each data-parallel rank ``i`` of ``n`` owns a contiguous piece of the other parameters
    (laid end to end, padded to a multiple of n·e) and of its experts (padded to a multiple of
    n). After backward one reduce-scatter over the data axis of the whole local gradient, laid
    out piece by piece (rank i's other-parameter piece, then its expert piece), gives rank i
    both pieces summed; a reduce-scatter over the expert axis of its other-parameter piece
    leaves it 1/e of that. The optimizer steps on those shards; an all-gather over the expert
    axis and one over the data axis (the same layout) bring the whole parameters back.
    Gradients are divided by ``divide`` (the other parameters) and ``divide_experts``.
    """

    def __init__(self, dense, experts, group, expert_group, kind: str, divide: float, divide_experts: float) -> None:
        self.dense, self.experts = list(dense), list(experts)
        self.group, self.expert_group = group, expert_group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.e, self.erank = dist.get_world_size(expert_group), dist.get_rank(expert_group)
        self.divide, self.divide_experts = divide, divide_experts
        nd = sum(p.numel() for p in self.dense)
        ne = sum(p.numel() for p in self.experts)
        self.dpad = (-nd) % (self.n * self.e)
        self.epad = (-ne) % self.n
        self.dpiece, self.epiece = (nd + self.dpad) // self.n, (ne + self.epad) // self.n
        self.dshard = self.dpiece // self.e
        d, x = self._flats([p.detach() for p in self.dense], [p.detach() for p in self.experts])
        lo = self.rank * self.dpiece + self.erank * self.dshard
        self.master_dense = nn.Parameter(d[lo:lo + self.dshard].clone())
        self.master_experts = nn.Parameter(x[self.rank * self.epiece:(self.rank + 1) * self.epiece].clone())
        self.optim = make_optimizer(kind, [self.master_dense, self.master_experts])
        self.state = self.optim.state
        self.param_groups = self.optim.param_groups

    def _flats(self, dense, experts):
        def flat(ts, pad):
            parts = [t.reshape(-1) for t in ts]
            if pad:
                parts.append(torch.zeros(pad, dtype=parts[0].dtype, device=parts[0].device))
            return torch.cat(parts)

        return flat(dense, self.dpad), flat(experts, self.epad)

    def _interleave(self, d, x):
        """Rank i's other-parameter piece, then its expert piece, for every i in turn."""
        return torch.cat([torch.cat([d[i * self.dpiece:(i + 1) * self.dpiece], x[i * self.epiece:(i + 1) * self.epiece]])
                          for i in range(self.n)])

    def reduce_gradients(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.dense + self.experts]
        d, x = self._flats(grads[:len(self.dense)], grads[len(self.dense):])
        mine = torch.empty(self.dpiece + self.epiece, dtype=d.dtype, device=d.device)
        dist.reduce_scatter_tensor(mine, self._interleave(d, x), group=self.group)
        shard = torch.empty(self.dshard, dtype=d.dtype, device=d.device)
        dist.reduce_scatter_tensor(shard, mine[:self.dpiece].contiguous(), group=self.expert_group)
        self.master_dense.grad = shard.div_(self.divide)
        self.master_experts.grad = mine[self.dpiece:].clone().div_(self.divide_experts)

    def held_gradients(self) -> list:
        return [p.grad for p in self.dense + self.experts]

    @property
    def flat_params(self) -> list:
        return self.dense + self.experts

    def gradient_copy(self) -> tuple:
        """Copies of this rank's two reduced shards (no collective)."""
        return self.master_dense.grad.detach().clone(), self.master_experts.grad.detach().clone()

    def whole_local(self, copy: tuple) -> list:
        """Every parameter's local gradient (other parameters, then experts) from ``gradient_copy``'s
        shards, gathered as ``step`` gathers the updated parameters (collectives)."""
        dense, experts = copy
        piece = torch.empty(self.dpiece, dtype=dense.dtype, device=dense.device)
        dist.all_gather_into_tensor(piece, dense, group=self.expert_group)
        whole = torch.empty(self.n * (self.dpiece + self.epiece), dtype=dense.dtype, device=dense.device)
        dist.all_gather_into_tensor(whole, torch.cat([piece, experts]), group=self.group)
        whole = whole.view(self.n, self.dpiece + self.epiece)
        d, x = whole[:, :self.dpiece].reshape(-1), whole[:, self.dpiece:].reshape(-1)
        out = []
        for params, flat in ((self.dense, d), (self.experts, x)):
            offset = 0
            for p in params:
                out.append(flat[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()
        return out

    @torch.no_grad()
    def step(self) -> None:
        self.optim.step()
        piece = torch.empty(self.dpiece, dtype=self.master_dense.dtype, device=self.master_dense.device)
        dist.all_gather_into_tensor(piece, self.master_dense.detach(), group=self.expert_group)
        whole = torch.empty(self.n * (self.dpiece + self.epiece), dtype=piece.dtype, device=piece.device)
        dist.all_gather_into_tensor(whole, torch.cat([piece, self.master_experts.detach()]), group=self.group)
        whole = whole.view(self.n, self.dpiece + self.epiece)
        d, x = whole[:, :self.dpiece].reshape(-1), whole[:, self.dpiece:].reshape(-1)
        for params, flat in ((self.dense, d), (self.experts, x)):
            offset = 0
            for p in params:
                p.view(-1).copy_(flat[offset:offset + p.numel()])
                offset += p.numel()

    def zero_grad(self) -> None:
        for p in self.dense + self.experts:
            p.grad = None
        self.master_dense.grad = None
        self.master_experts.grad = None
