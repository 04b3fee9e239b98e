"""A group's norm counted on rank 0 of an axis it is not summed over: ``SC clip_norm`` unknown.

``override clip_norm: rank0_only over (AXES)`` (or ``clip_norm[all]``) counts every group's squared norm on rank
0 of each axis only (``check.perrank``). Where some group's norm is summed over the axis that is read; where a
group's norm is not (an HSDP group replicated over the replicate axis, its norm summed over the shard axis only),
every other rank of the axis counts nothing of it and no reduction brings rank 0's value there, so those ranks
clip with a norm that misses the group. The step model keeps a group's rank-0 axes among its norm's reduction axes
only (``perrank._one``) and reads nothing of the others: so ``SC clip_norm`` is unknown, naming the group and the
axis, rather than proved (the independent simulator finds those ranks' norms wrong; tests/test_check_hunt_steps.py).

Input: the obligations, the step model and the plan. Output: the obligations, ``SC clip_norm`` marked unknown where
a statement names such an axis."""

from __future__ import annotations

from ..ir.overrides import OverrideTarget, OverrideVerb
from .perrank import stated


def unread(step, plan) -> list[tuple[str, str]]:
    """(group, axis) where the group's rank-0 statement names an axis its norm is not summed over."""
    out = []
    for g in step.groups:
        o = stated(plan.overrides, g.group)
        summed = g.clip_axes if g.clip_axes is not None else step.clip_axes
        out += [(g.group, a) for a in dict.fromkeys(o.axes or ()) if a not in (summed or ())] if o is not None else []
    return out


def extend(obs: list, step, plan) -> list:
    if plan is None or not any(o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.RANK0_ONLY
                               for o in plan.overrides):
        return obs
    found = unread(step, plan)
    if not found:
        return obs
    what = "; ".join(f"{g} over {a}" for g, a in found)
    for ob in obs:
        if ob.name == "SC clip_norm" and not ob.unknown:
            ob.unknown = (f"clip_norm: rank0_only counts a group's squared norm on rank 0 of an axis its norm is not "
                          f"summed over ({what}): every other rank of it counts nothing of that group and no reduction "
                          "brings rank 0's value there; the step model does not read that")
    return obs
