"""The fp8 amax of a group's layers read from each rank's own maximum: ``override amax[g]: local over (AXES)``.

Input: a plan and the step's ``GroupModel`` records. Output: the located errors of a statement the step cannot
read (``check_override``: PL506), the axes over which a group's fp8 tensors differ between ranks
(``differ_axes``) and the statements (``stated``). No solver here; the obligation is ``check.encode_amax``.

Delayed fp8 scaling (TransformerEngine's ``DelayedScaling``) casts each GEMM operand of a layer (its input
activation, its weight, the gradient of its output) to fp8 with the scale fp8_max / amax, amax the largest
magnitude the tensor reached (over an amax history). Single-device training takes the maximum over the whole
tensor, so the derived step all-reduces the amax (a max) over every axis whose ranks hold different pieces of
it: the data, context, sequence and expert axes (different tokens), and a tensor axis where the group's
weights are split or the activations are sequence-parallel (TransformerEngine's ``reduce_amax`` over the
``fp8_group``, its amax reduction over the tensor group under sequence parallelism). ``amax[g]: local over
(AXES)`` states that g's amax is not reduced over AXES: two ranks of such an axis cast with different scales
(``SC amax[g]``); ``amax[g]: reduce over (AXES)`` states the reduction's axes (TransformerEngine's
``fp8_group``), leaving out the others. A piece quantised with one rank's scale is read with another's where fp8 pieces are
gathered (sequence parallelism's all-gather in fp8), and the replicas of a weight over a data axis are cast
unlike one another. A pipeline axis (each stage holds its own layers and their amax), or a tensor axis over
which g's tensors are whole on every rank, changes nothing (PL506).
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb

FP8_MAX = 448  # the largest E4M3 value: the forward casts' format in TransformerEngine's HYBRID recipe
TOKEN_ROLES = (ir.Role.DATA, ir.Role.CONTEXT, ir.Role.SEQUENCE, ir.Role.EXPERT)


def stated(plan: ir.Plan) -> list[ir.Override]:
    """Per group (or None: every group) the last statement, ``local`` or ``reduce``."""
    last: dict = {}
    for o in plan.overrides:
        if o.target == OverrideTarget.AMAX and o.verb in (OverrideVerb.LOCAL, OverrideVerb.REDUCE):
            last[o.group] = o
    return list(last.values())


def _groups(o: ir.Override, groups) -> list:
    return [g for g in groups if o.group in (None, "all", g.group)]


def differs(plan: ir.Plan, g, axis: str, sequence_parallel: bool) -> bool:
    """Whether g's fp8 tensors differ between the ranks of ``axis``."""
    role = plan.role(axis)
    if role in TOKEN_ROLES:
        return True
    if role is ir.Role.TENSOR:
        return axis in g.shard_axes or sequence_parallel
    return False


def differ_axes(plan: ir.Plan, o: ir.Override, groups, sequence_parallel: bool) -> list[tuple[str, str]]:
    """(group, axis): the axes the amax is not reduced over (those ``local`` names, those ``reduce`` leaves out)
    over which the group's fp8 tensors differ."""
    left = (tuple(o.axes or ()) if o.verb == OverrideVerb.LOCAL else
            tuple(a for a in plan.mesh.names if a not in (o.axes or ())))
    return [(g.group, a) for g in _groups(o, groups) for a in dict.fromkeys(left)
            if differs(plan, g, a, sequence_parallel)]


def check_override(plan: ir.Plan, groups, sequence_parallel: bool) -> None:
    """PL506 where a statement changes nothing."""
    for o in stated(plan):
        head = f"override amax{f'[{o.group}]' if o.group else ''}: {o.verb} over ({', '.join(o.axes or ())})"
        if not o.axes and o.verb == OverrideVerb.LOCAL:
            raise _err(f"{head} changes nothing: it names no axis", o)
        twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
        if twice is not None:
            raise _err(f"{head} changes nothing the second time it names {twice}", o)
        for a in o.axes:
            if plan.role(a) is ir.Role.PIPELINE:
                raise _err(f"{head} changes nothing over {a}: each pipeline stage holds its own layers and their "
                           "amax, so there is nothing to reduce over it", o)
            if o.verb == OverrideVerb.LOCAL and not any(differs(plan, g, a, sequence_parallel) for g in _groups(o, groups)):
                raise _err(f"{head} changes nothing over {a}: the group's weights are whole and its activations "
                           f"replicated on every rank of {a}, so each rank's own amax is the reduced one", o)


def _err(msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, msg, o.span)])
