"""Per-rank operations and ownership: a group's part of the grad norm counted on one rank of an
axis only.

Input: the plan's overrides and the step's ``GroupModel`` records (after ``clipagg``: every record
has its norm reduction and duplicate filter). Output: the records with ``clip_rank0`` set, the
axes over which the group's squared norm is counted on rank 0 only, and the located errors of a
statement the step cannot read. No solver here.

``override clip_norm[g]: rank0_only over (AXES)`` states what Megatron-LM does with a parameter
that is not marked tensor-model-parallel (``param_is_not_tensor_parallel_duplicate`` false on
every tensor rank but the first), and what a norm computed under ``if rank == 0`` does: g's
squared norm enters the norm's reduction over each axis of AXES from rank 0 of that axis only.
For a group replicated on the axis that is the duplicate filter, and right; for a group whose
gradient is sharded on it (attention sinks sized by the local heads, expert weights split by an
expert tensor size) the other ranks' pieces are dropped: every rank clips with a norm that misses
them (refuted as ``SC clip_norm``, with the concrete pieces).

Each axis of AXES must be one g's norm is summed over (else PL170: nothing there is counted by
more than its own rank); over an axis where the derived or stated filter counts g's copies once
already, or named twice, it changes nothing (PL506).
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget
from . import rankcount

VERB = "rank0_only"


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def stated(overrides: tuple[ir.Override, ...], group: str) -> ir.Override | None:
    """The rank-0 statement of ``group``: its own, else the plan's (``all``, then no group)."""
    for who in (group, "all", None):
        found = [o for o in overrides if o.target == OverrideTarget.CLIP_NORM and o.verb == VERB and o.group == who]
        if found:
            return found[-1]
    return None


def apply(groups: list, overrides: tuple[ir.Override, ...]) -> list:
    """Each group's rank-0 axes, with PL170 and PL506 where the statement cannot be read."""
    out = [_one(g, stated(overrides, g.group)) for g in groups]
    out = rankcount.apply(out, overrides)  # a count on any set of one axis's ranks
    for o in overrides:
        if o.target != OverrideTarget.CLIP_NORM or o.verb != VERB:
            continue
        head = f"override clip_norm{f'[{o.group}]' if o.group else ''}: {VERB} over ({', '.join(o.axes or ())})"
        if not o.axes:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: it names no axis", o)
        twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
        if twice is not None:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing the second time it names {twice}: one rank counts the "
                       "group however often it is stated", o)
        hit = [g for g in groups if o.group in (None, "all", g.group)]
        for a in o.axes:
            summed = [g for g in hit if a in (g.clip_axes or ())]
            if hit and not summed:
                who = o.group if o.group not in (None, "all") else "any group"
                raise _err(Code.RANK0_UNREDUCED_AXIS, f"{head}: the squared norm of {who} is not summed over {a}, so each rank of "
                           f"{a} counts only its own value there; a rank-0-only count applies to an axis the norm "
                           "is all-reduced over", o)
            if summed and all(a not in g.shard_axes and a in g.clip_filter for g in summed):
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{head} changes nothing: the copies of "
                           f"{', '.join(g.group for g in summed)} on {a} are counted on one rank already (the "
                           "duplicate filter)", o)
    return out


def _one(g, o: ir.Override | None):
    if o is None:
        return g
    axes = tuple(a for a in dict.fromkeys(o.axes or ()) if a in (g.clip_axes or ()))
    return replace(g, clip_rank0=axes, clip_rank0_span=o.span) if axes else g


def dropped(g, sizes_ge2) -> list[str]:
    """The axes where g's pieces are dropped from the norm: counted on rank 0 only where the
    gradient is sharded, with two or more ranks."""
    return [a for a in g.clip_rank0 if a in g.shard_axes and sizes_ge2(a)]
