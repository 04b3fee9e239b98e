"""The simulator's section for the dynamic loss scaler over several steps (docs/semantics.md,
"Per-rank operations and partial values"), written from the semantics without the checker's code.

Every device keeps a scaler (scale, growth tracker, hysteresis counter) and updates it once a step
from the found-inf flag it reads: its own shards' flags, OR-ed over the axes the overflow flag is
all-reduced over minus the axes ``loss_scale: growth_local`` (and ``loss_scale: local``) name.
Single-device training updates one scaler from the OR of every shard's flag. ``violations``:
``("loss_scale_state",)`` where after some step some device's scale differs from single-device
training's, over random sequences of per-shard overflow flags.
"""

from __future__ import annotations

import random
from itertools import product

from simulator import _overrides, grad_shard_axes, groups_of

from placement_logic import ir


def step_scaler(scale: int, tracker: int, hyst: int, overflow: bool, hysteresis: int, interval: int):
    """Megatron-LM's DynamicGradScaler.update, written out from its description."""
    if overflow:
        hyst -= 1
        return (scale // 2 if hyst <= 0 else scale), 0, hyst
    tracker += 1
    if tracker == interval:
        return scale * 2, 0, hysteresis
    return scale, tracker, hyst


def violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, steps: int = 4,
               hysteresis: int = 2, interval: int = 2, rate: float = 0.35) -> set:
    named = [a for o in _overrides(plan, "loss_scale", "growth_local") + _overrides(plan, "loss_scale", "local")
             for a in (o.axes or ())]
    if not _overrides(plan, "loss_scale", "growth_local"):
        return set()
    axes = list(plan.mesh.names)
    devices = list(product(*[range(sizes[a]) for a in axes]))
    groups = groups_of(plan)
    shard = {g: grad_shard_axes(plan, g) for g in groups}
    ovf = _overrides(plan, "overflow", "reduce")
    reduced = list(ovf[-1].axes or ()) if ovf else [a for a in axes if any(a in shard[g] for g in groups)]
    read = {a for a in reduced if a not in named}
    state = {d: (2 ** 16, 0, hysteresis) for d in devices}
    single = (2 ** 16, 0, hysteresis)
    for _ in range(steps):
        flags = {(g, s): rng.random() < rate for g in groups for s in product(*[range(sizes[a]) for a in shard[g]])}
        own = {d: any(flags[(g, tuple(d[axes.index(a)] for a in shard[g]))] for g in groups) for d in devices}
        # the flag a device reads: OR over the devices that agree with it on every axis not in ``read``
        seen = {d: any(own[e] for e in devices if all(e[i] == d[i] for i, a in enumerate(axes) if a not in read))
                for d in devices}
        state = {d: step_scaler(*state[d], seen[d], hysteresis, interval) for d in devices}
        single = step_scaler(*single, any(flags.values()), hysteresis, interval)
        if any(s[0] != single[0] for s in state.values()):
            return {("loss_scale_state",)}
    return set()
