"""Apply a ``Realisation`` to the tiny transformer with PyTorch's own implementations (torch).

Input: a ``Realisation``, the model and the run's ``DeviceMesh``. Output: a ``Trainer``
holding the wrapped module, its optimizer and the gradient-clipping step. Data axes:
DistributedDataParallel (``gradient_as_bucket_view=True``, so the gradients are the
bucket storage), ZeroRedundancyOptimizer, FSDP2 ``fully_shard`` (one unit per block,
then the root) over one axis or HYBRID_SHARD over two. Tensor axis: DTensor
``parallelize_module`` with ColwiseParallel on the fused q/k/v projection and the first
MLP layer, RowwiseParallel on the output projections, and SequenceParallel on the norms
when the plan asks for sequence parallelism. Realised bug overrides: a DDP
communication hook that skips the all-reduce or sums without averaging, a second
all-reduce of DDP's already averaged gradients by the training loop, FSDP's gradient
divide factor 1, a clip coefficient computed from each rank's local shard (FSDP shards or
tensor-parallel shards), and ZeroRedundancyOptimizer stepping without broadcasting the
updated parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..realise import Realisation

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


def _optimizer_class(kind: str):
    if kind == "adam":
        return torch.optim.Adam, {"lr": LR[kind], "eps": ADAM_EPS}
    if kind == "sgd_momentum":
        return torch.optim.SGD, {"lr": LR[kind], "momentum": 0.9}
    return torch.optim.SGD, {"lr": LR[kind]}


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


@dataclass
class Trainer:
    module: nn.Module  # what forward is called on
    inner: nn.Module  # the TinyTransformer (parameters, named as in the reference)
    optimizer: torch.optim.Optimizer
    optimizer_state: Callable[[], dict]  # the state this rank holds
    clip: Callable[[], None] | None
    # name -> (mesh, placements) of parameters that DDP holds as plain local shards
    layouts: dict = field(default_factory=dict)
    # the parameter objects the optimizer updates, by name (a DDP + TP module re-registers
    # fresh Parameter views of them around every forward)
    named: list = field(default_factory=list)
    # what the training loop does by hand after backward (a second gradient all-reduce)
    after_backward: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if not self.named:
            self.named = list(self.inner.named_parameters())

    def full(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """The whole parameter (a collective for sharded ones)."""
        if name in self.layouts:
            from torch.distributed.tensor import DTensor

            mesh, placements = self.layouts[name]
            p = DTensor.from_local(p, mesh, placements, run_check=False)
        return p.full_tensor() if hasattr(p, "full_tensor") else p

    def sharded_on(self, name: str, p: torch.Tensor, axis: str) -> bool:
        mesh, placements = self.layouts.get(name, (getattr(p, "device_mesh", None), getattr(p, "placements", ())))
        names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
        return axis in names and not placements[names.index(axis)].is_replicate()


def _skip_allreduce_hook(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _divided_allreduce_hook(group, divisor: float):
    """Sum the bucket over ``group``, then divide by ``divisor`` (DDP's own hook divides by the size)."""

    def hook(state, bucket):
        work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
        return work.get_future().then(lambda f: f.value()[0].div_(divisor))

    return hook


def allreduce_again(params, group):
    """The bug: the loop all-reduces (sums) gradients that DDP has already averaged."""

    def run() -> None:
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)

    return run


def tensor_parallel(model: nn.Module, mesh, sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    for block in model.blocks:
        if sequence_parallel:
            plan = {
                "norm1": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                "norm2": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
            }
        else:
            plan = {
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(),
                "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(),
            }
        parallelize_module(block, mesh, plan)
    if sequence_parallel:
        # The replicated embedding's output enters the blocks sequence-sharded (a local
        # slice forward, an all-gather of its gradient backward); the final norm runs
        # sequence-parallel and the replicated head gets the gathered sequence.
        parallelize_module(model, mesh, {
            "embed": PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),),
                                         use_local_output=True),
            "norm": SequenceParallel(),
        })
        parallelize_module(model, mesh, {
            "norm": PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
                                        use_local_output=True),
        })


def apply(r: Realisation, model: nn.Module, mesh) -> Trainer:
    """Wrap ``model`` as ``r`` says; ``mesh`` is a DeviceMesh with the plan's axis names."""
    if r.tensor_axis is not None:
        tensor_parallel(model, mesh[r.tensor_axis], r.sequence_parallel)
    params = list(model.parameters())
    clip = None
    if r.data in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        layouts = {}
        if r.tensor_axis is not None:
            # DDP reduces plain tensors: PyTorch's own DDP + TP path swaps the DTensor
            # parameters for their local shards and rebuilds DTensors before each forward.
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            layouts = {n: (p.device_mesh, p.placements) for n, p in model.named_parameters() if hasattr(p, "placements")}
            _pre_dp_module_transform(model)
            params = list(model.parameters())
        named = list(model.named_parameters())
        group = mesh[r.data_axes[0]].get_group()
        module = DDP(model, process_group=group, gradient_as_bucket_view=True)
        if r.grad_reduce == "none":
            module.register_comm_hook(None, _skip_allreduce_hook)
        elif r.grad_divide and r.grad_divide != r.data_size:
            module.register_comm_hook(None, _divided_allreduce_hook(group, float(r.grad_divide)))
        if r.data == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            cls, kw = _optimizer_class(r.optimizer)
            opt = ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group, **kw)
            if not r.regather:
                opt._sync_params = lambda: None  # the bug: updated shards are never broadcast
            state = lambda: opt.optim.state
        else:
            opt = make_optimizer(r.optimizer, params)
            state = lambda: opt.state
        if r.clip == "global":
            clip = lambda: clip_global(params, MAX_NORM)
        elif r.clip == "local":
            clip = lambda: clip_local(params, MAX_NORM)
        again = allreduce_again(params, group) if r.grad_reduce == "twice" else None
        return Trainer(module, model, opt, state, clip, layouts, named, again)
    if r.data in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        dp_mesh = mesh[r.data_axes[0]] if r.data == "fsdp" else mesh[tuple(r.data_axes)]
        for block in model.blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=r.reshard_after_forward)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=r.reshard_after_forward)
        if r.grad_divide and r.grad_divide != r.data_size:
            model.set_gradient_divide_factor(float(r.grad_divide))
        params = list(model.parameters())
    opt = make_optimizer(r.optimizer, params)
    if r.clip == "global":
        clip = lambda: clip_global(params, MAX_NORM)
    elif r.clip == "local":
        clip = lambda: clip_local(params, MAX_NORM)
    return Trainer(model, model, opt, lambda: opt.state, clip)
