"""Per-rank ownership of the grad norm: a group's squared norm counted on a set of one axis's ranks
only.

Input: the plan's overrides and the step's ``GroupModel`` records (after ``clipagg``, ``kvnorm`` and
``perrank``: every record has its norm reduction, duplicate filter and rank-0 axes). Output: the
records with ``clip_ranks`` set, and the located errors of a statement the step cannot read. No solver
here (the z3 terms and the PL259 query: check.encode_rankcount).

``override clip_norm[g]: count_on_ranks over (AXIS) ranks (R1, R2, ...)`` -- g's squared norm enters
the norm's all-reduce over AXIS from the ranks R1, R2, ... of AXIS only (a norm filter that keeps g on
some ranks: ``if rank in (...)``, a parameter flag true on some ranks, an attention sink or an expert
weight excluded from the norm on the others). ``rank0_only over (AXIS)`` is its special case ``ranks
(0)``. Each Ri is a count (a number, or an expression of the sizes: ``tp - 1`` is the last tensor
rank); a value that is not a whole number in [0, n) names no rank at a size n. At a size where c of
the axis's n ranks are named: a group replicated over AXIS is counted c times (right where c = 1:
the duplicate filter on another rank); a group sharded over AXIS has the pieces of the n - c other
ranks dropped (right where c = n). Refuted as ``SC clip_norm``, with the concrete pieces.

Over several axes at once, ``count_on_ranks over (A, B, ...) ranks (...)`` names ranks of the process group
over them (check.encode_rankcount_multi: each piece of g over those axes counted once).

Errors: PL192 (no axis), PL191 (a rank out of range at the file's size), PL259 (a rank of the
axis at no size), PL506 (a rank named twice, or ``ranks (0)`` where every group it reaches is replicated and
filtered there already: the derived duplicate filter), PL170 (an axis the group's norm is not summed over), PL260 (rank0_only
and count_on_ranks over one axis for one group), PL129 (with an average, a max or roots before the
reduction, or an axis the group's kv heads are copied over: not modelled).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideVerb
from . import rankset
from .rankset import count_statements as statements
from .rankset import counts_stated as stated
from .values import fold

VERB = OverrideVerb.COUNT_ON_RANKS


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def apply(groups: list, overrides) -> list:
    """Each group's (axis, ranks), with PL192, PL170, PL260 and PL129 where the statement cannot be read."""
    from . import encode_rankcount_multi as rankcount_multi  # a count on a rank set over several axes at once

    for o in statements(overrides):
        if not o.axes:
            raise _err(Code.RANK_SET_AXES, f"{rankset.head(o)}: a rank set names ranks of the process group over the "
                       "axes it names; it names none here", o)
        if len(o.axes) >= 2:
            hit = [g for g in groups if o.group in (None, "all", g.group) and stated(overrides, g.group) is o]
            rankcount_multi.check_statement(o, hit, _copy_axes)
            continue
        axis = o.axes[0]
        hit = [g for g in groups if o.group in (None, "all", g.group) and stated(overrides, g.group) is o]
        summed = [g for g in hit if axis in (g.clip_axes or ())]
        if hit and not summed:
            who = o.group if o.group not in (None, "all") else "any group"
            raise _err(Code.RANK0_UNREDUCED_AXIS, f"{rankset.head(o)}: the squared norm of {who} is not summed over "
                       f"{axis}, so each rank of {axis} counts only its own value there; a count on some ranks applies "
                       "to an axis the norm is all-reduced over", o)
        for g in summed:
            if axis in g.clip_rank0:
                raise _err(Code.NORM_RANK_SETS_TWICE, f"{rankset.head(o)}: the {g.group} norm is counted on rank 0 of "
                           f"{axis} only by another statement (override clip_norm: rank0_only at line "
                           f"{g.clip_rank0_span.line}); state one rank set per axis (rank0_only is ranks (0))", o)
            if g.clip_agg != "sum" or g.clip_sqrt or axis in g.clip_copies or axis in _copy_axes(g):
                raise _err(Code.NOT_MODELLED, f"{rankset.head(o)}: a count on some ranks of the {g.group} norm is "
                           "modelled for a plain sum of squared norms over an axis that splits or replicates the "
                           "group (not with an average, a max, roots taken before the reduction or copied kv heads)",
                           o)
        if summed and _rank0(o) and all(axis not in g.shard_axes and axis in g.clip_filter for g in summed):
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{rankset.head(o)} changes nothing: the copies of "
                       f"{', '.join(g.group for g in summed)} on {axis} are counted on rank 0 already (the duplicate "
                       "filter)", o)
    return [_one(g, stated(overrides, g.group)) for g in groups]


