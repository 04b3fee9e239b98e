"""Process groups over part of an axis, and operations on a set of an axis's ranks other than rank 0.

Input: a plan and the step's ``GroupModel`` records. Output: the located errors of a statement the
step cannot read (``check_override``: PL181, PL182, PL183, PL506), the statements themselves and
the per-rank predicates the obligations and the replay read (``check.encode_subgroups``). No
solver here.

A subgroup of an axis is one of the groups a statement cuts the axis's n ranks into (the product
form of the mesh kept, each named axis cut alike; docs/semantics.md, "Process groups over part of an
axis"), by its verb (``PARTITION_VERBS``):

* ``reduce_blocks ... by B`` -- blocks of B consecutive ranks: rank i is in block ⌊i / B⌋ (the last
  block shorter where B does not divide n): a process group per node, ``ranks[k*B:(k+1)*B]``;
* ``reduce_strided ... by S`` -- strided groups: rank i is in group i mod S, ranks r, r+S, r+2S ...
  (a data-parallel group built with the stride of another axis, so it crosses the ranks it should
  not and misses the ones it should hold);
* ``reduce_first ... by K`` -- the first K ranks only: ranks 0..K-1 reduce together, every other rank
  reduces nothing (a collective on a group a rank is not a member of is a no-op there) and keeps its
  own contribution;
* ``reduce_groups ... by (S1, S2, ...)`` -- consecutive groups of unequal sizes (``ir.unequal``): ranks
  0..S1-1, then the next S2, ...: a per-node group on nodes of unequal GPU counts, a hand-written
  ``new_group`` list. One axis (PL251), the sizes positive whole numbers adding up to its size (PL250);
  where the axis's size is free the groups fix it to the sum, and a size pinned to another number is PL250
  too (``check.encode_subgroups``);
* ``reduce_sets ... ranks ([0, 2, 3], [1, 4])`` -- a list of rank sets (``ir.ranksets``), one per
  ``new_group``, ranks in any order: rank i is in the group of the set holding it. The sets a partition of
  the axis's ranks (PL267 overlap, PL268 a rank missing or past the axis); where the axis's size is free the
  sets fix it to the number of ranks they hold. Over several axes (``over (A, B)``) the sets
  list the flattened ranks of the product, row-major, each axis's size a number on the mesh (PL269), and an
  axis the gradient is not reduced over may be named: every set must be a derived reduction group
  (``check.encode_ranksets``); for the grad norm's reduction every set must count each piece of every group as
  often as its derived group does (``check.encode_normsets``).

Each applies to ``override grads[g]: VERB over (AXES) by E`` (g's gradient reduction over each axis of
AXES runs within the groups: ``GI grads[g] blocks``, the groups holding different partial sums) and to
``override clip_norm: VERB over (AXES) by E`` (the grad norm's reduction: ``SC clip_norm``). The group
covers the axis, as derived, iff B >= n, S = 1, K >= n, or a list of one size. Statements of one reduction over
different axes combine, each axis cut by its own kind of group (blocks over dp and strided groups over tp: the
product of the two); one axis cut twice is PL194.

A set of ranks other than rank 0: ``override grads[g]: divide_except_last over (AXES) by X`` (every
rank of AXES but the last divides g's gradient by X: every pipeline stage but the last scaling again,
DeepSpeed#8152 with any number of stages) and ``divide_last_only over (AXES) by X`` (only the last
rank divides). Both are read by ``check.rankupdate`` beside the rank-0 operations (``SC update[g]``):
the ranks a divisor is applied on are a non-empty proper subset of the axes' ranks as soon as one
of them has two or more ranks.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import ranksets, unequal
from ..ir.overrides import OverrideTarget, OverrideVerb
from .clipagg import plan_norm

BLOCKS = OverrideVerb.REDUCE_BLOCKS
STRIDED = OverrideVerb.REDUCE_STRIDED
FIRST = OverrideVerb.REDUCE_FIRST
GROUPS = OverrideVerb.REDUCE_GROUPS
SETS = OverrideVerb.REDUCE_SETS
PARTITION_VERBS = (BLOCKS, STRIDED, FIRST, GROUPS, SETS)
EXCEPT_LAST = OverrideVerb.DIVIDE_EXCEPT_LAST
LAST_ONLY = OverrideVerb.DIVIDE_LAST_ONLY
SUBSET_VERBS = (EXCEPT_LAST, LAST_ONLY)


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def head(o: ir.Override) -> str:
    text = f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb}"
    if o.axes is not None:
        text += f" over ({', '.join(o.axes)})"
    if o.sizes is not None:
        return text + f" by ({', '.join(ir.show(s) for s in o.sizes)})"
    if o.sets is not None:
        return text + " ranks (" + ", ".join("[" + ", ".join(map(ir.show, s)) + "]" for s in o.sets) + ")"
    return text + (f" by {ir.show(o.by)}" if o.by is not None else "")


def applies(verb: str, coords: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Whether a divisor stated with ``verb`` over axes of ``sizes`` is applied at ``coords`` there:
    rank 0 of every axis, the last rank of every axis, or every rank but that one."""
    if verb == OverrideVerb.DIVIDE_RANK0_ONLY or verb == OverrideVerb.CLIP_RANK0_ONLY:
        return all(c == 0 for c in coords)
    last = all(c == n - 1 for c, n in zip(coords, sizes))
    return last if verb == LAST_ONLY else not last


