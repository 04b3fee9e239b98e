"""Obligations over closed forms: a relation between two sympy expressions, for all values.

Input: sympy expressions from the cost engine (or a claim), the relation between them
and the domain of each symbol (positive reals, or integers from a lower bound). Output:
an ``Obligation`` whose query is the negation of ``lhs op rhs`` under the domain, and a
replay that evaluates both sides exactly (sympy Rationals) at a solver model.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sympy
import z3

from ..costs.symbolic import symbol
from ..solver.query import Obligation, Query, Verdict
from ..solver.tosmt import as_expr, denominators, to_z3

OPS = {
    "==": (lambda a, b: a == b),
    "!=": (lambda a, b: a != b),
    "<": (lambda a, b: a < b),
    "<=": (lambda a, b: a <= b),
    ">": (lambda a, b: a > b),
    ">=": (lambda a, b: a >= b),
}


@dataclass(frozen=True)
class Domain:
    """Where a symbol ranges: an integer >= ``low`` or a real > ``low``."""

    integer: bool
    low: Fraction

    def text(self, name: str) -> str:
        return f"{name} ∈ ℤ, {name} ≥ {self.low}" if self.integer else f"{name} > {self.low}"


def POS() -> Domain:
    return Domain(False, Fraction(0))


def INT(low: int = 1) -> Domain:
    return Domain(True, Fraction(low))


def model_value(model: Any, term: Any) -> Fraction | str:
    """An exact Fraction for a rational model value, else the solver's decimal text."""
    v = model.evaluate(term, model_completion=True)
    if z3.is_int_value(v):
        return Fraction(v.as_long())
    if z3.is_rational_value(v):
        return Fraction(v.numerator_as_long(), v.denominator_as_long())
    if z3.is_algebraic_value(v):
        return v.as_decimal(12)
    return str(v)


def _text(x: Fraction | str | sympy.Expr) -> str:
    if isinstance(x, Fraction):
        return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
    return str(x)


def _variables(names: list[str], domain: dict[str, Domain], ctx: z3.Context) -> tuple[dict, list]:
    """Each symbol a z3 integer or real of ``ctx`` and the bounds its domain holds it to."""
    env = {n: (z3.Int(n, ctx) if domain[n].integer else z3.Real(n, ctx)) for n in names}
    cons = []
    for n in names:
        d = domain[n]
        low = z3.RealVal(f"{d.low.numerator}/{d.low.denominator}", ctx)
        cons.append(env[n] >= low if d.integer else env[n] > low)
    return env, cons


def _witness(model: Any, env: dict, names: list[str]) -> tuple[list[tuple[str, str]], dict | None]:
    """The model's value of each symbol, as text rows, and as a substitution (None: an irrational value)."""
    vals = {n: model_value(model, env[n]) for n in names}
    return [(n, _text(v)) for n, v in vals.items()], _subs(vals)


def relation(key: str, theorem: str, name: str, statement: str, lhs: sympy.Expr, rhs: sympy.Expr,
             op: str, domain: dict[str, Domain], source: str,
             detail: tuple[tuple[str, str], ...] = (), expect: Verdict = Verdict.PROVED,
             premise: sympy.Expr | None = None) -> Obligation:
    """``∀ symbols in domain (and premise): lhs op rhs`` as an obligation."""
    lhs, rhs = as_expr(lhs), as_expr(rhs)
    names = sorted(set(domain))
    missing = {s.name for s in (lhs.free_symbols | rhs.free_symbols)} - set(names)
    if missing:
        raise ValueError(f"symbols without a domain: {sorted(missing)}")

    def build(ctx: z3.Context) -> Query:
        env, cons = _variables(names, domain, ctx)
        for den in denominators(lhs) + denominators(rhs):
            cons.append(to_z3(den, env, ctx) != 0)
        if premise is not None:
            cons.append(_rel(premise, env, ctx))
        cons.append(z3.Not(OPS[op](to_z3(lhs, env, ctx), to_z3(rhs, env, ctx))))

        def explain(model: Any) -> tuple[tuple[str, str], ...]:
            rows, sub = _witness(model, env, names)
            if sub is not None:
                rows.append(("left side", _text(lhs.xreplace(sub))))
                rows.append(("right side", _text(rhs.xreplace(sub))))
            return tuple(rows)

        def replay(model: Any) -> str | None:
            sub = _witness(model, env, names)[1]
            if sub is None:
                return None  # irrational witness: shown as the solver gave it
            a, b = lhs.xreplace(sub), rhs.xreplace(sub)
            if OPS[op](a, b) is sympy.true or OPS[op](a, b) is True:
                return f"at the witness, {a} {op} {b} holds: the counterexample does not replay"
            return None

        return Query(cons, explain, replay)

    return Obligation(key, theorem, name, statement, expect, build, source, detail)


def equivalence(key: str, theorem: str, name: str, statement: str, claim: sympy.Basic, condition: sympy.Basic,
                domain: dict[str, Domain], source: str, detail: tuple[tuple[str, str], ...] = ()) -> Obligation:
    """``∀ symbols in domain (where the claim is defined): claim ⇔ condition``."""
    names = sorted(set(domain))

    def build(ctx: z3.Context) -> Query:
        env, cons = _variables(names, domain, ctx)
        for side in (claim.args if isinstance(claim, sympy.Rel) else ()):
            for den in denominators(side):
                cons.append(to_z3(den, env, ctx) != 0)
        cons.append(_rel(claim, env, ctx) != _rel(condition, env, ctx))

        def explain(model: Any) -> tuple[tuple[str, str], ...]:
            rows, sub = _witness(model, env, names)
            if sub is not None:
                rows.append(("claim", str(claim.xreplace(sub))))
                rows.append(("condition", str(condition.xreplace(sub))))
            return tuple(rows)

        def replay(model: Any) -> str | None:
            sub = _witness(model, env, names)[1]
            if sub is None:
                return None
            if bool(claim.xreplace(sub)) == bool(condition.xreplace(sub)):
                return "at the witness the claim and the condition agree: the counterexample does not replay"
            return None

        return Query(cons, explain, replay)

    return Obligation(key, theorem, name, statement, Verdict.PROVED, build, source, detail)


def _subs(vals: dict[str, Fraction | str]) -> dict | None:
    if not all(isinstance(v, Fraction) for v in vals.values()):
        return None
    return {symbol(n): sympy.Rational(v.numerator, v.denominator) for n, v in vals.items()}


def _rel(expr: sympy.Expr, env: dict, ctx: z3.Context) -> Any:
    """A sympy relational or boolean combination as a z3 formula."""
    if isinstance(expr, sympy.And):
        return z3.And([_rel(a, env, ctx) for a in expr.args])
    if isinstance(expr, sympy.Or):
        return z3.Or([_rel(a, env, ctx) for a in expr.args])
    if isinstance(expr, sympy.Not):
        return z3.Not(_rel(expr.args[0], env, ctx))
    if expr is sympy.true:
        return z3.BoolVal(True, ctx)
    if expr is sympy.false:
        return z3.BoolVal(False, ctx)
    ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">="}
    for cls, op in ops.items():
        if isinstance(expr, cls):
            return OPS[op](to_z3(expr.lhs, env, ctx), to_z3(expr.rhs, env, ctx))
    raise ValueError(f"not a condition: {expr}")


def as_z3_condition(expr: sympy.Expr, env: dict, ctx: z3.Context) -> Any:
    return _rel(expr, env, ctx)
