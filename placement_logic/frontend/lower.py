"""Lowering: lark parse tree -> syntax tree (placement_logic.frontend.surface), with spans.

The grammar's rule aliases name the methods of ``Lower``; each method receives the
already-lowered children. Numbers are read exactly (``fractions.Fraction``) from their
spelling; nothing here evaluates user text.
"""

from __future__ import annotations

from fractions import Fraction

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from . import surface
from .lark_import import Meta, Token, Transformer, v_args


def read_number(text: str) -> Fraction:
    """An exact Fraction from a decimal literal such as ``7.5e9`` or ``70_000``."""
    digits = text.replace("_", "")
    mantissa, _, exponent = digits.lower().partition("e")
    whole, _, frac = mantissa.partition(".")
    value = Fraction(int(whole + frac), 10 ** len(frac))
    if exponent:
        exp = int(exponent)
        if abs(exp) > 400:
            raise ValueError("exponent out of range")
        value *= Fraction(10) ** exp
    return value


class _Sizes:
    """``by (S1, S2, ...)`` as the by-clause hands it to ``override_stmt``."""

    def __init__(self, sizes: tuple) -> None:
        self.sizes = sizes


class _Sets:
    """``ranks ([R, ...], [R, ...])`` as the ranks clause hands it to ``override_stmt``."""

    def __init__(self, sets: tuple) -> None:
        self.sets = sets


