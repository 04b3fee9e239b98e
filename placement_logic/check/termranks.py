"""A loss term's own operations on some ranks: the term added to the objective, or divided, on a set of
ranks of an axis (or of the process group over several) only.

Input: a plan whose model declares loss terms (``ir.losses``). Output: the statements of a term
(``stated``), the located errors of a statement that changes nothing (``check``: PL506) or that is a
uniform divisor written per rank (PL280), and each device's weight on its own contributions by hand
(``factor``, for the replay); PL281 where a term has two statements of one verb. No solver call here (the z3 arm: ``check.encode_termranks``).

``override loss[T]: on_ranks over (AXES) ranks (R1, ...)`` -- the term added to the objective on the
ranks R1, R2, ... of the process group over AXES only (``if rank == 0: loss = loss + aux``,
``if accelerator.is_main_process: loss = loss + reg``, the term computed on the last pipeline stage
only while its layers live on every stage): a device not named contributes nothing of the term (weight
0). ``override loss[T]: divide_on_ranks over (AXES) ranks (R1, ...) by X`` -- the term's contributions
divided by X on the named ranks only (its coefficient, or 1/microbatches, applied where the main loss
is computed): weight 1/X there, 1 elsewhere. A term has at most one statement of each verb (PL281);
the two multiply. A rank's index in the group is its coordinates on AXES read as one number, the first
axis the most significant (``check.rankset``).

Single-device training weights every contribution of the term alike (the path's normalisation, checked
by ``GI loss[T]``); each device computes contributions of its own (its tokens, its replica, its shard
of the layers), so at sizes where a device weights its own 0, or two devices weight theirs apart, the
term's gradient is not single-device training's. At sizes where every device applies the divisor (its
ranks name every rank there: ``ranks (pp - 1)`` at pp = 1), the path's divisor is multiplied by X.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import losses as terms
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import rankset
from .values import fold, resolver

ON = OverrideVerb.ON_RANKS
DIVIDE = OverrideVerb.DIVIDE_ON_RANKS


def stated(plan: ir.Plan, term: str) -> list[ir.Override]:
    """The term's statements on sets of ranks, in file order."""
    return [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.group == term
            and o.verb in terms.RANK_VERBS]


def _err(code: str, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])


def _every_rank(o: ir.Override, sizes: dict[str, Fraction]) -> bool:
    """Whether the statement names every rank of its group at the file's sizes (all of them numbers)."""
    if not all(a in sizes for a in o.axes or ()):
        return False
    n = rankset.group_size(o, sizes)
    try:
        return len(rankset.applied(o, int(n), resolver({}, sizes))) == n
    except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
        return False


def check(plan: ir.Plan) -> None:
    """PL191 / PL506 for the ranks (``rankset.check_one``); PL506 for ``by 1`` and for the term added on every
    rank; PL280 for a divisor on every rank of the group (a uniform divisor: ``loss[T]: divide by X``)."""
    sizes = rankset.file_sizes(plan)
    for name, _, _ in plan.model.loss_terms:
        mine = stated(plan, name)
        for o in mine:
            first = next(x for x in mine if x.verb == o.verb)
            if first is not o:
                raise _err(Code.TERM_RANK_SETS_TWICE, f"{rankset.head(o)}: the {name} term already has a rank set for "
                           f"{o.verb} (line {first.span.line}); state one per verb, its ranks in one list", o)
            rankset.check_one(o, sizes)
            if o.verb == DIVIDE and o.by is not None and _number(o.by, sizes) == 1:
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{rankset.head(o)} changes nothing: a division by 1", o)
            if not _every_rank(o, sizes):
                continue
            if o.verb == ON:
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{rankset.head(o)} changes nothing: it names every rank of "
                           f"({', '.join(o.axes)}), and the {name} term is added on every rank without it", o)
            raise _err(Code.TERM_DIVISOR_EVERY_RANK, f"{rankset.head(o)}: it names every rank of "
                       f"({', '.join(o.axes)}), a divisor every rank applies: state it as override loss[{name}]: "
                       f"divide by {ir.show(o.by)}", o)


def _number(v: ir.Value, sizes: dict[str, Fraction]) -> Fraction | None:
    try:
        return Fraction(fold(v, resolver({}, sizes)))
    except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
        return None


def named(o: ir.Override, coord: dict[str, int], sizes: dict, leaf) -> bool:
    """Whether the statement's rank set holds the device of coordinates ``coord`` (counted by hand)."""
    return rankset.index_of(o, coord, sizes) in rankset.applied(o, rankset.group_size(o, sizes), leaf)


def factor(stmts: list[ir.Override], coord: dict[str, int], sizes: dict, leaf) -> Fraction:
    """The weight the device of coordinates ``coord`` gives its own contributions of the term."""
    out = Fraction(1)
    for o in stmts:
        on = named(o, coord, sizes, leaf)
        if o.verb == ON and not on:
            out = Fraction(0)
        elif o.verb == DIVIDE and on:
            out /= Fraction(fold(o.by, leaf))
    return out


def axes_of(stmts: list[ir.Override]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for o in stmts for a in o.axes or ()))


def text(o: ir.Override) -> str:
    """The statement, for findings: what it does and where."""
    what = "added to the objective" if o.verb == ON else f"divided by {ir.show(o.by)}"
    return f"{what} on {rankset.where(o)} only (override loss[{o.group}]: {o.verb} at line {o.span.line})"
