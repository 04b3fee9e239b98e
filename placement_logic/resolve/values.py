"""Values and units: surface expressions -> exact ``ir.Value`` terms with a dimension.

Numbers stay exact fractions; byte units (``GB``, ``GiB``, ...) are folded into the
constant and mark it as bytes. Names resolve to let bindings and mesh axes; cost queries
(``memory(p)``, ...) are allowed in assert and claim statements only. Every unit or type
error becomes a diagnostic and the expression resolves to None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from ..diagnostics import NO_SPAN, Code, Span, did_you_mean
from ..frontend import surface
from ..ir.walker import MAX_BITS, TooLarge, fold_strict
from .context import Context

BYTE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

STATE_NAMES = tuple(s.value for s in ir.STATES)
QUERY_KINDS = {
    "memory": "state",
    "host_memory": None,
    "model_state": None,
    "comm": "axis",
    "volume": "axis",
    "params": "group",  # Ψ, or one parameter group's count (a plain count, not bytes)
    "active_params": None,  # parameters one token uses (MoE: top_k of the routed experts)
}
COUNT_QUERIES = ("params", "active_params")


@dataclass
class Values:
    """The names an expression can refer to, and the values resolved so far."""

    cx: Context
    lets: dict[str, surface.LetStmt] = field(default_factory=dict)
    values: dict[str, ir.Value] = field(default_factory=dict)
    dims: dict[str, ir.Dim] = field(default_factory=dict)
    axes: dict[str, ir.Axis] = field(default_factory=dict)
    plans: dict[str, surface.PlanDef] = field(default_factory=dict)  # for cost queries
    groups: set[str] = field(default_factory=set)  # the model block's `group` names (overrides may name them)
    group_names: tuple[str, ...] = ()  # every parameter group of the model (for params(plan, group))
    loss_terms: dict[str, str] = field(default_factory=dict)  # the model's loss terms -> objective (ir.losses)
    _depth: int = 0  # nesting of ``expr`` calls: a whole expression is folded at depth 0

    def declare(self, name: str, span: Span) -> bool:
        if name in self.lets or name in self.axes:
            self.cx.error(Code.DUPLICATE_DEFINITION, f"'{name}' is defined twice", span)
            return False
        return True

    def let_value(self, name: str, stack: list[str]) -> ir.Value | None:
        if name in self.values:
            return self.values[name]
        if name in stack:
            cycle = " -> ".join(stack[stack.index(name):] + [name])
            self.cx.error(Code.DEFINITION_CYCLE, f"definitions refer to each other in a cycle: {cycle}", self.lets[name].span)
            return None
        let = self.lets[name]
        result = self.expr(let.value, env={}, stack=stack + [name])
        if result is None:
            return None
        value, dim = result
        self.values[name] = value
        self.dims[name] = dim
        return value

    def expr(self, e: surface.Expr, env: dict[str, ir.Value], stack: list[str] | None = None,
             allow_queries: bool = False) -> tuple[ir.Value, ir.Dim] | None:
        """Resolve and type an expression; None after reporting an error. A whole expression
        (not each of its parts) is folded through the values known so far: one that divides
        by zero (PL204) or is too large to hold exactly (PL209), however the division or the
        size is reached (a let, a folded constant), is an error."""
        self._depth += 1
        try:
            result = self._expr(e, env, stack, allow_queries)
        finally:
            self._depth -= 1
        if result is not None and self._depth == 0:
            try:
                fold_strict(result[0], {**self.values, **env})
            except ZeroDivisionError:
                self.cx.error(Code.DIVISION_BY_ZERO, f"division by zero: {ir.show(result[0])} divides by zero with the values "
                              "given", getattr(e, "span", NO_SPAN))
                return None
            except TooLarge:
                self.cx.error(Code.NUMBER_TOO_LARGE, f"a number too large to hold exactly (over {MAX_BITS:,} bits): "
                              f"{ir.show(result[0])}", getattr(e, "span", NO_SPAN))
                return None
        return result

    def _expr(self, e: surface.Expr, env: dict[str, ir.Value], stack: list[str] | None = None,
              allow_queries: bool = False) -> tuple[ir.Value, ir.Dim] | None:
        stack = stack or []
        error = self.cx.error
        if isinstance(e, surface.Num):
            if e.unit is None:
                return ir.Const(e.value, e.span), ir.Dim.COUNT
            if e.unit not in BYTE_UNITS:
                error(Code.UNKNOWN_UNIT, f"unknown unit '{e.unit}'", e.span)
                return None
            return ir.Const(e.value * BYTE_UNITS[e.unit], e.span), ir.Dim.BYTES
        if isinstance(e, surface.Name):
            if e.id in env:
                return env[e.id], ir.Dim.COUNT
            if e.id in self.axes:
                return ir.Sym(e.id, e.span), ir.Dim.COUNT
            if e.id in self.lets:
                if self.let_value(e.id, stack) is None and e.id not in self.values:
                    return None
                return ir.Sym(e.id, e.span), self.dims.get(e.id, ir.Dim.COUNT)
            error(Code.UNDEFINED_NAME, f"undefined name '{e.id}'", e.span,
                  did_you_mean(e.id, list(self.lets) + list(self.axes) + list(env)))
            return None
        if isinstance(e, surface.Bool):
            error(Code.BAD_PROPERTY_VALUE, f"'{'true' if e.value else 'false'}' is not a number", e.span)
            return None
        if isinstance(e, surface.Neg):
            r = self.expr(e.operand, env, stack, allow_queries)
            return None if r is None else (ir.Op("neg", (r[0],), e.span), r[1])
        if isinstance(e, surface.BinOp):
            return self._binop(e, env, stack, allow_queries)
        if isinstance(e, surface.Call):
            if allow_queries and e.func in QUERY_KINDS:
                return self._query(e)
            if e.func in QUERY_KINDS:
                error(Code.UNKNOWN_FUNCTION, f"'{e.func}(...)' is only allowed in assert and claim statements", e.span)
            else:
                error(Code.UNKNOWN_FUNCTION, f"unknown function '{e.func}'", e.span,
                      did_you_mean(e.func, QUERY_KINDS) if allow_queries else ())
            return None
        raise TypeError(f"unexpected expression node {type(e).__name__}")

    def _binop(self, e: surface.BinOp, env, stack, allow_queries):
        left = self.expr(e.left, env, stack, allow_queries)
        right = self.expr(e.right, env, stack, allow_queries)
        if left is None or right is None:
            return None
        error = self.cx.error
        (lv, ld), (rv, rd) = left, right
        B, C = ir.Dim.BYTES, ir.Dim.COUNT
        if e.op in "+-":
            if ld is not rd:
                error(Code.UNIT_MISMATCH, f"cannot {'add' if e.op == '+' else 'subtract'} bytes and a plain count",
                      e.span, ("give both sides a byte unit, or neither",))
                return None
            dim = ld
        elif e.op == "*":
            if ld is B and rd is B:
                error(Code.BYTES_SQUARED, "bytes times bytes has no meaning here", e.span)
                return None
            dim = B if B in (ld, rd) else C
        elif e.op == "/":
            if ld is C and rd is B:
                error(Code.BYTES_SQUARED, "a count divided by bytes has no meaning here", e.span)
                return None
            if isinstance(rv, ir.Const) and rv.value == 0:
                error(Code.DIVISION_BY_ZERO, "division by zero", e.right.span)
                return None
            dim = C if ld is rd else B
        elif e.op == "^":
            if rd is B:
                error(Code.UNIT_NOT_ALLOWED, "an exponent cannot carry a byte unit", e.right.span)
                return None
            if not (isinstance(rv, ir.Const) and rv.value.denominator == 1):
                error(Code.BAD_EXPONENT, "an exponent must be a whole-number constant", e.right.span)
                return None
            if abs(rv.value) > 64:
                error(Code.BAD_EXPONENT, "an exponent must be between -64 and 64", e.right.span)
                return None
            if ld is B and rv.value != 1:
                error(Code.BYTES_SQUARED, "bytes raised to a power has no meaning here", e.span)
                return None
            if isinstance(lv, ir.Const) and lv.value == 0 and rv.value < 0:
                error(Code.DIVISION_BY_ZERO, "division by zero", e.span)
                return None
            dim = ld
        else:  # pragma: no cover - the grammar has no other operators
            raise ValueError(e.op)
        return ir.Op(e.op, (lv, rv), e.span), dim

    def _query(self, e: surface.Call) -> tuple[ir.Value, ir.Dim] | None:
        kind = e.func
        error = self.cx.error
        if e.kwargs:
            error(Code.BAD_ARGUMENTS, f"'{kind}' takes no named arguments", e.kwargs[0].span)
            return None
        second = QUERY_KINDS[kind]
        max_args = 2 if second else 1
        if not (1 <= len(e.args) <= max_args):
            what = f"a plan and optionally a {second}" if second else "one plan"
            error(Code.BAD_ARGUMENTS, f"'{kind}' takes {what}", e.span)
            return None
        plan_arg = e.args[0]
        if not isinstance(plan_arg, surface.Name):
            error(Code.BAD_ARGUMENTS, f"the first argument of '{kind}' must be a plan name", plan_arg.span)
            return None
        if plan_arg.id not in self.plans:
            error(Code.NOT_A_PLAN, f"'{plan_arg.id}' is not a plan", plan_arg.span,
                  did_you_mean(plan_arg.id, self.plans))
            return None
        arg = None
        if len(e.args) == 2:
            a = e.args[1]
            if second == "state":
                allowed = STATE_NAMES + ("transient", "total")
            elif second == "group":
                allowed = tuple(self.group_names)
            else:
                allowed = tuple(self.axes)
            if not isinstance(a, surface.Name) or a.id not in allowed:
                shown = a.id if isinstance(a, surface.Name) else "this argument"
                code = {"state": Code.UNKNOWN_STATE, "group": Code.BAD_OVERRIDE}.get(second, Code.UNDEFINED_AXIS)
                error(code, f"'{shown}' is not a {second} of plan '{plan_arg.id}'", a.span,
                      did_you_mean(shown, allowed))
                return None
            arg = a.id
        return ir.Query(kind, plan_arg.id, arg, e.span), ir.Dim.COUNT if kind in COUNT_QUERIES else ir.Dim.BYTES

    def count(self, e: surface.Expr, env: dict[str, ir.Value], what: str) -> ir.Value | None:
        """An expression that must be a plain count."""
        r = self.expr(e, env)
        if r is None:
            return None
        if r[1] is ir.Dim.BYTES:
            self.cx.error(Code.UNIT_NOT_ALLOWED, f"{what} is a plain count; a byte unit does not fit here", e.span)
            return None
        return r[0]

    def word(self, e, allowed: tuple[str, ...], what: str) -> str | None:
        """A bare name that must be one of ``allowed``."""
        if isinstance(e, surface.Name) and e.id in allowed:
            return e.id
        shown = e.id if isinstance(e, surface.Name) else None
        span = getattr(e, "span", None) or Span.point(self.cx.file, 1, 1)
        notes = did_you_mean(shown, allowed) if shown else ()
        self.cx.error(Code.BAD_PROPERTY_VALUE, f"{what} must be one of {', '.join(allowed)}", span, notes)
        return None

    def flag_value(self, prop: surface.Prop) -> bool | None:
        """A property that is true or false; a bare key means true."""
        if prop.value is None:
            return True
        if isinstance(prop.value, surface.Bool):
            return prop.value.value
        self.cx.error(Code.BAD_PROPERTY_VALUE, f"'{prop.key}' is true or false", prop.span)
        return None
