"""What a search's figure draws (``costreport.frontier``): the ranked rows fastest first, then
the frontier's rows beyond them, each as (label, memory bytes, step seconds, on the frontier);
every evaluated candidate's memory and step time; the memory budget (the device's memory less
the reserve), the line a row must stay left of to fit."""

from __future__ import annotations

from .. import hardware as hw
from .space import Result


def plot_inputs(result: Result) -> tuple[list, tuple | None, float | None]:
    rows = list(result.ranked)
    seen = {(c.label(), c.memory, c.step) for c in rows}
    rows += [c for c in result.frontier if (c.label(), c.memory, c.step) not in seen]
    points = [(c.label(), c.memory, c.step, c.frontier) for c in rows]
    candidates = None
    if result.parts:
        import numpy as np

        values = np.concatenate([v for _, _, v in result.parts])
        candidates = (values[:, 0], values[:, 1])
    device = hw.device(result.space.device)
    budget = float(device.memory - result.space.reserve) if device is not None else None
    return points, candidates, budget
