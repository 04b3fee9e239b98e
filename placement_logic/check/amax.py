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
    """Per group key (None: every group, spelt ``amax`` or ``amax[all]``: one key, one obligation) the last
    statement, ``local`` or ``reduce``: the key of an obligation ``SC amax[g]`` (its span that statement's);
    what the group's amax is reduced over is ``reduced``."""
    last: dict = {}
    for o in plan.overrides:
        if o.target == OverrideTarget.AMAX and o.verb in (OverrideVerb.LOCAL, OverrideVerb.REDUCE):
            last[None if o.group in (None, "all") else o.group] = o
    return list(last.values())


def same_key(plan: ir.Plan, o: ir.Override) -> list[ir.Override]:
    """Every ``local`` or ``reduce`` statement of o's key (for every group: those spelt ``amax`` and
    ``amax[all]`` alike), in the file's order: the statements its one obligation judges together."""
    key = None if o.group in (None, "all") else o.group
    return [x for x in plan.overrides if x.target == OverrideTarget.AMAX
            and x.verb in (OverrideVerb.LOCAL, OverrideVerb.REDUCE)
            and (None if x.group in (None, "all") else x.group) == key]


def _applies(o: ir.Override, group: str) -> bool:
    return o.group in (None, "all", group)


def statements(plan: ir.Plan, group: str) -> list[ir.Override]:
    """The ``local`` and ``reduce`` statements in force for ``group``, in the file's order: every ``local`` that
    applies to it (its own and those for every group) and its own ``reduce`` statements, or where it has none
    those for every group (the group's own reduction is the more specific)."""
    every = [o for o in plan.overrides if o.target == OverrideTarget.AMAX
             and o.verb in (OverrideVerb.LOCAL, OverrideVerb.REDUCE) and _applies(o, group)]
    own = any(o.verb == OverrideVerb.REDUCE and o.group == group for o in every)
    return [o for o in every if o.verb == OverrideVerb.LOCAL or not own or o.group == group]


def reduced(plan: ir.Plan, group: str) -> tuple[str, ...]:
    """The axes g's amax is all-reduced over, whatever the order of its statements: those its ``reduce``
    statements in force name (the fp8_group; every axis where none is stated), less those its ``local``
    statements name. A ``local`` and a ``reduce`` naming one axis contradict each other (PL271,
    ``check_override``)."""
    stmts = statements(plan, group)
    red = [o for o in stmts if o.verb == OverrideVerb.REDUCE]
    local = {a for o in stmts if o.verb == OverrideVerb.LOCAL for a in (o.axes or ())}
    over = ([a for o in red for a in (o.axes or ())] if red else list(plan.mesh.names))
    return tuple(a for a in dict.fromkeys(over) if a not in local)


def cause(plan: ir.Plan, group: str, axis: str) -> ir.Override | None:
    """The statement that leaves ``axis`` out of g's reduction: the ``local`` naming it, else the last ``reduce``."""
    stmts = statements(plan, group)
    return (next((o for o in stmts if o.verb == OverrideVerb.LOCAL and axis in (o.axes or ())), None)
            or next((o for o in reversed(stmts) if o.verb == OverrideVerb.REDUCE), None))


def _groups(o: ir.Override, groups) -> list:
    return [g for g in groups if o.group in (None, "all", g.group)]


def _keyed(plan: ir.Plan, o: ir.Override, groups) -> list:
    """The groups the obligation of o's key judges: g for ``amax[g]``; for the statements of every group, the
    groups no statement of their own names."""
    if o.group not in (None, "all"):
        return [g for g in groups if g.group == o.group]
    own = {x.group for x in plan.overrides if x.target == OverrideTarget.AMAX
           and x.verb in (OverrideVerb.LOCAL, OverrideVerb.REDUCE)}
    return [g for g in groups if g.group not in own]


def differs(plan: ir.Plan, g, axis: str, sequence_parallel: bool) -> bool:
    """Whether g's fp8 tensors differ between the ranks of ``axis``."""
    role = plan.role(axis)
    if role in TOKEN_ROLES:
        return True
    if role is ir.Role.TENSOR:
        return axis in g.shard_axes or sequence_parallel
    return False


def differ_axes(plan: ir.Plan, o: ir.Override, groups, sequence_parallel: bool) -> list[tuple[str, str]]:
    """(group, axis): for each group o's key judges, the axes its amax is not reduced over (``reduced``: those
    ``local`` names, those ``reduce`` leaves out) over which the group's fp8 tensors differ."""
    return [(g.group, a) for g in _keyed(plan, o, groups) for a in plan.mesh.names
            if a not in reduced(plan, g.group) and differs(plan, g, a, sequence_parallel)]


def check_override(plan: ir.Plan, groups, sequence_parallel: bool) -> None:
    """PL506 where a statement changes nothing; PL271 where a ``local`` and a ``reduce`` that apply to one group
    name one axis."""
    every = [o for o in plan.overrides if o.target == OverrideTarget.AMAX
             and o.verb in (OverrideVerb.LOCAL, OverrideVerb.REDUCE)]
    for o in every:
        said = head(o)
        if not o.axes and o.verb == OverrideVerb.LOCAL:
            raise _err(f"{said} changes nothing: it names no axis", o)
        twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
        if twice is not None:
            raise _err(f"{said} changes nothing the second time it names {twice}", o)
        for a in o.axes:
            if plan.role(a) is ir.Role.PIPELINE:
                raise _err(f"{said} changes nothing over {a}: each pipeline stage holds its own layers and their "
                           "amax, so there is nothing to reduce over it", o)
            if o.verb == OverrideVerb.LOCAL and not any(differs(plan, g, a, sequence_parallel) for g in _groups(o, groups)):
                raise _err(f"{said} changes nothing over {a}: the group's weights are whole and its activations "
                           f"replicated on every rank of {a}, so each rank's own amax is the reduced one", o)


    _contradictions(plan, groups)


def _contradictions(plan: ir.Plan, groups) -> None:
    """PL271: an axis that one statement for g leaves out of the amax reduction (``local``) and another reduces it
    over (``reduce``): the statements hold together, in any order, so the two say opposite things. Located at the
    later of the two."""
    for g in groups:
        stmts = statements(plan, g.group)
        for i, o in enumerate(stmts):
            for p in stmts[:i]:
                if {o.verb, p.verb} != {OverrideVerb.LOCAL, OverrideVerb.REDUCE}:
                    continue
                both = [a for a in (o.axes or ()) if a in (p.axes or ())]
                if both:
                    local, red = (o, p) if o.verb == OverrideVerb.LOCAL else (p, o)
                    raise DiagnosticError([Diagnostic(
                        Code.AMAX_LOCAL_AND_REDUCED,
                        f"{head(o)}: the {g.group} amax over {both[0]} is both left out of the reduction "
                        f"({head(local)}, line {local.span.line}) and reduced over it ({head(red)}, line "
                        f"{red.span.line}); the statements for a group hold together in any order: name each axis "
                        "in one of them", o.span)])


def head(o: ir.Override) -> str:
    return f"override amax{f'[{o.group}]' if o.group else ''}: {o.verb} over ({', '.join(o.axes or ())})"


def _err(msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, msg, o.span)])
