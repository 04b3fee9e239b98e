"""Canonical formatting: syntax tree (+ the source's comments) -> canonical text.

One item per paragraph, two-space indentation, one property / entry per line, minimal
parentheses in expressions, numbers spelled as written. Comments are kept: a comment on
its own line stays before the item that follows it, a comment after code stays at the
end of that line. ``parse(format_module(m)) == m`` for every syntax tree ``m``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from . import surface

INDENT = "  "
PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "^": 4}
ATOM = 5


@dataclass(frozen=True)
class Comment:
    line: int
    text: str
    own_line: bool


def scan_comments(source: str) -> list[Comment]:
    """Every '#' comment outside a string literal, with its line. Lines are split where the
    parser splits them, at LF only (``str.splitlines`` would also split at CR, form feed, U+0085
    or U+2028 inside a string literal, and take the rest of that literal for a comment)."""
    found = []
    for number, line in enumerate(source.split("\n"), start=1):
        in_string = False
        for i, ch in enumerate(line):
            if ch == '"':
                in_string = not in_string
            elif ch == "#" and not in_string:
                found.append(Comment(number, line[i:].rstrip(), not line[:i].strip()))
                break
    return found


def number_text(n: surface.Num) -> str:
    if n.text:
        text = n.text
    else:
        text = fraction_literal(n.value)
    return f"{text} {n.unit}" if n.unit else text


def fraction_literal(value: Fraction) -> str:
    """A decimal literal for a Fraction whose decimal expansion terminates."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        raise ValueError(f"{value} has no finite decimal spelling")
    digits = max(twos, fives)
    scaled = value * 10**digits
    whole, frac = divmod(scaled.numerator, 10**digits)
    return f"{whole}.{frac:0{digits}d}".rstrip("0").rstrip(".")


def _prec(e: surface.Expr) -> int:
    if isinstance(e, surface.BinOp):
        return PREC[e.op]
    if isinstance(e, surface.Neg):
        return PREC["neg"]
    return ATOM


def expr(e: surface.Expr) -> str:
    """Format an expression with the fewest parentheses that keep its tree."""
    # iterative post-order to avoid deep recursion on long expressions
    out: dict[int, str] = {}
    stack: list[tuple[surface.Expr, bool]] = [(e, False)]
    while stack:
        node, done = stack.pop()
        if isinstance(node, surface.BinOp):
            if not done:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))
                continue
            left, right = out[id(node.left)], out[id(node.right)]
            p = PREC[node.op]
            if node.op == "^":
                if _prec(node.left) != ATOM:
                    left = f"({left})"
                if _prec(node.right) < PREC["neg"]:
                    right = f"({right})"
            else:
                if _prec(node.left) < p:
                    left = f"({left})"
                if _prec(node.right) <= p:
                    right = f"({right})"
            out[id(node)] = f"{left} {node.op} {right}"
        elif isinstance(node, surface.Neg):
            if not done:
                stack.append((node, True))
                stack.append((node.operand, False))
                continue
            inner = out[id(node.operand)]
            out[id(node)] = f"-({inner})" if _prec(node.operand) < PREC["neg"] else f"-{inner}"
        elif isinstance(node, surface.Call):
            if not done:
                stack.append((node, True))
                for a in reversed(node.args + tuple(k.value for k in node.kwargs)):
                    stack.append((a, False))
                continue
            parts = [out[id(a)] for a in node.args]
            parts += [f"{k.name} = {out[id(k.value)]}" for k in node.kwargs]
            out[id(node)] = f"{node.func}({', '.join(parts)})"
        elif isinstance(node, surface.Num):
            out[id(node)] = number_text(node)
        elif isinstance(node, surface.Name):
            out[id(node)] = node.id
        elif isinstance(node, surface.Bool):
            out[id(node)] = "true" if node.value else "false"
        else:  # pragma: no cover
            raise TypeError(type(node).__name__)
    return out[id(e)]


def kwargs(ks: tuple[surface.Kwarg, ...]) -> str:
    return ", ".join(f"{k.name} = {expr(k.value)}" for k in ks)


def mode_map(m: surface.ModeMap) -> str:
    return "{" + ", ".join(f"{e.key}: {e.value.text}" for e in m.entries) + "}"


