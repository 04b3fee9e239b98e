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


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor's local storage (a DTensor's shard, else the tensor itself)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def clip_global(params, max_norm: float) -> None:
    torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)


def clip_local(params, max_norm: float) -> None:
    """The bug: the clip coefficient from the norm of this rank's shards only."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