@v_args(meta=True)
class Lower(Transformer):
    """Turns lark's tree into syntax nodes. One method per grammar alias."""

    MAX_DEPTH = 200  # deeper expressions are refused (PL007) so no later walker overflows

    def __init__(self, file: str):
        super().__init__(visit_tokens=False)
        self.file = file
        self.depths: dict[int, int] = {}

    def _nest(self, node, children):
        depth = 1 + max((self.depths.get(id(c), 0) for c in children), default=0)
        if depth > self.MAX_DEPTH:
            raise DiagnosticError([Diagnostic(
                Code.TOO_DEEP, f"expression nested more than {self.MAX_DEPTH} levels deep", node.span)])
        self.depths[id(node)] = depth
        return node

    # ------------------------------------------------------------------ spans

    def span(self, meta: Meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.file, 1, 1, 1, 2)
        return Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def tspan(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + 1)

    # ------------------------------------------------------------------ top level

    def start(self, meta, items):
        return surface.Module(tuple(items), file=self.file)

    def import_module(self, meta, ch):
        path, alias = ch
        return surface.ImportStmt(path, str(alias) if alias else None, None, self.span(meta))

    def import_from(self, meta, ch):
        return surface.ImportStmt(ch[0], None, tuple(ch[1:]), self.span(meta))

    def import_name(self, meta, ch):
        name, alias = ch
        return (str(name), str(alias) if alias else None)

    def dotted_name(self, meta, ch):
        return tuple(str(c) for c in ch)

    def let_stmt(self, meta, ch):
        return surface.LetStmt(str(ch[0]), ch[1], self.span(meta))

    def model_block(self, meta, ch):
        src = ch[0]
        return surface.ModelBlock(tuple(ch[1:]), self.span(meta), src[0] if src else None, src[1] if src else NO_SPAN)

    def model_source(self, meta, ch):
        return (str(ch[0])[1:-1], self.span(meta))

    def sub_block(self, meta, ch):
        return surface.SubBlock(str(ch[0]), tuple(ch[1:]), self.span(meta))

    def group_block(self, meta, ch):
        return surface.SubBlock("group", tuple(ch[1:]), self.span(meta), name=str(ch[0]))

    def mesh_block(self, meta, ch):
        return surface.MeshBlock(tuple(ch), self.span(meta))

    def axis_decl(self, meta, ch):
        name, size, link = ch
        return surface.AxisDecl(str(name), size, str(link) if link else None, self.span(meta))

    # ------------------------------------------------------------------ strategies

    def strategy_short(self, meta, ch):
        name, params, axes, rhs = ch
        common = dict(
            name=str(name),
            params=params or (),
            axes=axes or (),
            span=self.span(meta),
        )
        if isinstance(rhs, surface.Shorthand):
            return surface.StrategyDef(shorthand=rhs, **common)
        return surface.StrategyDef(extends=rhs, **common)

    def strategy_block(self, meta, ch):
        name, params, axes, extends, *body = ch
        return surface.StrategyDef(
            name=str(name),
            params=params or (),
            axes=axes or (),
            extends=extends,
            body=tuple(body),
            span=self.span(meta),
        )

    def param_list(self, meta, ch):
        return tuple(ch)

    def param(self, meta, ch):
        default = ch[1] if len(ch) > 1 else None
        return surface.Param(str(ch[0]), default, self.span(meta))

    def over_axes(self, meta, ch):
        return tuple(str(c) for c in ch)

    def extends(self, meta, ch):
        return ch[0]

    def rhs_ref(self, meta, ch):
        return surface.StrategyRef(ch[0], (), self.span(meta))

    def rhs_call(self, meta, ch):
        path, *args = ch
        modes = [a for a in args if isinstance(a, surface.ModeRef)]
        kwargs = [a for a in args if isinstance(a, surface.Kwarg)]
        if modes and kwargs:
            raise DiagnosticError([Diagnostic(
                Code.BAD_TUPLE, "a placement shorthand takes modes only, not named arguments", kwargs[0].span)])
        if modes:
            if len(path) != 1:
                raise DiagnosticError([Diagnostic(
                    Code.BAD_TUPLE, "a shorthand's prefix must be a role such as 'data' or 'tensor'", self.span(meta))])
            return surface.Shorthand(path[0], tuple(modes), self.span(meta))
        return surface.StrategyRef(path, tuple(kwargs), self.span(meta))

    def rhs_tuple(self, meta, ch):
        for a in ch:
            if isinstance(a, surface.Kwarg):
                raise DiagnosticError([Diagnostic(
                    Code.BAD_TUPLE, "a placement shorthand takes modes only, not named arguments", a.span)])
        return surface.Shorthand(None, tuple(ch), self.span(meta))

    def mode(self, meta, ch):
        name, star = ch
        return surface.ModeRef(str(name), star is not None, self.span(meta))

    # ------------------------------------------------------------------ plans and block items

    def plan_def(self, meta, ch):
        name, extends, *body = ch
        return surface.PlanDef(str(name), extends, tuple(body), self.span(meta))

    def prop(self, meta, ch):
        return surface.Prop(str(ch[0]), ch[1], self.span(meta))

    def flag(self, meta, ch):
        return surface.Prop(str(ch[0]), None, self.span(meta))

    def entry(self, meta, ch):
        lhs, rhs, options = ch
        return surface.Entry(lhs, rhs, options or (), self.span(meta))

    def lhs_one(self, meta, ch):
        return (str(ch[0]),)

    def lhs_many(self, meta, ch):
        return tuple(str(c) for c in ch)

    def rhs_name(self, meta, ch):
        path, star = ch
        if star is not None:
            if len(path) != 1:
                raise DiagnosticError([Diagnostic(
                    Code.UNKNOWN_MODE, f"unknown mode '{'.'.join(path)}*'", self.span(meta))])
            return surface.ModeRef(path[0], True, self.span(meta))
        return surface.StrategyRef(path, (), self.span(meta))

    def options(self, meta, ch):
        return tuple(ch)

    def mode_map(self, meta, ch):
        return surface.ModeMap(tuple(ch), self.span(meta))

    def map_entry(self, meta, ch):
        return surface.MapEntry(str(ch[0]), ch[1], self.span(meta))

    def use_stmt(self, meta, ch):
        return surface.Use(ch[0], self.span(meta))

    def strategy_ref(self, meta, ch):
        path, options = ch
        return surface.StrategyRef(path, options or (), self.span(meta))

    def override_stmt(self, meta, ch):
        target, group, verb, axes, ranks, by = ch
        sizes = by.sizes if isinstance(by, _Sizes) else None
        sets = ranks.sets if isinstance(ranks, _Sets) else None
        return surface.OverrideStmt(
            str(target), str(group) if group else None, str(verb), axes, None if sizes else by, self.span(meta),
            None if sets else ranks, sizes, sets)

    def unobserved_stmt(self, meta, ch):
        return surface.Unobserved(str(ch[0])[1:-1], self.span(meta))

    def over_clause(self, meta, ch):
        return tuple(str(c) for c in ch if c is not None)

    def by_clause(self, meta, ch):
        return ch[0]

    def ranks_clause(self, meta, ch):
        return tuple(ch)

    def by_sizes(self, meta, ch):
        return _Sizes(tuple(ch))

    def ranks_sets(self, meta, ch):
        return _Sets(tuple(ch))

    def rank_set(self, meta, ch):
        return tuple(ch)

    # ------------------------------------------------------------------ questions

    def assert_stmt(self, meta, ch):
        label, test = ch
        return surface.AssertStmt(test, str(label)[1:-1] if label else None, self.span(meta))

    def claim_stmt(self, meta, ch):
        label, test, expect = ch
        return surface.ClaimStmt(test, str(label)[1:-1] if label else None, self.span(meta), expect)

    def expect_clause(self, meta, ch):
        return surface.Expect(tuple(c for c in ch if c is not None), self.span(meta))

    def pin(self, meta, ch):
        return (str(ch[0]), ch[1])

    def comparison(self, meta, ch):
        left, op, right = ch
        return surface.Compare(str(op), left, right, self.span(meta))

    # ------------------------------------------------------------------ expressions

    def _bin(self, op, meta, ch):
        return self._nest(surface.BinOp(op, ch[0], ch[-1], self.span(meta)), (ch[0], ch[-1]))

    def add(self, meta, ch):
        return self._bin("+", meta, ch)

    def sub(self, meta, ch):
        return self._bin("-", meta, ch)

    def mul(self, meta, ch):
        return self._bin("*", meta, ch)

    def div(self, meta, ch):
        return self._bin("/", meta, ch)

    def pow(self, meta, ch):
        return self._bin("^", meta, ch)

    def neg(self, meta, ch):
        return self._nest(surface.Neg(ch[0], self.span(meta)), ch)

    def number(self, meta, ch):
        tok, unit = ch
        try:
            value = read_number(str(tok))
        except ValueError:
            raise DiagnosticError([Diagnostic(
                Code.BAD_NUMBER, f"cannot read '{tok}' as an exact number", self.tspan(tok))]) from None
        return surface.Num(value, str(unit) if unit else None, str(tok), self.span(meta))

    def name(self, meta, ch):
        return surface.Name(str(ch[0]), self.span(meta))

    def true(self, meta, ch):
        return surface.Bool(True, self.span(meta))

    def false(self, meta, ch):
        return surface.Bool(False, self.span(meta))

    def call(self, meta, ch):
        func, *args = ch
        args = [a for a in args if a is not None]
        pos = tuple(a for a in args if not isinstance(a, surface.Kwarg))
        kw = tuple(a for a in args if isinstance(a, surface.Kwarg))
        return self._nest(surface.Call(str(func), pos, kw, self.span(meta)), pos + tuple(k.value for k in kw))

    def kwarg(self, meta, ch):
        return surface.Kwarg(str(ch[0]), ch[1], self.span(meta))