def where(verb: str) -> str:
    """The ranks a rank-set verb applies on, for messages."""
    return {EXCEPT_LAST: "every rank but the last", LAST_ONLY: "the last rank"}.get(verb, "rank 0")


def _effective(found: list[ir.Override]) -> list[ir.Override]:
    """The statements of one reduction that cut its axes: each axis by the statements naming it, a statement
    restated over the same axes by the same verb replaced by the later one (PL194 refuses any other overlap)."""
    return [o for i, o in enumerate(found) if not any(set(x.axes or ()) & set(o.axes or ()) for x in found[i + 1:])]


def grad_partitions(plan: ir.Plan, group: str) -> list[ir.Override]:
    """The groups of ``group``'s gradient reduction: its own statements, else the plan's (``all``, then none);
    statements over different axes combine, each axis cut by its own kind of group."""
    for who in (group, "all", None):
        found = [o for o in plan.overrides if o.target == OverrideTarget.GRADS and o.verb in PARTITION_VERBS
                 and o.group == who]
        if found:
            return _effective(found)
    return []


def grad_blocks(plan: ir.Plan, group: str) -> ir.Override | None:
    """The last statement of ``group``'s gradient reduction's groups (``grad_partitions`` has them all)."""
    found = grad_partitions(plan, group)
    return found[-1] if found else None


def norm_partitions(plan: ir.Plan) -> list[ir.Override]:
    """The groups of the grad norm's reduction, each axis cut by the statement naming it."""
    return _effective([o for o in plan.overrides if o.target == OverrideTarget.CLIP_NORM
                       and o.verb in PARTITION_VERBS])


def norm_blocks(plan: ir.Plan) -> ir.Override | None:
    found = norm_partitions(plan)
    return found[-1] if found else None


def groups_text(o: ir.Override) -> str:
    """The groups ``o`` cuts an axis into, for messages."""
    if o.verb == SETS:
        return f"the process groups of the rank sets {ranksets.text(sets_of(o))}"
    if o.verb == GROUPS:
        runs = ", ".join(f"{a}..{a + s - 1}" for a, s in zip(unequal.starts(sizes_of(o)), sizes_of(o)))
        return f"consecutive groups of {', '.join(map(str, sizes_of(o)))} ranks (ranks {runs})"
    e = ir.show(o.by)
    if o.verb == STRIDED:
        two = ir.show(ir.const(2 * o.by.value)) if isinstance(o.by, ir.Const) else f"2·{e}"
        return f"strided groups of stride {e} (ranks r, r+{e}, r+{two} ...)"
    if o.verb == FIRST:
        return f"the first {e} ranks only (every other rank reducing nothing)"
    return f"blocks of {e} consecutive ranks"


def sizes_of(o: ir.Override) -> tuple[int, ...]:
    """The sizes of ``reduce_groups ... by (S1, ...)`` as whole numbers (resolve has checked them)."""
    return tuple(int(Fraction(s.value)) for s in o.sizes or ())


def sets_of(o: ir.Override) -> tuple[tuple[int, ...], ...]:
    """The rank sets of ``reduce_sets ... ranks ([...], ...)`` as whole numbers (resolve has checked them)."""
    return tuple(tuple(int(Fraction(r.value)) for r in s) for s in o.sets or ())


