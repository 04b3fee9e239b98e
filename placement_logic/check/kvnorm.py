"""The grad norm of K >= 2 kv heads copied over a tensor axis (docs/semantics.md, "Global
reductions"). On an axis of n ranks that splits K < n kv heads, rank r holds head r // (n/K)
(a head part, distinct values) and is copy r mod (n/K) of it (a copy part): after the copy
group's all-reduce the copies' gradients are equal, so a norm summed over the axis counts each
head n/K times unless a duplicate filter counts it on the first rank of its copy group only.

The derived norm filters the copies (each head counted once). A stated `clip_norm: reduce`
is a plain sum: the copies each count, unless `clip_norm: dedupe over (AXIS)` states the
filter. ``override clip_norm[kv]: count_copies over (AXES)`` states a filter that takes the
copies for distinct shards (a copied weight marked tensor-parallel, as Megatron-LM's
``param_is_not_tensor_parallel_duplicate`` reads the attribute): every copy counted.

Input: the step's ``GroupModel`` records and the plan's overrides. Output: the records with
``clip_copies`` (the axes over which the group's copies are counted) set; a `count_copies` that
reaches no copy is PL506. No solver here; the encoding multiplies a counted copy part's term by
its size (encode_norm.norm_negation) and the replay (replay_norm) places head r // (n/K) on rank r.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import clipagg, kvjoint, kvproduct
from .dims import COPY_PART


def copy_heads(g) -> dict[str, int]:
    """axis -> K, for each tensor axis over which g's K kv heads are copied (its copy part)."""
    return {d.axis: d.heads for d in g.dims if d.part == COPY_PART}


def copy_axis(g) -> dict[str, str]:
    """mesh axis -> the copy axis it names: a copy axis itself, and every axis of a joint layout its first
    (copy groups crossing the axes, check.kvjoint: a filter or a count over any of them reads the joint copies)."""
    out = {a: a for a in copy_heads(g)}
    for d in g.dims:
        if d.part == COPY_PART and d.joint:
            out.update({a: d.axis for a, _ in d.joint})
    return out


def _names(g, axes, a: str) -> bool:
    """Whether ``axes`` (an override's) name copy axis ``a`` of g."""
    return any(copy_axis(g).get(x) == a for x in axes or ())


def _own(overrides: tuple[ir.Override, ...], verb: str, group: str) -> ir.Override | None:
    for who in (group, "all", None):
        found = [o for o in overrides if o.target == OverrideTarget.CLIP_NORM and o.verb == verb and o.group == who]
        if found:
            return found[-1]
    return None


def apply(groups: list, overrides: tuple[ir.Override, ...], plan_clip: tuple[str, ...]) -> list:
    """Each group's counted copy axes: those of its reduction where its copies are summed with no filter."""
    out = []
    count = [o for o in overrides if o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.COUNT_COPIES]
    for g in groups:
        heads = copy_heads(g)
        summed = [a for a in heads if a in (g.clip_axes if g.clip_axes is not None else plan_clip)]
        if not summed:
            out.append(g)
            continue
        counted = [a for a in summed if _plain_sum(overrides, g, a)]  # a stated reduction, no dedupe naming a
        o = _own(overrides, OverrideVerb.COUNT_COPIES, g.group)
        if o is not None:
            counted += [a for a in summed if _names(g, o.axes, a) and a not in counted]
        out.append(replace(g, clip_copies=tuple(a for a in summed if a in counted),
                           clip_copies_span=o.span if o is not None else NO_SPAN))
    for o in count:
        _reaches(o, out, plan_clip, overrides)
    return out


def _plain_sum(overrides: tuple[ir.Override, ...], g, a: str) -> bool:
    """Whether g's stated norm reduction counts its copies on ``a`` without any `count_copies` (no filter names a)."""
    dedupe = _own(overrides, OverrideVerb.DEDUPE, g.group)
    a = copy_axis(g).get(a, a)
    return clipagg.stated(overrides, g.group) is not None and (dedupe is None or not _names(g, dedupe.axes, a))


def _reaches(o: ir.Override, groups: list, plan_clip: tuple[str, ...], overrides: tuple[ir.Override, ...]) -> None:
    """A `count_copies` must name an axis over which a group it names has copies its norm sums with a filter."""
    head = f"override clip_norm{f'[{o.group}]' if o.group else ''}: count_copies over ({', '.join(o.axes or ())})"
    targets = [g for g in groups if o.group in (None, "all") or g.group == o.group]
    if not o.axes:
        raise _no_effect(f"{head} changes nothing: it names no axis", o)
    for a in o.axes:
        copied = [g for g in targets if a in copy_axis(g)]
        if not copied:
            raise _no_effect(f"{head} changes nothing: no group it names has kv heads copied over {a} (copies exist "
                             "where a tensor axis has more ranks than the model's K >= 2 kv heads)", o)
        if not any(a in (g.clip_axes if g.clip_axes is not None else plan_clip) for g in copied):
            raise _no_effect(f"{head} changes nothing: the norm of {', '.join(g.group for g in copied)} is not summed "
                             f"over {a}, so its copies there are not added", o)
        summed = [g for g in copied if a in (g.clip_axes if g.clip_axes is not None else plan_clip)]
        if all(_plain_sum(overrides, g, a) for g in summed):
            raise _no_effect(f"{head} changes nothing: the stated norm reduction of {', '.join(g.group for g in summed)} "
                             f"is a plain sum over {a} with no duplicate filter there, so every copy is counted already", o)


def _no_effect(msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, msg, o.span)])


def head_of(g, axis: str, rank: int, size: int) -> int:
    """The element (head) coordinate of rank ``rank`` of ``axis`` for group g: rank // (n/K) on a copy axis."""
    k = copy_heads(g).get(axis)
    return rank // (size // k) if k else rank


def counted_copy(g, dev, pos: dict[str, int], sizes: dict[str, int], g_axes) -> bool:
    """Whether rank ``dev`` counts its copy of g's kv head: on every summed copy axis where the copies are
    filtered, only the first rank of the copy group does."""
    for d in g.dims:
        if d.part != COPY_PART or d.axis not in g_axes or d.axis in g.clip_copies:
            continue
        if not (kvjoint.first_copy(d, dev, pos) if d.joint else dev[pos[d.axis]] % (sizes[d.axis] // d.heads) == 0):
            return False
    return True


def diagnosis(g, sizes: dict[str, int]) -> list[str]:
    """The cause, where g's copies are counted at these sizes."""
    out = []
    for d in g.dims:
        if d.part != COPY_PART:
            continue
        a, k = d.axis, d.heads
        c = kvjoint.copies(d) if d.joint else sizes[a] // k
        if a in g.clip_copies and c >= 2:
            how = (f"`count_copies` at line {g.clip_copies_span.line}" if g.clip_copies_span != NO_SPAN
                   else "a stated reduction with no duplicate filter")
            heads = "the kv heads" if kvproduct.several(g) else f"the {k} kv heads"
            where = kvjoint.text(d) if d.joint else a  # over several axes: K blocks
            out.append(f"{heads} ({g.group}) are copied on {c} {where} ranks each and the norm sums "
                       f"every copy ({how}): each head's squared norm counted {c} times, not once")
    return out
