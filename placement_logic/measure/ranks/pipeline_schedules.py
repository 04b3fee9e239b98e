"""Pieces of a pipeline measurement rank's schedule (torch): several ZeRO buffers stepped as one
optimizer, and ZeroPP's schedule (breadth-first, each chunk gathered once per scheduling unit).
Used by ``pipeline.run_pipeline_job``.
"""

from __future__ import annotations


def _then(f, g):
    """``f``, then ``g()``; ``f``'s result."""

    def run(*args, **kwargs):
        out = f(*args, **kwargs)
        g()
        return out

    return run


class ZeroParts:
    """Several ``FlatZero`` buffers over the same group, stepped as one optimizer."""

    def __init__(self, parts) -> None:
        self.parts = parts
        self.param_groups = [g for z in parts for g in z.param_groups]
        self.stage = parts[0].stage

    @property
    def state(self) -> dict:
        out = {}
        for z in self.parts:
            out.update(z.state)
        return out

    def reduce_gradients(self) -> None:
        for z in self.parts:
            z.reduce_gradients()

    def held_gradients(self) -> list:
        return [g for z in self.parts for g in z.held_gradients()]

    def step(self) -> None:
        for z in self.parts:
            z.step()

    def zero_grad(self) -> None:
        for z in self.parts:
            z.zero_grad()


def unit_lowering(actions: list, unit: int) -> list:
    """A compute-only schedule with the gathers of ZeroPP: each chunk (an FSDP unit) unsharded
    before the first forward of a scheduling unit of ``unit`` microbatches and resharded after
    its last, the same for the backward; the gradient reduction after the chunk's last backward,
    before it is resharded."""
    from torch.distributed.pipelining.schedules import _Action
    from torch.distributed.pipelining.schedules import _ComputationType as C

    out, active, done = [], set(), {}
    total = {}
    for a in actions:
        if a is not None and a.computation_type in (C.FORWARD, C.FULL_BACKWARD):
            key = (a.stage_index, a.computation_type)
            total[key] = total.get(key, 0) + 1
    for a in actions:
        if a is None:
            continue
        key = (a.stage_index, a.computation_type)
        if a.stage_index not in active:
            out.append(_Action(a.stage_index, C.UNSHARD, None))
            active.add(a.stage_index)
        out.append(a)
        done[key] = done.get(key, 0) + 1
        if done[key] % unit == 0 or done[key] == total[key]:
            if a.computation_type == C.FULL_BACKWARD and done[key] == total[key]:
                out.append(_Action(a.stage_index, C.REDUCE_GRAD, None))
            out.append(_Action(a.stage_index, C.RESHARD, None))
            active.discard(a.stage_index)
    return out


def zeropp_schedule(stages, m: int, loss_fn, unit: int):
    """ZeroPP's schedule with one scheduling unit per step: breadth-first (torch's
    ScheduleLoopedBFS: every chunk runs its unit's microbatches in a row, forward then, in
    reverse chunk order, backward), each chunk gathered once for the unit's forwards and once
    for its backwards (``unit_lowering``) in place of the runtime's prefetch-window policy."""
    from torch.distributed.pipelining import schedules

    class ZeroPPSchedule(schedules.ScheduleLoopedBFS):
        def _prepare_schedule_with_comms(self, actions, format="compute_only"):
            schedules.PipelineScheduleMulti._validate_and_set_stage_mapping(self, actions)
            lowered = {rank: unit_lowering(ops, unit) for rank, ops in actions.items()}
            self.pipeline_order_with_comms = schedules._add_send_recv(
                lowered, stage_to_rank=lambda s: self.stage_index_to_group_rank[s], num_stages=self._num_stages)

    return ZeroPPSchedule(stages, n_microbatches=m, loss_fn=loss_fn)
