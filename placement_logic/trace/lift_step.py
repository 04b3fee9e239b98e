"""The typed input of the lift's passes (``trace.lift``): the step read once (``Step``), what each axis
is (``Axes``) and the strategies bound (``Strategies``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .lift_layout import Unliftable, _Layout
from .lift_pipeline import Pipeline


@dataclass
class Step:
    """The typed input of every pass: the trace, the step analysed (the last that reached the optimizer on rank
    0) on every rank, and what the passes found that cannot be lifted (``items``) or is assumed (``notes``)."""
    trace: dict
    script: str
    ranks: dict[int, dict]
    layout: _Layout
    from_mesh: bool
    by_seq: dict[int, dict[int, dict]]
    steps: list[dict]  # rank 0's steps that reached the optimizer
    step_no: int
    step: dict[int, dict]  # rank -> its record of the step
    initial: dict[int, dict[str, dict]]  # rank -> parameter name -> its view before the first update
    micro: dict[int, dict[int, int]]  # rank -> call number -> accumulated micro-step
    observer: int = 0
    items: list[Unliftable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the activation overrides lifted (``lift_activations``): the gradients that differ between the tensor ranks
    # because of them are read as whole on the axis, not partial
    activation_lines: list[tuple[str, list]] = field(default_factory=list)
    aux_readings: list = field(default_factory=list)  # the balancing loss's readings (``lift_auxloss``)
    window: int = 0  # optimizer steps that are one accumulation stepped every micro-step (``lift_timing``)

    def axes(self, c: dict, r: int | None = None) -> tuple[str, ...]:
        return self.layout.axes_of(c["ranks"], self.observer if r is None else r) or ()

    @property
    def colls(self) -> list[dict]:
        """The observer's collectives of the step."""
        return [c for c in self.ranks[self.observer]["collectives"] if c["step"] == self.step_no]


@dataclass
class Strategies:
    """The strategy bound to each axis, the script frames behind each binding, the axes whose updated optimizer
    shards are never sent back, and whether the tensor axis is sequence parallel."""
    bindings: dict[str, str]
    frames: dict[str, list[dict]]
    no_regather: list[tuple[str, list[dict]]]
    sp: bool


class LiftRole(StrEnum):
    """What the lift reads a mesh axis as (``axes_pass``; the comment beside each axis of the lifted mesh)."""

    DATA = "data"
    TENSOR = "tensor"
    PIPELINE = "pipeline"
    CONTEXT = "context"


# the name an axis read as each role is given when the trace has no mesh of its own
AXIS_NAMES = {LiftRole.DATA: "dp", LiftRole.TENSOR: "tp", LiftRole.PIPELINE: "pp", LiftRole.CONTEXT: "cp"}


@dataclass
class Axes:
    """What each mesh axis is (``roles``), the pipeline or context axis, and the ranks read for each stage."""
    pipe: Pipeline | None
    pipe_why: str | None
    context: list[str]
    stage_ranks: list[int]  # the rank of each stage with the observer's other coordinates
    roles: dict[str, LiftRole] = field(default_factory=dict)
    data_axes: list[str] = field(default_factory=list)  # data and context axes
    tp: str | None = None
    pp: str | None = None
    cp: str | None = None
    gathered: tuple[str, ...] = ()  # the context axes the loss is computed on the gathered sequence over
    gathered_frames: list[dict] = field(default_factory=list)

    @property
    def loss_rank(self) -> int:
        return self.stage_ranks[-1]
