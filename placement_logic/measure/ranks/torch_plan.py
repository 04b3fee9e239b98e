"""Apply a ``Realisation`` to the tiny transformer with PyTorch's own implementations (torch).

Input: a ``Realisation``, the model and the run's ``DeviceMesh``. Output: a ``Trainer``
holding the wrapped module, its optimizer and the gradient-clipping step. Data axes:
DistributedDataParallel (``gradient_as_bucket_view=True``, so the gradients are the
bucket storage), ZeRO-1 and ZeRO-2 (``FlatZero``: whole parameters, a flat fp32
optimizer shard, the gradient reduce-scattered into it and the updated shards
all-gathered back, as the ZeRO paper states them), FSDP2 ``fully_shard`` (one unit per block,
then the root) over one axis or HYBRID_SHARD over two. Tensor axis: DTensor
``parallelize_module`` with ColwiseParallel on the fused q/k/v projection and the first
MLP layer, RowwiseParallel on the output projections, and SequenceParallel on the norms
when the plan asks for sequence parallelism. Realised bug overrides: a DDP
communication hook that skips the all-reduce or sums without averaging, a second
all-reduce of DDP's already averaged gradients by the training loop, FSDP's gradient
divide factor 1, a clip coefficient computed from each rank's local shard (FSDP shards or
tensor-parallel shards), ZeRO stepping without all-gathering the updated
parameters, and ZeRO reduce-scattering its never-cleared whole gradients after every
microbatch (``FlatZero(keep_whole=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..realise import Realisation
from .common import ADAM_EPS, LR, MAX_NORM, clip_global, clip_local, local, make_optimizer, make_training_optimizer
from .flat_zero import ExpertZero, FlatZero
from .tensor_parallel import tensor_parallel

__all__ = ["ADAM_EPS", "LR", "MAX_NORM", "FlatZero", "Trainer", "apply", "clip_global", "clip_local", "local",
           "make_optimizer", "make_training_optimizer", "tensor_parallel"]


@dataclass
class Trainer:
    module: nn.Module  # what forward is called on
    inner: nn.Module  # the TinyTransformer (parameters, named as in the reference)
    optimizer: torch.optim.Optimizer  # or ``MasterCopy``, ``FlatZero``: step, zero_grad, param_groups
    optimizer_state: Callable[[], dict]  # the state this rank holds
    clip: Callable[[], None] | None
    # name -> (mesh, placements) of parameters that DDP holds as plain local shards
    layouts: dict = field(default_factory=dict)
    # the parameter objects the optimizer updates, by name (a DDP + TP module re-registers
    # fresh Parameter views of them around every forward)
    named: list = field(default_factory=list)
    # what the training loop does by hand after backward (a second gradient all-reduce, ZeRO's reduce-scatter)
    after_backward: Callable[[], None] | None = None
    # the gradient tensors this rank holds after backward (default: the parameters' .grad)
    held_gradients: Callable[[], list] | None = None
    # the logits are vocabulary-sharded DTensors: the loss runs under loss_parallel()
    loss_parallel: bool = False
    # gradient accumulation: a context that skips the gradient synchronisation of a microbatch
    # (DDP's no_sync) and what runs after each microbatch's backward (ZeRO-2's reduce-scatter)
    no_sync: Callable | None = None
    after_microbatch: Callable[[], None] | None = None
    # the first step's reduced gradients, compared with one process's: copied after backward, the
    # hand-written reductions and clipping (no collective), and made whole afterwards
    # (collectives, outside the counted step). By default the parameters' .grad; ZeRO's flat
    # shards when it holds them (``flat_gradients``)
    flat_gradients: object | None = None  # a FlatZero or ExpertZero

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

    def copy_gradients(self):
        """This rank's reduced gradients, copied (no collective)."""
        if self.flat_gradients is not None:
            return self.flat_gradients.gradient_copy()
        return [(n, p.grad.detach().clone()) for n, p in self.named if p.grad is not None]

    def whole_gradients(self, copy) -> dict:
        """The whole gradient of every parameter from ``copy`` (collectives for sharded ones; every
        rank calls it at the same point)."""
        pairs = copy
        if self.flat_gradients is not None:
            names = {id(p): n for n, p in self.named}
            flat = self.flat_gradients
            pairs = [(names[id(p)], g) for p, g in zip(flat.flat_params, flat.whole_local(copy))]
        return {n: self.full(n, g).detach().cpu().float() for n, g in pairs}

    def sharded_on(self, name: str, p: torch.Tensor, axis: str) -> bool:
        mesh, placements = self.layouts.get(name, (getattr(p, "device_mesh", None), getattr(p, "placements", ())))
        names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
        return axis in names and not placements[names.index(axis)].is_replicate()