def strategy_ref(r: surface.StrategyRef) -> str:
    return r.dotted + (f"({kwargs(r.args)})" if r.args else "")


def value(v) -> str:
    if isinstance(v, surface.ModeMap):
        return mode_map(v)
    return expr(v)


class Formatter:
    def __init__(self, comments: list[Comment]):
        self.comments = sorted(comments, key=lambda c: c.line)
        self.pos = 0
        self.lines: list[str] = []

    # -------------------------------------------------------------- comments

    def _leading(self, line: int, depth: int) -> None:
        while self.pos < len(self.comments) and self.comments[self.pos].line < line:
            c = self.comments[self.pos]
            self.lines.append(INDENT * depth + c.text)
            self.pos += 1

    def _trailing(self, first: int, last: int) -> str:
        """Trailing comments on lines first..last, consumed; own-line ones are left."""
        texts = []
        while self.pos < len(self.comments) and self.comments[self.pos].line <= last:
            c = self.comments[self.pos]
            if c.own_line or c.line < first:
                break
            texts.append(c.text)
            self.pos += 1
        return ("  " + " ".join(texts)) if texts else ""

    def emit(self, node, depth: int, text: str) -> None:
        span = getattr(node, "span", None)
        line = span.line if span is not None and span.file != "<builtin>" else None
        if line is not None:
            self._leading(line, depth)
            text += self._trailing(line, span.end_line)
        self.lines.append(INDENT * depth + text)

    def open_block(self, node, depth: int, header: str) -> None:
        span = node.span
        if span.file != "<builtin>":
            self._leading(span.line, depth)
            header += self._trailing(span.line, span.line)
        self.lines.append(INDENT * depth + header)

    def close_block(self, node, depth: int) -> None:
        span = node.span
        if span.file != "<builtin>":
            self._leading(span.end_line, depth + 1)
            tail = self._trailing(span.end_line, span.end_line)
        else:
            tail = ""
        self.lines.append(INDENT * depth + "}" + tail)

    # -------------------------------------------------------------- items

    def module(self, m: surface.Module) -> str:
        previous = None
        for item in m.items:
            kind = type(item)
            grouped = kind in (surface.ImportStmt, surface.LetStmt, surface.AssertStmt, surface.ClaimStmt) and kind is previous
            one_line_strategy = isinstance(item, surface.StrategyDef) and item.body is None
            if previous is not None and not grouped and not (
                    one_line_strategy and previous is surface.StrategyDef and self._last_was_short):
                self.lines.append("")
            self.item(item)
            previous = kind
            self._last_was_short = one_line_strategy
        self._leading(10**9, 0)
        text = "\n".join(self.lines).rstrip("\n")
        return text + "\n" if text else ""

    _last_was_short = False

    def item(self, item) -> None:
        if isinstance(item, surface.ImportStmt):
            mod = ".".join(item.module)
            if item.names is None:
                text = f"import {mod}" + (f" as {item.alias}" if item.alias else "")
            else:
                names = ", ".join(n + (f" as {a}" if a else "") for n, a in item.names)
                text = f"from {mod} import {names}"
            self.emit(item, 0, text)
        elif isinstance(item, surface.LetStmt):
            self.emit(item, 0, f"let {item.name} = {expr(item.value)}")
        elif isinstance(item, surface.ModelBlock) and item.source is not None and not item.items:
            self.emit(item, 0, f'model from "{item.source}"')  # nothing added: no block
        elif isinstance(item, surface.ModelBlock):
            head = f'model from "{item.source}" {{' if item.source is not None else "model {"
            self.open_block(item, 0, head)
            for sub in item.items:
                self.block_item(sub, 1)
            self.close_block(item, 0)
        elif isinstance(item, surface.MeshBlock):
            self.open_block(item, 0, "mesh {")
            for a in item.axes:
                self.emit(a, 1, f"{a.name} = {expr(a.size)}" + (f" @ {a.link}" if a.link else ""))
            self.close_block(item, 0)
        elif isinstance(item, surface.StrategyDef):
            self.strategy(item)
        elif isinstance(item, surface.PlanDef):
            header = f"plan {item.name}" + (f" extends {strategy_ref(item.extends)}" if item.extends else "")
            self.open_block(item, 0, header + " {")
            for sub in item.body:
                self.block_item(sub, 1)
            self.close_block(item, 0)
        elif isinstance(item, (surface.AssertStmt, surface.ClaimStmt)):
            word = "assert" if isinstance(item, surface.AssertStmt) else "claim"
            label = f'"{item.label}": ' if item.label is not None else ""
            t = item.test
            tail = ""
            if isinstance(item, surface.ClaimStmt) and item.expect is not None:
                tail = " expect fails"
                if item.expect.pins:
                    tail += " unless " + ", ".join(f"{n} = {expr(v)}" for n, v in item.expect.pins)
            self.emit(item, 0, f"{word} {label}{expr(t.left)} {t.op} {expr(t.right)}{tail}")
        else:  # pragma: no cover
            raise TypeError(type(item).__name__)

    def strategy(self, s: surface.StrategyDef) -> None:
        header = f"strategy {s.name}"
        if s.params:
            header += "(" + ", ".join(p.name + (f" = {expr(p.default)}" if p.default is not None else "")
                                      for p in s.params) + ")"
        if s.axes:
            header += f" over ({', '.join(s.axes)})"
        if s.body is None:
            if s.shorthand is not None:
                sh = s.shorthand
                rhs = (sh.role or "") + "(" + ", ".join(m.text for m in sh.modes) + ")"
            else:
                rhs = strategy_ref(s.extends)
            self.emit(s, 0, f"{header} = {rhs}")
            return
        if s.extends is not None:
            header += f" extends {strategy_ref(s.extends)}"
        self.open_block(s, 0, header + " {")
        for sub in s.body:
            self.block_item(sub, 1)
        self.close_block(s, 0)

    def block_item(self, node, depth: int) -> None:
        if isinstance(node, surface.Prop):
            text = node.key if node.value is None else f"{node.key} = {value(node.value)}"
            self.emit(node, depth, text)
        elif isinstance(node, surface.SubBlock):
            head = f"{node.key} {node.name}" if node.name is not None else node.key
            self.open_block(node, depth, f"{head} {{")
            for p in node.props:
                self.block_item(p, depth + 1)
            self.close_block(node, depth)
        elif isinstance(node, surface.Entry):
            lhs = node.lhs[0] if len(node.lhs) == 1 else "[" + ", ".join(node.lhs) + "]"
            rhs = node.rhs
            if isinstance(rhs, surface.ModeRef):
                r = rhs.text
            elif isinstance(rhs, surface.ModeMap):
                r = mode_map(rhs)
            else:
                r = rhs.dotted
            gap = "" if isinstance(rhs, surface.StrategyRef) else " "
            opts = f"{gap}({kwargs(node.options)})" if node.options else ""
            self.emit(node, depth, f"{lhs}: {r}{opts}")
        elif isinstance(node, surface.Use):
            self.emit(node, depth, f"use {strategy_ref(node.ref)}")
        elif isinstance(node, surface.OverrideStmt):
            text = f"override {node.target}" + (f"[{node.group}]" if node.group else "") + f": {node.verb}"
            if node.axes is not None:
                text += f" over ({', '.join(node.axes)})"
            if node.ranks is not None:
                text += f" ranks ({', '.join(expr(r) for r in node.ranks)})"
            if node.sets is not None:
                text += " ranks (" + ", ".join("[" + ", ".join(expr(r) for r in s) + "]" for s in node.sets) + ")"
            if node.by is not None:
                text += f" by {expr(node.by)}"
            if node.sizes is not None:
                text += f" by ({', '.join(expr(s) for s in node.sizes)})"
            self.emit(node, depth, text)
        elif isinstance(node, surface.Unobserved):
            self.emit(node, depth, f'unobserved "{node.text}"')
        else:  # pragma: no cover
            raise TypeError(type(node).__name__)


def format_module(module: surface.Module, source: str | None = None) -> str:
    """Canonical text of a module; pass the source to keep its comments."""
    return Formatter(scan_comments(source) if source else []).module(module)


def format_source(source: str, file: str = "<string>") -> str:
    from .parser import parse

    return format_module(parse(source, file), source)