def _rank_sets(o: ir.Override, plan: ir.Plan) -> None:
    """PL269 where rank sets cut no axis or several, PL267/PL268 where they do not partition its ranks (at its
    size on the mesh, else at as many ranks as they hold), PL506 where one set holds the axis."""
    if not o.axes or len(set(o.axes)) != len(o.axes):
        raise _err(Code.RANK_SETS_AXIS, f"{head(o)}: a list of rank sets cuts the ranks of the axes it names, each "
                   "named once", o)
    if len(o.axes) > 1:
        _sets_axes(o, plan)
        return
    size = next((x.size for x in plan.mesh.axes if x.name == o.axes[0]), None)
    values = tuple(tuple(Fraction(r.value) if isinstance(r, ir.Const) else None for r in s) for s in o.sets or ())
    why = ranksets.problem(head(o), o.sets or (), values, o.axes[0],
                           Fraction(size.value) if isinstance(size, ir.Const) else None)
    if why is not None:
        raise _err(why[0], why[1], o)
    if len(values) == 1:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: one set holds every rank of the axis, so the "
                   "reduction is over the whole axis as derived", o)


def set_sizes(o: ir.Override, plan: ir.Plan) -> tuple[int, ...] | None:
    """The sizes of the axes rank sets over several axes name, in the statement's order (None where one is not a
    whole number on the mesh: PL269)."""
    sizes = {x.name: x.size for x in plan.mesh.axes}
    out = tuple(sizes.get(a) for a in o.axes or ())
    if any(not isinstance(n, ir.Const) or Fraction(n.value).denominator != 1 for n in out):
        return None
    return tuple(int(n.value) for n in out)


def _sets_axes(o: ir.Override, plan: ir.Plan) -> None:
    """Rank sets over several axes: each axis's size a number on the mesh (PL269; the flattened rank depends on
    them), the sets a partition of the product's ranks (PL267, PL268)."""
    sizes = set_sizes(o, plan)
    if sizes is None:
        raise _err(Code.RANK_SETS_AXIS, f"{head(o)}: rank sets over several axes number the ranks of their product "
                   "row-major, so each axis's size is a number on the mesh", o)
    values = tuple(tuple(Fraction(r.value) if isinstance(r, ir.Const) else None for r in s) for s in o.sets or ())
    why = ranksets.problem(head(o), o.sets or (), values, f"({', '.join(o.axes)}) flattened",
                           Fraction(ranksets.prod(sizes)))
    if why is not None:
        raise _err(why[0], why[1], o)


def multi_sets(o: ir.Override) -> bool:
    """Whether ``o`` is a list of rank sets over several axes (the flattened ranks of their product)."""
    return o.verb == SETS and len(o.axes or ()) > 1


def _group_sizes(o: ir.Override, plan: ir.Plan) -> None:
    """PL251 where a list of sizes cuts no axis or several, PL250 where the sizes are not positive whole numbers
    or add up to another number than the axis's size on the mesh, PL506 where one group holds the axis."""
    if len(o.axes or ()) != 1:
        raise _err(Code.GROUPS_AXIS, f"{head(o)}: a list of group sizes cuts one axis; name one", o)
    a = o.axes[0]
    size = next((x.size for x in plan.mesh.axes if x.name == a), None)
    values = tuple(Fraction(s.value) if isinstance(s, ir.Const) else None for s in o.sizes or ())
    why = unequal.problem(head(o), o.sizes or (), values, a,
                          Fraction(size.value) if isinstance(size, ir.Const) else None)
    if why is not None:
        raise _err(Code.GROUP_SIZES, why, o)
    if len(values) == 1:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: one group of {values[0]} ranks holds the whole "
                   "axis, so the reduction is over the whole axis as derived", o)


def reduced_axes(g) -> tuple[str, ...]:
    """The axes ``g``'s gradient is reduced over in the step (derived, or stated by grads: reduce)."""
    return tuple(dict.fromkeys(d.axis for d in g.dims if d.axis is not None and d.k >= 1))


def _axes_once(o: ir.Override) -> None:
    if not o.axes:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: it names no axis", o)
    twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
    if twice is not None:
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing the second time it names {twice}: an axis is "
                   "cut into groups once", o)


def _block_size(o: ir.Override, plan: ir.Plan) -> None:
    """PL183 where B, S or K is a number that is not a positive integer; PL506 where the group covers every
    axis it names (a block or the first K ranks holding the axis, a stride of 1)."""
    if o.verb == GROUPS:
        _group_sizes(o, plan)
        return
    if o.verb == SETS:
        _rank_sets(o, plan)
        return
    if not isinstance(o.by, ir.Const):
        return
    b = Fraction(o.by.value)
    if b.denominator != 1 or b < 1:
        what = {STRIDED: "a stride of ranks is", FIRST: "a count of ranks is"}.get(o.verb, "a block of ranks holds")
        raise _err(Code.BLOCK_SIZE, f"{head(o)}: {what} a positive whole number of ranks, not {ir.show(o.by)}", o)
    if o.verb == STRIDED:
        if b == 1:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: a stride of 1 puts every rank of the "
                       "axis in one group, so the reduction is over the whole axis as derived", o)
        return
    sizes = {a.name: a.size for a in plan.mesh.axes}
    if all(isinstance(sizes.get(a), ir.Const) and sizes[a].value <= b for a in o.axes or ()):
        held = "the first" if o.verb == FIRST else "a block of"
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: {held} {ir.show(o.by)} ranks holds the "
                   "whole of every axis it names, so the reduction is over the whole axis as derived", o)