class _RebuildLabelled:
    """DDP's C++ reducer, seen from Python, with its one-time bucket rebuild labelled.

    After the first backward, DDP rebuilds its buckets in the order the gradients became
    ready and broadcasts the new bucket layout from rank 0 (``Reducer._rebuild_buckets``,
    called once, from the next forward). That broadcast is set-up, not part of a
    training step: it is recorded in the phase ``setup``, which the comparison leaves
    out of the compared step (and reports as one-time)."""

    def __init__(self, reducer) -> None:
        self._reducer = reducer

    def __getattr__(self, name):
        return getattr(self._reducer, name)

    def _rebuild_buckets(self):
        from .counter import one_time

        with one_time():
            return self._reducer._rebuild_buckets()


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


def group_of(name: str) -> str | None:
    """The parameter group a tensor-parallel whole copy belongs to: norms (weights and biases of
    every norm) or biases (the row-parallel output projections' biases); None for the others."""
    parts = name.split(".")
    if any(x.startswith("norm") for x in parts[:-1]):
        return "norms"
    if parts[-1] == "bias" and len(parts) >= 2 and parts[-2] in ("proj", "fc2"):
        return "biases"
    return None


def _pre_dp_transform(model: nn.Module, r: Realisation) -> None:
    """PyTorch's DDP + TP path (``_pre_dp_module_transform``): DTensor parameters swapped for their
    local tensors, DTensors rebuilt before each forward. The parameters of a group in
    ``r.tensor_unreduced`` are rebuilt with a partial gradient placement, so their backward keeps
    the local partial sum instead of reducing it over the tensor axis (the plan's override)."""
    from torch.distributed.tensor import DTensor, Partial
    from torch.distributed.tensor.parallel.ddp import _get_submodule_n_params, _localize_dtensor, _update_module_param

    if not r.tensor_unreduced:
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

        _pre_dp_module_transform(model)
        return
    partial = {n for n, _ in model.named_parameters() if group_of(n) in r.tensor_unreduced}

    def reconstruct(module, _input):
        swaps = []
        for name, t in module.named_parameters():
            if hasattr(t, "_st_info"):
                spec = t._st_info
                grad = tuple(Partial() if pl.is_replicate() else pl for pl in spec.placements) \
                    if name in partial else None
                d = DTensor.from_local(t, spec.mesh, spec.placements, run_check=False, shape=spec.shape,
                                       stride=spec.stride, grad_placements=grad)
                swaps.append((*_get_submodule_n_params(module, name), d))
        _update_module_param(swaps)

    _localize_dtensor(model, None, None)
    model.register_forward_pre_hook(reconstruct)
    model.register_forward_hook(_localize_dtensor)


def reduce_again_over(params, names, groups, group):
    """The bug: the whole copies of ``groups`` (equal on every tensor rank) summed over the tensor axis."""
    chosen = [p for n, p in zip(names, params) if group_of(n) in groups]

    def run() -> None:
        for p in chosen:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)

    return run


def _chain(*fs):
    fs = [f for f in fs if f is not None]
    if not fs:
        return None

    def run() -> None:
        for f in fs:
            f()

    return run


def apply(r: Realisation, model: nn.Module, mesh) -> Trainer:
    """Wrap ``model`` as ``r`` says; ``mesh`` is a DeviceMesh with the plan's axis names."""
    vocab_parallel = False
    if r.tensor_axis is not None:
        vocab_parallel = tensor_parallel(model, mesh[r.tensor_axis], r.sequence_parallel)
    trainer = _apply(r, model, mesh)
    trainer.loss_parallel = vocab_parallel
    return trainer


def split_experts(r: Realisation, model: nn.Module, mesh) -> dict:
    """Expert parallelism: each rank keeps its E/ep experts of every block; returns their layouts
    (Shard(0) over the expert axis) so that the whole parameters can be gathered for comparison."""
    from torch.distributed.tensor import Shard

    ep_mesh = mesh[r.expert_axis]
    group, size, index = ep_mesh.get_group(), r.sizes[r.expert_axis], ep_mesh.get_local_rank()
    for block in model.blocks:
        block.mlp.split_experts(size, index)
        block.mlp.expert = (group, size, index)
    return {n: (ep_mesh, (Shard(0),)) for n, _ in model.named_parameters() if is_expert(n)}


