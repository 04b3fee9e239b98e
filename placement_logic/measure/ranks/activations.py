"""Saved activations of a forward pass, counted as autograd saves them (torch).

Input: a model with ``blocks`` and a forward to run. Output: the bytes of the distinct
storages autograd saves for backward, per block (transformer layer) and in all, through
``torch.autograd.graph.saved_tensors_hooks``: every tensor packed for backward is seen
once, its storage counted once (views share it); integer tensors (token ids, targets,
routing indices) are left out, and so are parameters (a linear layer saves its weight, which
is a parameter, not an activation): a storage of a parameter, or a tensor whose autograd
history runs through views and DTensor conversions only to a leaf that accumulates a gradient
(a transposed tensor-parallel weight shard, whose local storage need not be the module
parameter's). Which storages
are parameters is read when a tensor is packed, from the parameters alive then: a sharded
data-parallel plan frees the gathered weights of a finished block, and the allocator may hand
their addresses to later activations, so addresses remembered from earlier blocks would drop
those activations from the count. The block a
saved tensor belongs to is the block whose forward is running; tensors saved outside any
block (embedding, final norm, head, loss) go to ``outside``. A recomputed block (full
recomputation) saves only its input during forward, which is what is counted.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


# autograd nodes of views and of DTensor conversions: a tensor reached through them only is the same data
_VIEWS = {"TBackward0", "TransposeBackward0", "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
          "ExpandBackward0", "AliasBackward0", "_FromTorchTensorBackward", "_ToTorchTensorBackward"}


class SavedActivations:
    """Counts saved storages per block while active (``with counter.recording(model): ...``)."""

    def __init__(self) -> None:
        self.per_block: dict[str, dict[int, int]] = {}
        self.current = "outside"
        self.block_params: set[int] = set()  # storages of the running block's (gathered) parameters
        self.model: nn.Module | None = None

    def _param_storages(self) -> set[int]:
        live = {_local(p).untyped_storage().data_ptr() for p in self.model.parameters()} if self.model else set()
        return live | self.block_params

    def _is_parameter(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a parameter or a view of one (a transposed weight, a tensor-parallel
        weight converted to or from a DTensor): its autograd history runs through view and
        conversion nodes only to a parameter's AccumulateGrad."""
        node = t.grad_fn
        while node is not None and type(node).__name__ in _VIEWS:
            nexts = [fn for fn, _ in node.next_functions if fn is not None]
            if len(nexts) != 1:
                return False
            node = nexts[0]
        # a leaf that accumulates a gradient: the harness's only such leaves are parameters (or, under
        # DTensor, their local shards), whose storage may be another than the module's parameter's
        return node is not None and type(node).__name__ == "AccumulateGrad"

    def _pack(self, t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not self._is_parameter(t):
            loc = _local(t)
            while type(loc) is not torch.Tensor and isinstance(getattr(loc, "elem", None), torch.Tensor):
                loc = loc.elem  # a wrapper subclass (functional collectives' AsyncCollectiveTensor)
            st = loc.untyped_storage()
            ptr = st.data_ptr()
            if st.nbytes() and ptr not in self._param_storages():
                seen = self.per_block.setdefault(self.current, {})
                seen[ptr] = max(seen.get(ptr, 0), st.nbytes())
        return t

    @contextmanager
    def recording(self, model: nn.Module):
        blocks = model.blocks.items() if isinstance(model.blocks, nn.ModuleDict) else \
            ((str(i), b) for i, b in enumerate(model.blocks))
        handles = []
        for name, block in blocks:
            def pre(module, args, name=name):
                self.current = name
                self.block_params = {_local(p).untyped_storage().data_ptr() for p in module.parameters()}

            def post(module, args, out):
                self.current = "outside"
                self.block_params = set()

            handles.append(block.register_forward_pre_hook(pre))
            handles.append(block.register_forward_hook(post))
        self.model = model
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield self
        finally:
            for h in handles:
                h.remove()
            self.model, self.block_params = None, set()

    def bytes(self) -> dict[str, int]:
        """Distinct saved bytes per block name (and ``outside``)."""
        return {k: sum(v.values()) for k, v in self.per_block.items()}


class _Held:
    """A tensor autograd keeps for backward, as the pack hook hands it over: autograd drops it
    when it frees the saved tensor (after the backward that used it)."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _unpack(x):
    return x.t if isinstance(x, _Held) else x


class LiveSavedPeak(SavedActivations):
    """The peak of the bytes autograd keeps for backward at once while active (``with
    peak.recording(models)``): what a pipeline stage keeps over its schedule, every microbatch in
    flight. A storage counts (once, however many saved tensors view it) while some tensor of it
    packed by autograd (floating point, not a parameter: as ``SavedActivations``) is still kept:
    the pack hook hands autograd a holder, and ``weakref.finalize`` on the holder sees autograd
    drop it. A storage that outlives its saved tensors (the pipeline runtime's receive buffers,
    reused every step) stops counting when they are dropped. The kept total only grows at a pack,
    so the largest total right after a pack is the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, saved tensors kept of it]
        self.total = 0
        self.peak = 0
        self.models: list[nn.Module] = []

    def _param_storages(self) -> set[int]:
        return {_local(p).untyped_storage().data_ptr() for m in self.models for p in m.parameters()}

    def _dropped(self, ptr: int) -> None:
        entry = self.live[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            self.total -= entry[0]
            del self.live[ptr]

    def _pack(self, t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and not self._is_parameter(t)):
            return t
        loc = _local(t)
        while type(loc) is not torch.Tensor and isinstance(getattr(loc, "elem", None), torch.Tensor):
            loc = loc.elem
        st = loc.untyped_storage()
        ptr = st.data_ptr()
        if not st.nbytes() or ptr in self._param_storages():
            return t
        import weakref

        held = _Held(t)
        entry = self.live.setdefault(ptr, [st.nbytes(), 0])
        if entry[1] == 0:
            self.total += entry[0]
            self.peak = max(self.peak, self.total)
        entry[1] += 1
        weakref.finalize(held, self._dropped, ptr)
        return held

    @contextmanager
    def recording(self, models):  # type: ignore[override]
        self.models = list(models)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield self
        finally:
            self.models = []
