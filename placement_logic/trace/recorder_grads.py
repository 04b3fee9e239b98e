"""What each step's first backward pass finds in the gradient buffers (torch).

Before the first ``backward()`` of a step (the first after an optimizer step) the recorder reads the
gradient of every parameter held by a module seen in forward: a buffer that is ``None`` or all zeros
was cleared since the previous optimizer step (``zero_grad``, ``p.grad = None``); a nonzero one was
not, and this step's backward adds into it. The step's record gets ``grads_before``: ``carried``
(whether any buffer still held a gradient; ``None`` where no parameter was read) and ``names`` (the
parameters whose buffers did, at most ``NAMES_MAX``), which ``lift_timing`` reads. Each later backward of
the step (the next accumulated micro-step) appends its ``carried`` to ``grads_between``: whether the
buffers were cleared since the previous backward, which ``lift_rereduce`` reads.
"""

from __future__ import annotations

from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor

NAMES_MAX = 256


def grads_before(modules, names: dict[int, str]) -> dict:
    """``{"carried": bool | None, "names": [...]}`` for the parameters of ``modules`` (each read once)."""
    seen: set[int] = set()
    carried: list[str] = []
    for m in modules:
        for p in m.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            g = p.grad
            if g is None:
                continue
            local = g.to_local() if isinstance(g, DTensor) else g
            if isinstance(local, FakeTensor) or not local.numel():
                continue
            if bool(local.count_nonzero()):
                carried.append(names.get(id(p), "<unnamed>"))
    return {"carried": bool(carried) if seen else None, "names": sorted(carried)[:NAMES_MAX]}


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
    seen: set[int] = set()
    for m in modules:
        for p in m.parameters(recurse=False):
            if id(p) in seen or p.grad is None:
                continue
            seen.add(id(p))
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            if not isinstance(local, FakeTensor) and local.numel():
                events._add(local, (GRADS_EVENT, micro))