def is_expert(name: str) -> bool:
    from .model import EXPERT_PARAMS

    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "mlp" and parts[-1] in EXPERT_PARAMS


def expert_sync(r: Realisation, named, mesh, data_divide: float):
    """After the data-axis reduction (which divided by ``data_divide``): the other parameters'
    gradients summed over the expert axis, and every gradient brought to the plan's divisor —
    the experts' (each already the sum over the expert axis's tokens, by the all-to-all's
    backward) to ``r.expert_divide`` (default: the data-parallel size times the expert axis's)."""
    group = mesh[r.expert_axis].get_group()
    dense = [p for n, p in named if not is_expert(n)]
    experts = [p for n, p in named if is_expert(n)]
    total = float(r.grad_divide or r.data_size)
    per_expert = float(r.expert_divide or total)

    def run() -> None:
        for p in dense:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(total / data_divide)
        for p in experts:
            if p.grad is not None:
                p.grad.div_(per_expert / data_divide)

    return run


def ring_context(r: Realisation, model: nn.Module, mesh) -> None:
    """Context parallelism: every block's attention runs as a ring over the context axis."""
    ring = mesh[r.context_axis].get_group()
    context = (ring, tuple(dist.get_process_group_ranks(ring)), dist.get_rank(ring))
    for block in model.blocks:
        block.attn.context = context


def replicate_shard_mesh(r: Realisation):
    """A 2-D DeviceMesh (context axis, data axis) for HYBRID_SHARD: replicated over the context
    axis, sharded over the data axis, whatever their order in the plan's mesh."""
    from torch.distributed.device_mesh import DeviceMesh

    names = [a for a, _ in r.mesh]
    ranks = torch.arange(r.world).view(*[n for _, n in r.mesh])
    ranks = ranks.permute(names.index(r.context_axis), names.index(r.data_axes[0]))
    return DeviceMesh("cpu", ranks.contiguous(), mesh_dim_names=(r.context_axis, r.data_axes[0]))


def _clip(r: Realisation, params: list):
    """The plan's clip of the gradients' norm over these parameters (global or per rank), if any."""
    if r.clip == "global":
        return lambda: clip_global(params, MAX_NORM)
    if r.clip == "local":
        return lambda: clip_local(params, MAX_NORM)
    return None


def _tensor_layouts(r: Realisation, model: nn.Module) -> dict:
    """The tensor-parallel module on plain local tensors, its parameters' layouts kept (as PyTorch's own
    DDP + TP path does: ZeRO shards and DDP reduces plain tensors)."""
    if r.tensor_axis is None:
        return {}
    layouts = {n: (p.device_mesh, p.placements) for n, p in model.named_parameters() if hasattr(p, "placements")}
    _pre_dp_transform(model, r)
    return layouts


def _apply_zero(r: Realisation, model: nn.Module, mesh, expert_layouts: dict) -> Trainer:
    """ZeRO-1 or ZeRO-2 (the experts' own ZeRO-1 under an expert axis)."""
    layouts = _tensor_layouts(r, model)
    layouts.update(expert_layouts)
    named = list(model.named_parameters())
    group = mesh[r.data_axes[0]].get_group()
    if r.expert_axis is not None and r.data == "zero1":
        total = float(r.grad_divide or r.data_size)
        zero = ExpertZero([p for n, p in named if not is_expert(n)], [p for n, p in named if is_expert(n)],
                          group, mesh[r.expert_axis].get_group(), r.optimizer, total,
                          float(r.expert_divide or total))
        return Trainer(model, model, zero, lambda: zero.state, None, layouts, named, zero.reduce_gradients,
                       zero.held_gradients, flat_gradients=zero)
    dp_divide = float(r.sizes[r.data_axes[0]]) if r.expert_axis else float(r.grad_divide or r.data_size)
    zero = FlatZero([p for _, p in named], group, 1 if r.data == "zero1" else 2, r.optimizer,
                    dp_divide, r.regather, r.master_copy, keep_whole=r.reduce_accumulated)
    # ZeRO-1 keeps whole gradients and reduce-scatters once per step; ZeRO-2 has no whole
    # gradient to accumulate in: every microbatch's gradient is reduce-scattered into the shard
    again = reduce_again_over([p for _, p in named], [n for n, _ in named], r.tensor_reduced_again,
                              mesh[r.tensor_axis].get_group()) if r.tensor_reduced_again else None
    if r.expert_axis is not None:
        # before ZeRO's reduce-scatter, which divides by the data axis's size
        again = _chain(again, expert_sync(r, named, mesh, float(r.sizes[r.data_axes[0]])))
    if r.data == "zero1" and not r.reduce_accumulated:
        return Trainer(model, model, zero, lambda: zero.state, None, layouts, named,
                       _chain(again, zero.reduce_gradients), zero.held_gradients, flat_gradients=zero)
    # ZeRO-2, and ZeRO-1 under override grads: reduce_accumulated_every_microbatch (its whole buffer
    # reduce-scattered after every microbatch, and not cleared)
    return Trainer(model, model, zero, lambda: zero.state, None, layouts, named, None, zero.held_gradients,
                   after_microbatch=_chain(again, zero.reduce_gradients), flat_gradients=zero)


