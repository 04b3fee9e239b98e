"""Per-rank operations on any set of ranks of one axis (or of the process group over several): a clip
coefficient or a divisor applied on the ranks R1, R2, ... only.

Input: a plan. Output: the located errors of a statement the step cannot read (``check_override``:
PL191, PL192, PL506), the ranks a statement applies on at given sizes (``applied``, for the replay),
and (in check.encode_rankupdate, ``rank_set_splits``) the z3 condition that they are a non-empty proper part of the axis (for the
obligation). No solver call here.

``override grads[g]: clip_on_ranks over (AXIS) ranks (R1, R2, ...)`` -- g's clip coefficient
max_norm / ‖grad‖ applied on the ranks R1, R2, ... of AXIS only (the clip under ``if rank == k``
or ``if rank in (...)``: a rank index of the axis's process group); ``override grads[g]:
divide_on_ranks over (AXIS) ranks (R1, ...) by X`` -- g's gradient divided by X on those ranks
only. Each Ri is a count (a number, or an expression of the sizes: ``pp - 1`` is the last
pipeline stage); a rank that is not a whole number in [0, n) at a size n names no rank there. The
statement is read at every size the axis can take: at a size where the named ranks are some of the
axis's ranks but not all, two ranks of the axis step g by different coefficients; where a clip names
no rank it is applied nowhere, where single-device training clips (both ``SC update[g]``, with
``check.rankupdate``'s rank-0 operations); a divisor named on no rank divides nowhere (the derived step). ``ranks (0)`` is ``clip_rank0_only`` /
``divide_rank0_only`` over one axis; ``ranks (pp - 1)`` is ``divide_last_only``.

Over several axes, ``over (A, B) ranks (R1, ...)`` names ranks of the process group over A and B:
a device's rank in it is its coordinates on A, B, ... read as one number, the first axis the most
significant (rank a·|B| + b, as a device mesh flattened over ("A", "B") numbers them), n = |A|·|B|.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from .values import fold, resolver

CLIP = OverrideVerb.CLIP_ON_RANKS
DIVIDE = OverrideVerb.DIVIDE_ON_RANKS
VERBS = (CLIP, DIVIDE)


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def ranks_text(o: ir.Override) -> str:
    return f"ranks ({', '.join(ir.show(r) for r in o.ranks or ())})"


def head(o: ir.Override) -> str:
    text = f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb} over ({', '.join(o.axes or ())}) "
    return text + ranks_text(o) + (f" by {ir.show(o.by)}" if o.by is not None else "")


def where(o: ir.Override) -> str:
    """The ranks the statement applies on, for messages."""
    axes = o.axes or ("?",)
    return f"{ranks_text(o)} of {axes[0] if len(axes) == 1 else '(' + ', '.join(axes) + ')'}"


def group_size(o: ir.Override, sizes: dict) -> int:
    """The ranks of the process group over the statement's axes: the product of their sizes."""
    n = 1
    for a in o.axes or ():
        n *= sizes[a]
    return n


def index_of(o: ir.Override, coord: dict[str, int], sizes: dict) -> int:
    """A device's rank in the process group over the statement's axes (its coordinates there, first axis most
    significant)."""
    k = 0
    for a in o.axes or ():
        k = k * sizes[a] + coord[a]
    return k


def coords(o: ir.Override, index: int, sizes: dict) -> dict[str, int]:
    """The coordinates on the statement's axes of the group's rank ``index`` (first axis most significant)."""
    out = {}
    for a in reversed(o.axes or ()):
        index, out[a] = divmod(index, sizes[a])
    return out


def file_sizes(plan: ir.Plan) -> dict[str, Fraction]:
    """The mesh sizes the file gives (those that are numbers)."""
    out = {}
    for a in plan.mesh.axes:
        try:
            out[a.name] = Fraction(fold(a.size, resolver({}, {})))
        except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
            continue
    return out


def check_override(plan: ir.Plan) -> None:
    """PL192 where a rank set is not over exactly one axis, PL191 where a rank is not one of the axis's
    ranks at the file's mesh size (resolve checks it first, with the file's lets: this catches a strategy's
    statement once its axes are bound), PL506 where a rank is named twice."""
    sizes = file_sizes(plan)
    for o in plan.overrides:
        if o.target != OverrideTarget.GRADS or o.verb not in VERBS:
            continue
        if not o.axes:
            raise _err(Code.RANK_SET_AXES, f"{head(o)}: a rank set names ranks of a process group over the axes "
                       "it names; it names none here", o)
        check_one(o, sizes)


def check_one(o: ir.Override, sizes: dict[str, Fraction]) -> None:
    """PL191 and PL506 for the ranks of one statement (also check.rankcount's): over one axis, or over
    the process group of several (its size the product of theirs)."""
    axis = o.axes[0] if len(o.axes) == 1 else f"({', '.join(o.axes)})"
    known = all(a in sizes for a in o.axes)
    seen: list[Fraction] = []
    for r in o.ranks or ():
        try:
            v = Fraction(fold(r, resolver({}, sizes)))
        except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
            continue  # a rank of sizes the file does not fix: read at every size by the obligation
        n = group_size(o, sizes) if known else None
        if v.denominator != 1 or v < 0 or (n is not None and v >= n):
            size = f" of {n} ranks" if n is not None else ""
            text = ir.show(r)  # a folded expression with its value; a literal (``-1``) once
            shown = text if text == _num(v) else f"{text} = {_num(v)}"
            last = " * ".join(o.axes)
            raise _err(Code.RANK_OUT_OF_RANGE, f"{head(o)}: rank {shown} is not a rank of "
                       f"{axis}{size} (its ranks are 0 .. {last} - 1)", o)
        if v in seen:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{head(o)} changes nothing the second time it names rank "
                       f"{_num(v)}: a rank applies the operation once however often it is named", o)
        seen.append(v)


def _num(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def applied(o: ir.Override, n: int, leaf) -> list[int]:
    """The ranks of the axis (size n) the statement applies on; ``leaf`` resolves the sizes' symbols."""
    out = set()
    for r in o.ranks or ():
        v = Fraction(fold(r, leaf))
        if v.denominator == 1 and 0 <= v < n:
            out.add(int(v))
    return sorted(out)


def count_statements(overrides) -> list[ir.Override]:
    return [o for o in overrides if o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.COUNT_ON_RANKS]


def counts_stated(overrides, group: str) -> ir.Override | None:
    """The rank-set count of ``group``: its own, else the plan's (``all``, then no group)."""
    for who in (group, "all", None):
        found = [o for o in count_statements(overrides) if o.group == who]
        if found:
            return found[-1]
    return None
