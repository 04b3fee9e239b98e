"""The optimizer, the clipping step and local storage shared by every realisation (torch)."""

from __future__ import annotations

import torch

LR = {"adam": 1e-3, "sgd_momentum": 0.05, "sgd": 0.05}
# Adam's epsilon: the key bias has an exactly zero gradient (softmax is shift invariant),
# so its gradient is pure round-off; with eps = 1e-8 Adam turns that noise into full
# steps that differ between any two summation orders. 1e-6 keeps such steps below fp32
# noise while leaving every other update unchanged to ~1e-4 relative.
ADAM_EPS = 1e-6
MAX_NORM = 0.05  # small enough that clipping binds on every step of the tiny model


def make_optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(params, lr=LR[kind], eps=ADAM_EPS)
    if kind == "sgd_momentum":
        return torch.optim.SGD(params, lr=LR[kind], momentum=0.9)
    return torch.optim.SGD(params, lr=LR[kind])


def param_dtype(nbytes: int) -> torch.dtype:
    """The dtype of parameters and gradients of ``nbytes`` bytes (widths.DTYPES)."""
    return {2: torch.bfloat16, 4: torch.float32}[nbytes]


class MasterCopy:
    """Mixed-precision training's optimizer: an fp32 master copy of every parameter's local
    tensor, updated by ``kind`` (its moments fp32 too) from the gradient cast to fp32, then
    copied back into the (16-bit or fp32) parameter. The master copies and the moments are the
    optimizer's state; the fp32 gradient is a temporary of the step."""

    def __init__(self, kind: str, params) -> None:
        self.params = list(params)
        self.masters = [torch.nn.Parameter(local(p).detach().to(torch.float32, copy=True)) for p in self.params]
        self.inner = make_optimizer(kind, self.masters)
        self.param_groups = self.inner.param_groups

    @property
    def state(self) -> dict:
        return {i: {"master": m, **self.inner.state.get(m, {})} for i, m in enumerate(self.masters)}

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else local(p.grad).to(torch.float32, copy=True)
        self.inner.step()
        for p, m in zip(self.params, self.masters):
            local(p).copy_(m)
            m.grad = None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def make_training_optimizer(kind: str, params, master_copy: bool):
    """The optimizer of a realisation: ``kind`` on the parameters, or on fp32 master copies of them."""
    return MasterCopy(kind, params) if master_copy else make_optimizer(kind, params)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor's local storage (a DTensor's shard, else the tensor itself)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def clip_global(params, max_norm: float) -> None:
    """The global norm's clip. Gradients on DTensors of different meshes (FSDP-only parameters on
    the data mesh beside FSDP + tensor-parallel ones on the 2-D mesh) have no common norm in
    ``clip_grad_norm_`` (it stacks their norms): each mesh's norm is taken whole (a DTensor's norm
    counts every element once) and their squares summed, as torchtitan does for its meshes."""
    grads = [p.grad for p in params if p.grad is not None]
    by_mesh: dict = {}
    for g in grads:
        by_mesh.setdefault(getattr(g, "device_mesh", None), []).append(g)
    if len(by_mesh) <= 1:
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)
        return
    total_sq = None
    for gs in by_mesh.values():
        n = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs]))
        if hasattr(n, "full_tensor"):
            n = n.full_tensor()
        total_sq = n.float() ** 2 if total_sq is None else total_sq + n.float() ** 2
    coef = torch.clamp(max_norm / (total_sq.sqrt() + 1e-6), max=1.0)
    for g in grads:
        local(g).mul_(coef.to(local(g).dtype))


def clip_local(params, max_norm: float) -> None:
    """The bug: the clip coefficient from the norm of this rank's shards only."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