def _apply_ddp(r: Realisation, model: nn.Module, mesh, expert_layouts: dict) -> Trainer:
    """DDP over the data axis (and the context axis), with the plan's hooks and extra reductions."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    layouts = _tensor_layouts(r, model)
    params = list(model.parameters())
    layouts.update(expert_layouts)
    named = list(model.named_parameters())
    group = mesh[r.data_axes[0]].get_group()
    if r.context_axis is not None:
        # the gradients are averaged over the data and the context axis: one group of both
        group = mesh[(r.data_axes[0], r.context_axis)]._flatten().get_group()
    module = DDP(model, process_group=group, gradient_as_bucket_view=True)
    if r.grad_reduce == "none":
        module.register_comm_hook(None, _skip_allreduce_hook)
    elif r.grad_divide and r.grad_divide != r.data_size:
        module.register_comm_hook(None, _divided_allreduce_hook(group, float(r.grad_divide)))
    module.reducer = _RebuildLabelled(module.reducer)
    if r.stepped_groups:  # override optimizer[G]: step_every_microbatch, G some of the groups
        from .stepped import SplitOptimizer, stepped

        each, rest = stepped(named, r.stepped_groups)
        opt = SplitOptimizer(make_training_optimizer(r.optimizer, each, r.master_copy),
                             make_training_optimizer(r.optimizer, rest, r.master_copy) if rest else None)
    else:
        opt = make_training_optimizer(r.optimizer, params, r.master_copy)
    state = lambda: opt.state
    again = allreduce_again(params, group) if r.grad_reduce == "twice" else None
    if r.expert_axis is not None:
        again = _chain(again, expert_sync(r, named, mesh, float(r.sizes[r.data_axes[0]])))
    if r.tensor_reduced_again:
        again = _chain(again, reduce_again_over(params, [n for n, _ in named], r.tensor_reduced_again,
                                                mesh[r.tensor_axis].get_group()))
    return Trainer(module, model, opt, state, _clip(r, params), layouts, named, again, no_sync=module.no_sync)


def _apply(r: Realisation, model: nn.Module, mesh) -> Trainer:
    expert_layouts = split_experts(r, model, mesh) if r.expert_axis is not None else {}
    if r.context_axis is not None:
        ring_context(r, model, mesh)
    params = list(model.parameters())
    if r.data in ("zero1", "zero2"):
        return _apply_zero(r, model, mesh, expert_layouts)
    if r.data == "ddp":
        return _apply_ddp(r, model, mesh, expert_layouts)
    if r.data in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        dp_mesh = mesh[r.data_axes[0]] if r.data == "fsdp" else mesh[tuple(r.data_axes)]
        if r.context_axis is not None:  # the gradients averaged over the context axis too: HYBRID_SHARD
            dp_mesh = replicate_shard_mesh(r)
        for block in model.blocks:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=r.reshard_after_forward)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=r.reshard_after_forward)
        if r.grad_divide and r.grad_divide != r.data_size:
            model.set_gradient_divide_factor(float(r.grad_divide))
        params = list(model.parameters())
    opt = make_training_optimizer(r.optimizer, params, r.master_copy)
    no_sync = _hsdp_accumulate(model) if r.data == "hsdp" or (r.data == "fsdp" and r.context_axis) else None
    return Trainer(model, model, opt, lambda: opt.state, _clip(r, params), no_sync=no_sync)


def _hsdp_accumulate(model):
    """HYBRID_SHARD gradient accumulation: every microbatch reduce-scatters over the shard axis
    (the plan's grads are S there), the replica all-reduce waits for the last microbatch (grads
    R on the replica axis accumulate) — FSDP2's ``set_requires_all_reduce``."""
    from contextlib import contextmanager

    @contextmanager
    def no_all_reduce():
        model.set_requires_all_reduce(False)
        try:
            yield
        finally:
            model.set_requires_all_reduce(True)

    return no_all_reduce