def _rank0(o: ir.Override) -> bool:
    return all(isinstance(r, ir.Const) and r.value == 0 for r in o.ranks or ())


def _copy_axes(g) -> set[str]:
    return {d.axis for d in g.dims if d.part}


def _one(g, o: ir.Override | None):
    if o is not None and len(o.axes or ()) >= 2:
        from . import encode_rankcount_multi as rankcount_multi

        return rankcount_multi.apply_one(g, o)
    if o is None or not o.axes or o.axes[0] not in (g.clip_axes or ()):
        return g
    return replace(g, clip_ranks=((o.axes[0], tuple(o.ranks or ())),), clip_ranks_span=o.span)


def check_override(plan: ir.Plan) -> None:
    """PL191 and PL506 (a rank out of range at the file's size, named twice: check.rankset), PL259 (a
    rank of the axis at no size)."""
    from . import encode_rankcount  # z3: the query whether a rank is in range at some size

    for o in statements(plan.overrides):
        if not o.axes:
            raise _err(Code.RANK_SET_AXES, f"{rankset.head(o)}: a rank set names ranks of the process group over the "
                       "axes it names; it names none here", o)
        rankset.check_one(o, rankset.file_sizes(plan))
        for r in o.ranks or ():
            if encode_rankcount.never_in_range(plan, o.axes, r):
                who = o.axes[0] if len(o.axes) == 1 else f"the process group over ({', '.join(o.axes)})"
                size = f"at no size {o.axes[0]} can take" if len(o.axes) == 1 else "at no sizes its axes can take"
                raise _err(Code.RANK_NEVER_IN_RANGE, f"{rankset.head(o)}: rank {ir.show(r)} is a rank of {who} "
                           f"{size} (its ranks are 0 .. {' * '.join(o.axes)} - 1, a whole number): it names no rank", o)


def named(axis_ranks, n: int, leaf) -> list[int]:
    """The ranks of the axis (size n) a (axis, ranks) pair names; ``leaf`` resolves the sizes."""
    out = set()
    for r in axis_ranks[1]:
        v = Fraction(fold(r, leaf))
        if v.denominator == 1 and 0 <= v < n:
            out.add(int(v))
    return sorted(out)


def slots(g, sizes: dict[str, int], leaf) -> dict[str, tuple[int, int]]:
    """Per rank-set axis the group is sharded over, where the replay puts the observer's piece and the
    other pieces: on a named rank and on one that is not, where the set is some of the ranks but not all."""
    out = {}
    for ar in g.clip_ranks:
        a, n = ar[0], sizes[ar[0]]
        on = named(ar, n, leaf)
        off = [k for k in range(n) if k not in on]
        if a in g.shard_axes and on and off:
            out[a] = (on[0], off[0])
    return out


def counted(g, dev, pos, sizes, leaf) -> bool:
    """Whether device ``dev`` contributes g's squared norm: its coordinate on each rank-set axis named."""
    return all(dev[pos[ar[0]]] in named(ar, sizes[ar[0]], leaf) for ar in g.clip_ranks)


def diagnosis(g, sizes: dict[str, int], leaf) -> list[str]:
    """The root cause at these sizes, one line per rank-set axis where the count is wrong."""
    out = []
    for ar in g.clip_ranks:
        a, n = ar[0], sizes[ar[0]]
        on = named(ar, n, leaf)
        where = f"on ranks ({', '.join(ir.show(r) for r in ar[1])}) of {a} only (override at line {g.clip_ranks_span.line})"
        if a in g.shard_axes and len(on) < n:
            lost = [k for k in range(n) if k not in on]
            out.append(f"{g.group} is counted in the norm {where}, but its gradient is sharded over {a}: at {a} = {n}, "
                       f"the squared norms of the pieces on {a} rank{'s' if len(lost) > 1 else ''} "
                       f"{', '.join(map(str, lost))} are dropped")
        elif a not in g.shard_axes and len(on) != 1:
            out.append(f"{g.group} is replicated over {a} and counted in the norm {where}: at {a} = {n}, "
                       + (f"{len(on)} of its copies are counted ({a} ranks {', '.join(map(str, on))}), where one copy "
                          "is the value" if on else "none of the named ranks is a rank of the axis: it is not counted"))
    return out


def filtered(g) -> tuple[str, ...]:
    """The axes of g's duplicate filter the rank set leaves: on its axis the named ranks count, not rank 0."""
    return tuple(a for a in g.clip_filter if all(ar[0] != a for ar in g.clip_ranks))


def axes(g) -> tuple[str, ...]:
    return tuple(ar[0] for ar in g.clip_ranks)
