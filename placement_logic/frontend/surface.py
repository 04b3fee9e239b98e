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
    """A number literal, exact, with the byte unit and the spelling it was written with."""

    value: Fraction
    unit: str | None = None  # byte unit as written (B, KB, ..., TiB) or None
    text: str = field(default="", compare=False)  # spelling in the source
    span: Span = _span()


@dataclass(frozen=True)
class Name:
    """A name used as a value: a let, an axis size or a model quantity."""

    id: str
    span: Span = _span()


@dataclass(frozen=True)
class Bool:
    """``true`` or ``false``."""

    value: bool
    span: Span = _span()


@dataclass(frozen=True)
class BinOp:
    """``left op right`` for one of ``+ - * / ^``."""

    op: str  # one of + - * / ^
    left: "Expr"
    right: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Neg:
    """``-operand``."""

    operand: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Kwarg:
    """``name = value`` among a call's or a strategy reference's arguments."""

    name: str
    value: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    """``func(args, kwargs)``: a built-in function or a cost query."""

    func: str
    args: tuple["Expr", ...] = ()
    kwargs: tuple[Kwarg, ...] = ()
    span: Span = _span()


Expr = Union[Num, Name, Bool, BinOp, Neg, Call]


@dataclass(frozen=True)
class Compare:
    """``left op right`` for one of ``== != < <= > >=`` (an assert's or a claim's test)."""

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
    """``key: mode`` in a mode map."""

    key: str
    value: ModeRef  # a mode, or for role maps a plain word carried in ModeRef.name
    span: Span = _span()


@dataclass(frozen=True)
class ModeMap:
    """``{key: mode, ...}``: a mode per state (or a role per name)."""

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
    """A strategy named by its dotted path, with the arguments it is given."""

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
    """``key { props }`` inside a block (``transformer { ... }``, ``group NAME { ... }``)."""

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
    """``use STRATEGY``: a strategy's items taken into a block."""

    ref: StrategyRef
    span: Span = _span()


@dataclass(frozen=True)
class OverrideStmt:
    """``override TARGET [GROUP] VERB [over (axes)] [by EXPR] [ranks (...)]``."""

    target: str
    group: str | None
    verb: str
    axes: tuple[str, ...] | None = None  # ``over (a, b)``; () means over no axis
    by: Expr | None = None
    span: Span = _span()
    ranks: tuple[Expr, ...] | None = None  # ``ranks (r1, r2)``: the ranks of the axis a per-rank operation is on
    sizes: tuple[Expr, ...] | None = None  # ``by (s1, s2)``: the sizes of consecutive groups (reduce_groups)
    sets: tuple[tuple[Expr, ...], ...] | None = None  # ``ranks ([0, 2], [1])``: rank sets (reduce_sets)


@dataclass(frozen=True)
class Unobserved:
    """``unobserved "what"``: a fact of the real step the plan does not state."""

    text: str
    span: Span = _span()


BlockItem = Union[Prop, SubBlock, Entry, Use, OverrideStmt, Unobserved]


# --------------------------------------------------------------------------- top-level items


@dataclass(frozen=True)
class ImportStmt:
    """``import std.x [as a]`` or ``from std.x import a [as b], ...``."""

    module: tuple[str, ...]  # e.g. ("std", "zero")
    alias: str | None = None
    names: tuple[tuple[str, str | None], ...] | None = None  # from-import: (name, alias)
    span: Span = _span()


@dataclass(frozen=True)
class LetStmt:
    """``let NAME = EXPR``."""

    name: str
    value: Expr
    span: Span = _span()


@dataclass(frozen=True)
class ModelBlock:
    """``model [from "config.json"] { ... }``: the model's properties and sub-blocks."""

    items: tuple[Union[Prop, SubBlock], ...]
    span: Span = _span()
    source: str | None = None  # ``model from "config.json" { ... }``: a Hugging Face config
    source_span: Span = _span()


@dataclass(frozen=True)
class AxisDecl:
    """``NAME = SIZE [@ link]`` in the mesh block."""

    name: str
    size: Expr
    link: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class MeshBlock:
    """``mesh { axes }``: the device mesh, axis by axis."""

    axes: tuple[AxisDecl, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Param:
    """A strategy's parameter, with its default if it has one."""

    name: str
    default: Expr | None
    span: Span = _span()


@dataclass(frozen=True)
class StrategyDef:
    """``strategy NAME(params) [over (axes)] [extends REF] { body }``, or its shorthand or alias forms."""

    name: str
    params: tuple[Param, ...] = ()
    axes: tuple[str, ...] = ()  # formal axes of a multi-axis strategy: ``over (a, b)``
    extends: StrategyRef | None = None
    shorthand: Shorthand | None = None
    body: tuple[BlockItem, ...] | None = None  # None: alias or shorthand form
    span: Span = _span()


@dataclass(frozen=True)
class PlanDef:
    """``plan NAME [extends REF] { body }``."""

    name: str
    extends: StrategyRef | None = None
    body: tuple[BlockItem, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class AssertStmt:
    """``assert TEST ["label"]``: a comparison that must hold at the spec's values."""

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
    """``claim TEST ["label"] [expect ...]``: a comparison stated of the formulas."""

    test: Compare
    label: str | None = None
    span: Span = _span()
    expect: Expect | None = None


Item = Union[ImportStmt, LetStmt, ModelBlock, MeshBlock, StrategyDef, PlanDef, AssertStmt, ClaimStmt]


@dataclass(frozen=True)
class Module:
    """A whole ``.place`` file: its top-level items in order."""

    items: tuple[Item, ...]
    file: str = field(default="<string>", compare=False)
