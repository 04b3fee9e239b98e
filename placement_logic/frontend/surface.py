"""Surface syntax tree: what a ``.place`` file says, node for node.

Input: nothing (node definitions). Output: frozen dataclasses built by ``lower`` from
lark's parse tree and consumed by ``resolve`` and ``fmt``. Every node carries a span;
spans and the original spelling of numbers are excluded from equality, so a file and
its canonical formatting lower to equal trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Union

from ..diagnostics import NO_SPAN, Span


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Num:
    value: Fraction
    unit: str | None = None  # byte unit as written (B, KB, ..., TiB) or None
    text: str = field(default="", compare=False)  # spelling in the source
    span: Span = _span()


@dataclass(frozen=True)
class Name:
    id: str
    span: Span = _span()


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span = _span()


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / ^
    left: "Expr"
    right: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Kwarg:
    name: str
    value: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple["Expr", ...] = ()
    kwargs: tuple[Kwarg, ...] = ()
    span: Span = _span()


Expr = Union[Num, Name, Bool, BinOp, Neg, Call]


@dataclass(frozen=True)
class Compare:
    op: str  # == != < <= > >=
    left: Expr
    right: Expr
    span: Span = _span()


# --------------------------------------------------------------------------- placements


@dataclass(frozen=True)
class ModeRef:
    """A mode as written: ``R``, ``S``, ``S*``, ``M``, ``O`` (checked by resolve)."""

    name: str
    star: bool = False
    span: Span = _span()

    @property
    def text(self) -> str:
        return self.name + ("*" if self.star else "")


@dataclass(frozen=True)
class MapEntry:
    key: str
    value: ModeRef  # a mode, or for role maps a plain word carried in ModeRef.name
    span: Span = _span()


@dataclass(frozen=True)
class ModeMap:
    entries: tuple[MapEntry, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Shorthand:
    """The paper's 4-tuple over (params, optimizer, grads, activations), with a role."""

    role: str | None
    modes: tuple[ModeRef, ...]
    span: Span = _span()


@dataclass(frozen=True)
class StrategyRef:
    path: tuple[str, ...]
    args: tuple[Kwarg, ...] = ()
    span: Span = _span()

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


# --------------------------------------------------------------------------- block items


@dataclass(frozen=True)
class Prop:
    """``key = value`` in model/strategy/plan blocks, or a bare flag (value None)."""

    key: str
    value: Union[Expr, ModeMap, None]
    span: Span = _span()


@dataclass(frozen=True)
class SubBlock:
    key: str
    props: tuple[Prop, ...]
    span: Span = _span()
    name: str | None = None  # ``group NAME { ... }`` in the model block


@dataclass(frozen=True)
class Entry:
    """``lhs: rhs (options)``: a state placement or an axis binding (decided by resolve)."""

    lhs: tuple[str, ...]  # one name, or several for a multi-axis binding ``(a, b): s``
    rhs: Union[ModeRef, ModeMap, StrategyRef]
    options: tuple[Kwarg, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class Use:
    ref: StrategyRef
    span: Span = _span()


@dataclass(frozen=True)
class OverrideStmt:
    target: str
    group: str | None
    verb: str
    axes: tuple[str, ...] | None = None  # ``over (a, b)``; () means over no axis
    by: Expr | None = None
    span: Span = _span()
    ranks: tuple[Expr, ...] | None = None  # ``ranks (r1, r2)``: the ranks of the axis a per-rank operation is on
    sizes: tuple[Expr, ...] | None = None  # ``by (s1, s2)``: the sizes of consecutive groups (reduce_groups)


@dataclass(frozen=True)
class Unobserved:
    """``unobserved "what"``: a fact of the real step the plan does not state."""

    text: str
    span: Span = _span()


BlockItem = Union[Prop, SubBlock, Entry, Use, OverrideStmt, Unobserved]


# --------------------------------------------------------------------------- top-level items


@dataclass(frozen=True)
class ImportStmt:
    module: tuple[str, ...]  # e.g. ("std", "zero")
    alias: str | None = None
    names: tuple[tuple[str, str | None], ...] | None = None  # from-import: (name, alias)
    span: Span = _span()


@dataclass(frozen=True)
class LetStmt:
    name: str
    value: Expr
    span: Span = _span()


@dataclass(frozen=True)
class ModelBlock:
    items: tuple[Union[Prop, SubBlock], ...]
    span: Span = _span()
    source: str | None = None  # ``model from "config.json" { ... }``: a Hugging Face config
    source_span: Span = _span()


@dataclass(frozen=True)
class AxisDecl:
    name: str
    size: Expr
    link: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class MeshBlock:
    axes: tuple[AxisDecl, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Param:
    name: str
    default: Expr | None
    span: Span = _span()


@dataclass(frozen=True)
class StrategyDef:
    name: str
    params: tuple[Param, ...] = ()
    axes: tuple[str, ...] = ()  # formal axes of a multi-axis strategy: ``over (a, b)``
    extends: StrategyRef | None = None
    shorthand: Shorthand | None = None
    body: tuple[BlockItem, ...] | None = None  # None: alias or shorthand form
    span: Span = _span()


@dataclass(frozen=True)
class PlanDef:
    name: str
    extends: StrategyRef | None = None
    body: tuple[BlockItem, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class AssertStmt:
    test: Compare
    label: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class Expect:
    """``expect fails [unless NAME = VALUE, ...]``: the claim is expected to fail at the spec's
    values and, with each NAME re-bound to its VALUE, to hold."""

    pins: tuple[tuple[str, Expr], ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class ClaimStmt:
    test: Compare
    label: str | None = None
    span: Span = _span()
    expect: Expect | None = None


Item = Union[ImportStmt, LetStmt, ModelBlock, MeshBlock, StrategyDef, PlanDef, AssertStmt, ClaimStmt]


@dataclass(frozen=True)
class Module:
    items: tuple[Item, ...]
    file: str = field(default="<string>", compare=False)
