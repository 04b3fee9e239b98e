"""The machine a mesh runs on: its devices (``Hardware``) and the link classes its axes carry
traffic over (``LinkClass``), as ``resolve.hardware`` builds them from the mesh block and the
device catalogue (``placement_logic.hardware``). Re-exported by ``ir.nodes`` and ``ir``."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ..diagnostics import Span
from .values import Const, Value, _span


@dataclass(frozen=True)
class LinkClass:
    """A link class of the mesh: what an axis's ``@ NAME`` carries its traffic over."""

    name: str
    title: str
    bandwidth: Value  # bytes per second, per direction, per device
    latency: Value  # seconds per ring step (α)
    span: Span = _span()
    efficiency: Value = field(default_factory=lambda: Const(Fraction(1)))  # achieved bus bandwidth / bandwidth
    # NCCL's latency model (kernel model): seconds per collective call, and per ring step in place of latency
    call_latency: Value = field(default_factory=lambda: Const(Fraction(0)))
    step_latency: Value | None = None
    # NCCL's hardware class of a catalogue link ("nvlink", "pci", "net"; None: a link of one's own latency,
    # timed by α–β alone) and its bus bandwidth curve by message size (hardware.Link.bus_curve)
    nccl: str | None = None
    bus_curve: tuple = ()


@dataclass(frozen=True)
class Hardware:
    """The devices of the mesh (``device = h100_sxm`` in the mesh block, or numbers of one's
    own) and its link classes: what memory fits and what the step-time model divides by."""

    device: str  # the catalogue name, or the user's own name for a device given by numbers
    title: str
    memory: Value  # bytes per device
    flops: Value  # peak dense FLOP/s at ``precision``
    precision: str = "bf16"
    mfu: Value = field(default_factory=lambda: Const(Fraction(1, 2)))  # model-FLOPs utilisation assumed
    links: tuple[LinkClass, ...] = ()
    overlap: bool = True  # data-parallel traffic hides behind compute where it can
    span: Span = _span()
    hbm: Value | None = None  # HBM bandwidth, bytes per second (None: unknown, compute timed by the MFU)
    efficiency: object | None = None  # hardware.Efficiency: the kernel efficiency tables (None: unknown)
    mfu_stated: bool = False  # the mesh states its mfu: compute is timed by it unless a convention says kernels
    precision_stated: bool = False  # the mesh states its precision (else 16-bit, fp32 for 4-byte activations)

    def link(self, name: str | None) -> LinkClass | None:
        return next((k for k in self.links if k.name == name), None)
