"""Count every collective a rank issues, where it really happens (torch).

Input: the ops dispatched while a ``CollectiveCounter`` is active. Output: one
``CollectiveRecord`` per collective call: its kind (all_reduce, all_gather,
reduce_scatter, broadcast, all_to_all, send, recv), the ranks of its process group and
its buffer size in bytes (a send or receive: the two ranks, source first). The counter is a ``TorchDispatchMode``: both the c10d ops that
``torch.distributed`` and the C++ DDP reducer dispatch (``c10d.allreduce_`` ...) and the
functional collectives DTensor and FSDP use (``_c10d_functional.*``) pass through it, so
nothing is inferred from the model. Ops on DTensors are handed back (``NotImplemented``)
so that DTensor desugars them first; the collectives of implicit redistributions (a
partial gradient norm, a partial gradient of a replicated parameter) are then counted
too, as torch's own ``CommDebugMode`` does.

The counter knows every op of the ``c10d``, ``_c10d_functional`` and
``_c10d_functional_autograd`` namespaces it records, and the few that move no data
(``barrier``, ``monitored_barrier_``, ``check_for_nan``, ``wait_tensor``,
``_wrap_tensor_autograd``). Any other op of those namespaces is a collective it cannot
size: it still runs (so no rank waits for a peer that stopped), is listed in
``unknown``, and ``check`` then fails the step with ``UnknownCollective`` naming it, so a
new PyTorch collective is never passed through uncounted.

Buffer size is the full, unsharded buffer ``m`` of the cost model: the input of an
all-reduce, reduce-scatter, all-to-all or broadcast, the output of an all-gather and
the tensors of a send or receive. Point-to-point transfers (``send``/``recv``,
``isend``/``irecv`` and ``batch_isend_irecv``, all dispatched as ``c10d.send`` and
``c10d.recv_``) take their phase from ``tags`` when the caller has tagged the buffer
(a pipeline schedule interleaves forward and backward transfers inside one call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class CollectiveRecord:
    kind: str
    ranks: tuple[int, ...]
    bytes: int
    op: str  # the dispatched op, e.g. c10d._allgather_base_
    phase: str = ""  # the step phase the caller had set (forward, backward, clip, optimizer)


def _nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def group_ranks(group) -> tuple[int, ...]:
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group)
    elif isinstance(group, torch.ScriptObject):  # what the c10d ops receive
        group = dist.ProcessGroup.unbox(group)
    return tuple(dist.get_process_group_ranks(group))


def c10d_collective(name: str, args) -> tuple[str, int, object] | None:
    """(kind, bytes, group) of a c10d op's arguments, or None for non-collectives."""
    if name in ("allreduce_", "allreduce_coalesced_"):
        return "all_reduce", _nbytes(args[0]), args[1]
    if name == "broadcast_":
        return "broadcast", _nbytes(args[0]), args[1]
    if name in ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_", "allgather_coalesced_"):
        return "all_gather", _nbytes(args[0]), args[2]
    if name in ("_reduce_scatter_base_", "reduce_scatter_", "reduce_scatter_tensor_coalesced_"):
        return "reduce_scatter", _nbytes(args[1]), args[2]
    if name in ("alltoall_base_", "alltoall_"):
        return "all_to_all", _nbytes(args[1]), args[2]
    if name == "send":
        return "send", _nbytes(args[0]), args[1]
    if name == "recv_":
        return "recv", _nbytes(args[0]), args[1]
    if name == "recv_any_source_":  # no source rank: the group's ranks are recorded
        return "recv_any_source", _nbytes(args[0]), args[1]
    if name == "reduce_":
        return "reduce", _nbytes(args[0]), args[1]
    if name in ("gather_", "scatter_"):
        return name.rstrip("_"), _nbytes(args[0]), args[2]
    return None


# ops of the collective namespaces that move no data and are therefore not recorded
NOT_COLLECTIVES = frozenset({"c10d.barrier", "c10d.monitored_barrier_", "c10d.check_for_nan",
                             "_c10d_functional.wait_tensor", "_c10d_functional._wrap_tensor_autograd"})
NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")


SETUP = "setup"  # phase of one-time collectives, left out of the compared step (measure.compare.SETUP)


class one_time:
    """Context manager: collectives issued inside are one-time setup (phase ``setup``)."""

    def __enter__(self):
        self.counter = CollectiveCounter.active
        if self.counter is not None:
            self.saved, self.counter.phase = self.counter.phase, SETUP
        return self

    def __exit__(self, *exc):
        if self.counter is not None:
            self.counter.phase = self.saved
        return False


class UnknownCollective(RuntimeError):
    """A collective op the counter cannot size ran during a measured step."""


def _peer(group, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (as the c10d ops receive it)."""
    if isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    return dist.get_global_rank(group, group_rank)


def functional_collective(name: str, args, kwargs) -> tuple[str, int, object] | None:
    if name in ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_"):
        return "all_reduce", _nbytes(args[0]), args[2]
    if name in ("all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced"):
        return "all_gather", _nbytes(args[0]) * int(args[1]), args[2]
    if name in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        return "reduce_scatter", _nbytes(args[0]), args[3]
    if name == "all_to_all_single":
        return "all_to_all", _nbytes(args[0]), args[3]
    if name == "reduce_scatter_tensor_out":
        return "reduce_scatter", _nbytes(args[0]), args[3]
    if name in ("broadcast", "broadcast_"):
        return "broadcast", _nbytes(args[0]), args[2]
    return None


# the kinds the comparison knows (cost-model kinds and point-to-point transfers)
KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send", "recv"})


class CollectiveCounter(TorchDispatchMode):
    """A dispatch mode recording collectives; ``records`` lists them in issue order.

    ``CollectiveCounter.active`` is the counter now recording (None outside one), so that
    code deep in a wrapper can label its collectives (``one_time``)."""

    active: "CollectiveCounter | None" = None

    def __enter__(self):
        CollectiveCounter.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        CollectiveCounter.active = None
        return super().__exit__(*exc)

    def __init__(self) -> None:
        super().__init__()
        self.records: list[CollectiveRecord] = []
        self.phase = ""
        self.tags: dict[int, str] = {}  # data_ptr of a point-to-point buffer -> its phase
        self.unknown: list[str] = []  # collective ops this counter cannot size, in issue order

    def check(self) -> None:
        """Raise ``UnknownCollective`` if an op the counter does not know ran."""
        if self.unknown:
            ops = ", ".join(dict.fromkeys(self.unknown))
            raise UnknownCollective(
                f"the collective counter does not know {ops}: its kind and bytes cannot be measured, so the "
                "step is not compared (teach measure/ranks/counter.py this op)")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(issubclass(t, DTensor) for t in types):
            # Let DTensor run first: it desugars into local ops and the collectives of any
            # redistribution, which then come back through this mode and are counted.
            return NotImplemented
        packet = func.overloadpacket
        namespace = getattr(packet, "_qualified_op_name", str(packet)).split("::")[0]
        name = packet.__name__
        found = None
        if namespace == "c10d":
            found = c10d_collective(name, args)
        elif namespace in ("_c10d_functional", "_c10d_functional_autograd"):
            found = functional_collective(name, args, kwargs)
        qualified = f"{namespace}.{name}"
        if found is None and namespace in NAMESPACES and qualified not in NOT_COLLECTIVES:
            self.unknown.append(qualified)
        elif found is not None and found[0] not in KINDS:
            self.unknown.append(f"{qualified} ({found[0]})")
            found = None
        if found is not None:
            kind, nbytes, group = found
            phase = self.phase
            if kind in ("send", "recv"):
                me, peer = dist.get_rank(), _peer(group, int(args[2]))
                ranks = (me, peer) if kind == "send" else (peer, me)
                phase = self.tags.get(args[0][0].data_ptr(), phase)
            else:
                ranks = group_ranks(group)
            self.records.append(CollectiveRecord(kind, ranks, nbytes, f"{namespace}.{name}", phase))
        return func(*args, **kwargs)
