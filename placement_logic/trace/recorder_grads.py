"""What each step's first backward pass finds in the gradient buffers (torch).

Before the first ``backward()`` of a step (the first after an optimizer step) the recorder reads the
gradient of every parameter held by a module seen in forward: a buffer that is ``None`` or all zeros
was cleared since the previous optimizer step (``zero_grad``, ``p.grad = None``); a nonzero one was
not, and this step's backward adds into it. The step's record gets ``grads_before``: ``carried``
(whether any buffer still held a gradient; ``None`` where no parameter was read) and ``names`` (the
parameters whose buffers did, at most ``NAMES_MAX``), which ``lift_timing`` reads. Each later backward of
the step (the next accumulated micro-step) appends its ``carried`` to ``grads_between``: whether the
buffers were cleared since the previous backward, which ``lift_rereduce`` reads. A module's weights are its
own parameters and the trainable tensors it holds as attributes, or the leaves these are made from (DDP over
tensor-parallel modules holds DTensors over local parameters there, outside ``parameters()``).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor

NAMES_MAX = 256


def _leaves(t) -> list:
    """The trainable leaves ``t`` is computed from through at most a few autograd nodes (a DTensor made from a
    local parameter: ``from_local`` over a view)."""
    out, stack, visited = [], [t.grad_fn], 0
    while stack and visited < 16:
        fn = stack.pop()
        visited += 1
        if fn is None:
            continue
        leaf = getattr(fn, "variable", None)  # AccumulateGrad: the leaf whose .grad it fills
        if leaf is not None:
            out.append(leaf)
        else:
            stack.extend(n for n, _ in fn.next_functions)
    return out


def weights(modules):
    """Every weight of ``modules`` once: each module's own parameters, then the trainable tensors it holds as
    attributes, or the leaves they are computed from (PyTorch's DDP over tensor-parallel modules,
    ``_pre_dp_module_transform``, sets a DTensor over each local parameter on the module before forward)."""
    seen: set[int] = set()
    for m in modules:
        held = []
        for v in vars(m).values():
            if isinstance(v, torch.Tensor) and v.requires_grad:
                held += [v] if v.is_leaf else _leaves(v)
        for p in [*m.parameters(recurse=False), *held]:
            if id(p) not in seen:
                seen.add(id(p))
                yield p


def grads_before(modules, names: dict[int, str], storage=None) -> dict:
    """``{"carried": bool | None, "names": [...]}`` for the weights of ``modules`` (each read once), named by
    ``names`` (parameter id) or else by ``storage()`` ((data pointer, shape, stride) of a local parameter -> name;
    built only when a weight with a gradient has no name)."""
    read = False
    carried: list[str] = []
    by_storage: dict[tuple, str] | None = None
    for p in weights(modules):
        read = True
        g = p.grad
        if g is None:
            continue
        local = g.to_local() if isinstance(g, DTensor) else g
        if isinstance(local, FakeTensor) or not local.numel():
            continue
        if bool(local.count_nonzero()):
            name = names.get(id(p))
            if name is None and storage is not None:
                by_storage = storage() if by_storage is None else by_storage
                name = by_storage.get((p.data_ptr(), tuple(p.shape), tuple(p.stride())))
            carried.append(name or "<unnamed>")
    return {"carried": bool(carried) if read else None, "names": sorted(carried)[:NAMES_MAX]}


GRADS_EVENT = "grads"


def inputs_read(rec: dict, in_events: list[tuple], phase: str) -> None:
    """A collective's record: the reductions its input went through already (``inputs_reduced``: an accumulated
    gradient reduced again) and, issued after backward, the backward passes whose gradient buffers its input was
    read from (``grads_read``, ``tag_grads``)."""
    rec["inputs_reduced"] = sorted({ev[1] for ev in in_events if ev[0] == "collective"})
    if phase == "after_backward":
        rec["grads_read"] = sorted({ev[1] for ev in in_events if ev[0] == GRADS_EVENT})


def tag_grads(events, modules, micro: int) -> None:
    """After a backward pass: every gradient buffer of ``modules`` carries ``(GRADS_EVENT, micro)``, through copies
    and arithmetic, so a collective issued after backward names the backward passes whose buffers it reads
    (``grads_read``: a copy of the accumulating buffer all-reduced again, ``lift_rereduce``)."""
    for p in weights(modules):
        if p.grad is not None:
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            if not isinstance(local, FakeTensor) and local.numel():
                events._add(local, (GRADS_EVENT, micro))
