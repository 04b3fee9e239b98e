"""The simulator's section for a loss term on some ranks (docs/semantics.md, "Loss terms": a term on some
ranks), written from the semantics without the checker's code.

``weight``: what the device of coordinates ``dev`` multiplies its own contributions of the term by:
0 where the term's ``on_ranks`` statement does not name it, 1/X where its ``divide_on_ranks`` statement
names it (a device's rank in the group over the statement's axes its coordinates there, the first axis
the most significant), 1 otherwise; the statements multiply. ``simulator_losses.term_ok`` applies it to
each device's local contributions before the group's reductions.
"""

from __future__ import annotations

from fractions import Fraction

from simulator import _value
from simulator_rankset import group_rank, named

from placement_logic import ir

VERBS = ("on_ranks", "divide_on_ranks")


def statements(plan: ir.Plan, term: str) -> list[ir.Override]:
    return [o for o in plan.overrides if o.target == "loss" and o.group == term and o.verb in VERBS]


def weight(plan: ir.Plan, term: str, coords: dict[str, int], sizes: dict[str, int], bindings: dict) -> Fraction:
    out = Fraction(1)
    for o in statements(plan, term):
        holds = group_rank(o, coords, sizes) in named(o, sizes, plan, bindings)
        if o.verb == "on_ranks" and not holds:
            out = Fraction(0)
        elif o.verb == "divide_on_ranks" and holds:
            out /= _value(o.by, sizes, plan, bindings)
    return out
