"""The dynamic loss scaler's state over steps, and the counters read from each rank's own flag.

Input: a plan's ``override loss_scale: growth_local over (AXES)``. Output: the scaler's update
(``update``: one step of Megatron-LM's ``DynamicGradScaler`` and DeepSpeed's ``DynamicLossScaler``
with hysteresis, of which torch's ``GradScaler`` is hysteresis 1), the scaler states a sequence of
found-inf flags leaves (``run``), and the pairs (group, axis) over which the flag the counters read
is partial (``pending``). No solver here; the obligation is ``check.encode_scalerstate``.

The scaler holds three values: the scale, the growth tracker (clean steps since the last overflow or
growth) and the hysteresis counter (overflows left before a back-off). On an overflow the tracker is
reset and the hysteresis counter decremented; at 0 the scale is halved. After ``interval`` clean steps
in a row the scale is doubled and the hysteresis counter refilled. Single-device training updates it
from the one flag of the whole model. ``growth_local over (AXES)`` states that each rank updates its
scaler from its own found-inf flag over AXES, while the step's skip reads the reduced flag (every
rank skips together): with a hysteresis of 2 or more, or after a run of clean steps, the scalers'
counters part on the step where only some ranks overflow, their scales on a later step (docs/semantics.md,
"Per-rank operations and partial values").
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from . import rankupdate as ru

SCALE = 65536  # the initial scale: 2**16 (PyTorch's, DeepSpeed's and Megatron-LM's default)
HYSTERESIS = 2  # Megatron-LM's --hysteresis and DeepSpeed's "hysteresis" default
INTERVAL = 1000  # Megatron-LM's --loss-scale-window and DeepSpeed's "loss_scale_window" default


@dataclass(frozen=True)
class Scaler:
    scale: int
    tracker: int  # clean steps since the last overflow or growth
    hysteresis: int  # overflows left before a back-off


def start(hysteresis: int = HYSTERESIS) -> Scaler:
    return Scaler(SCALE, 0, hysteresis)


def update(s: Scaler, overflow: bool, hysteresis: int = HYSTERESIS, interval: int = INTERVAL) -> Scaler:
    """One scaler update from a found-inf flag."""
    if overflow:
        left = s.hysteresis - 1
        return Scaler(s.scale // 2 if left <= 0 else s.scale, 0, left)
    if s.tracker + 1 == interval:
        return Scaler(s.scale * 2, 0, hysteresis)
    return Scaler(s.scale, s.tracker + 1, s.hysteresis)


def run(flags, hysteresis: int = HYSTERESIS, interval: int = INTERVAL) -> list[Scaler]:
    """The scaler after each step of a sequence of found-inf flags."""
    out, s = [], start(hysteresis)
    for f in flags:
        s = update(s, f, hysteresis, interval)
        out.append(s)
    return out


def pending(plan: ir.Plan, groups, o: ir.Override) -> list[tuple[str, str]]:
    """(group, axis): the group's gradient differs between the axis's ranks and the flag the scaler reads is
    not reduced over it (named here or by ``loss_scale: local``, or left out of the overflow reduction)."""
    local = ru.scale_override(plan)
    named = tuple(o.axes or ()) + (tuple(local.axes or ()) if local is not None else ())
    return ru.scale_pending(groups, ru.overflow_axes(plan, groups), named)