def _one_partition(plan: ir.Plan) -> None:
    """PL194 where one axis of one reduction (a group's gradient at one level, or the norm) is given groups by two
    statements, other than the same verb restated over the same axes (the later replaces the earlier). Statements
    over different axes combine: each axis is cut by its own kind of group."""
    seen: dict[tuple, list[ir.Override]] = {}
    for o in plan.overrides:
        if o.verb not in PARTITION_VERBS or o.target not in (OverrideTarget.GRADS, OverrideTarget.CLIP_NORM):
            continue
        for first in seen.setdefault((o.target, o.group), []):
            common = [a for a in o.axes or () if a in (first.axes or ())]
            if common and (first.verb != o.verb or set(first.axes) != set(o.axes)):
                raise _err(Code.PARTITION_TWICE, f"{head(o)}: {common[0]} of the same reduction is already run in "
                           f"{groups_text(first)} (line {first.span.line}); an axis of a reduction is cut into groups "
                           "once (groups of two kinds over different axes combine, one kind per axis)", o)
        seen[(o.target, o.group)].append(o)


def _norm_sets(o: ir.Override, plan: ir.Plan, groups, axes) -> bool:
    """Rank sets over several axes for the grad norm (check.encode_normsets): an axis the norm is not reduced over
    may be named (the sets then cut its reduction groups), one it is reduced over must be; PL506 where one set
    holds every rank of axes it is reduced over."""
    _sets_axes(o, plan)
    named = [a for a in o.axes if a in axes]
    if not named:
        raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: the grad norm is not reduced over any of ({', '.join(o.axes)}) "
                   f"(its reduction: ({', '.join(axes)})), so there is no reduction there to run in groups", o)
    if len(o.sets or ()) == 1 and len(named) == len(o.axes):
        raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: one set holds every rank of the axes, so "
                   "the reduction is over the whole of them as derived", o)
    return True


def check_override(plan: ir.Plan, groups) -> None:
    """The located errors of the statements the step cannot read. (Divisors on sets of ranks for one group combine,
    each device applying the product of those whose rank sets hold it, over any axes: check.encode_rankproduct.)"""
    _one_partition(plan)
    for o in plan.overrides:
        if o.verb not in PARTITION_VERBS or o.target not in (OverrideTarget.GRADS, OverrideTarget.CLIP_NORM):
            continue
        _axes_once(o)
        if o.target == OverrideTarget.GRADS:
            named = [g for g in groups if o.group in (None, "all", g.group)]
            for g in named:
                if o not in grad_partitions(plan, g.group):
                    continue
                missing = next((a for a in o.axes if a not in reduced_axes(g)), None)
                if multi_sets(o) and missing is not None and any(a in reduced_axes(g) for a in o.axes):
                    continue  # the sets name the groups of the axes reduced over, each within its unreduced coordinates
                if multi_sets(o) and len(o.sets or ()) == 1:
                    raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing: one set holds every rank of the "
                               "axes, so the reduction is over the whole of them as derived", o)
                if missing is not None:
                    raise _err(Code.BLOCKS_UNREDUCED_AXIS, f"{head(o)}: the {g.group} gradient is not reduced over "
                               f"{missing} (its reductions: ({', '.join(reduced_axes(g))})), so there is no reduction "
                               "there to run in groups", o)
        else:
            if o.group is not None:
                raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: the norm is one all-reduce of every group's squared "
                           "norms; state its groups without a group", o)
            axes, _ = plan_norm(plan, groups)
            if multi_sets(o) and _norm_sets(o, plan, groups, axes):
                continue
            for a in o.axes:
                if a not in axes:
                    raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: the grad norm is not reduced over {a} (its "
                               f"reduction: ({', '.join(axes)})), so there is no reduction there to run in groups", o)
                if not any(a in g.shard_axes for g in groups):
                    raise _err(Code.NORM_BLOCKS_AXIS, f"{head(o)}: no group's gradient is sharded over {a}, so its "
                               "ranks hold the same squared norms and a reduction there is a count, not a sum of "
                               "pieces; name an axis the norm sums shards over", o)
        _block_size(o, plan)
