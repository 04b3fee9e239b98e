"""Value expressions of the IR: exact constants, symbols, operators and cost queries.

``Const`` holds a ``fractions.Fraction``; a ``Sym`` names a ``let`` binding or a mesh axis
size, whose value lives in ``Spec.bindings``; ``Op`` applies + - * / ^ or neg; a ``Query``
asks for a cost of a plan. Re-exported by ``ir.nodes`` and ``ir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterator, Union

from ..diagnostics import NO_SPAN, Span


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Const:
    """An exact rational constant."""

    value: Fraction
    span: Span = _span()


@dataclass(frozen=True)
class Sym:
    """A symbol: a let, an axis size or a model quantity, by name."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class Op:
    """An arithmetic operation (``+ - * / ^ neg``) over values."""

    op: str  # + - * / ^ neg
    args: tuple["Value", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Query:
    """A cost of a plan, asked for in an ``assert`` or ``claim``.

    kind: ``memory`` (device peak), ``host_memory``, ``model_state``, ``comm``
    (ring bytes sent per device per step) or ``volume`` (the ZeRO convention).
    arg: a state name for memory queries, an axis name for comm/volume, or None.
    """

    kind: str
    plan: str
    arg: str | None = None
    span: Span = _span()


Value = Union[Const, Sym, Op, Query]


def walk(value: Value) -> Iterator[Value]:
    """Every node of a value expression, without recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Op):
            stack.extend(reversed(node.args))


def symbols(value: Value) -> frozenset[str]:
    return frozenset(n.name for n in walk(value) if isinstance(n, Sym))


def const(x: int | Fraction) -> Const:
    return Const(Fraction(x))
