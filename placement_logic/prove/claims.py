"""Claims of a spec as obligations: the exact condition under which each one holds.

Input: an ``ir.Spec`` whose ``questions`` hold ``claim`` statements (cost queries over
its plans). Output: per claim a ``ClaimResult`` (always / never / conditional, the
condition, the truth value at the spec's bound values) and the obligations that confirm
the condition with the solvers: ``∀ symbols in their domain: (claim) ⇔ (condition)``.

The condition is derived with sympy from the cost engine's closed forms, with every
symbol free (mesh axes are integers ≥ 1, other symbols positive reals): an equation is
solved for one symbol (mesh axes first). When that leaves symbols on both sides, or for
an inequality over several symbols, each symbol in turn is solved for with the others at
their bound values. The solvers then check the condition is exact, so a wrong derivation
is refuted, never reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import costs, ir
from ..costs.budget import OutOfTime, bounded

# what a sympy step may raise on an expression it cannot handle: the step is then undecided
_UNDECIDED = (NotImplementedError, ValueError, TypeError, OutOfTime, sympy.polys.polyerrors.BasePolynomialError)
from ..costs.symbolic import resolve_bindings, symbol
from ..solver.query import Obligation
from ..solver.tosmt import as_expr
from .report import ClaimHolds, ClaimResult
from .symbolic_ob import INT, POS, Domain, equivalence

CLAIMS = "Claims"
_REL = {"==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge}
MAX_CONDITIONS = 3


@dataclass(frozen=True)
class ClaimAnalysis:
    result: ClaimResult
    obligations: tuple[Obligation, ...]


def _domain(spec: ir.Spec, names: set[str]) -> dict[str, Domain]:
    axes = set(spec.mesh.names) if spec.mesh else set()
    return {n: INT(1) if n in axes else POS() for n in names}


def _order(spec: ir.Spec, names: set[str], lets_first: bool = False) -> list[str]:
    axes = list(spec.mesh.names) if spec.mesh else []
    lets = [n for n, _ in spec.bindings if n not in axes]
    ordered = [n for n in (lets + axes if lets_first else axes + lets) if n in names]
    return ordered + sorted(names - set(ordered))


def _text(expr) -> str:
    return sympy.sstr(expr).replace("==", "=").replace("Eq(", "(")


def _cond_text(cond) -> str:
    if isinstance(cond, sympy.Eq):
        return f"{cond.lhs} = {cond.rhs}"
    if isinstance(cond, sympy.Or):
        return " or ".join(_cond_text(a) for a in cond.args)
    if isinstance(cond, sympy.And):
        return " and ".join(_cond_text(a) for a in cond.args)
    return sympy.sstr(cond)


def _strip_infinite(cond):
    """Drop the trivially true bounds (s < oo, s > 0) that sympy adds to a solution set."""
    if isinstance(cond, (sympy.And, sympy.Or)):
        args = [_strip_infinite(a) for a in cond.args]
        return cond.func(*args)
    if isinstance(cond, sympy.Rel) and (cond.lhs.has(sympy.oo, -sympy.oo) or cond.rhs.has(sympy.oo, -sympy.oo)):
        return sympy.true
    return cond


def _univariate(rel, s: sympy.Symbol, dom: Domain):
    """The solution set of a relation in ``s`` within its domain, as a condition (or None).

    None when sympy cannot solve it or the solutions depend on other symbols.
    """
    low = sympy.Rational(dom.low.numerator, dom.low.denominator)
    interval = sympy.Interval(low, sympy.oo) if dom.integer else sympy.Interval.open(low, sympy.oo)
    try:
        if isinstance(rel, sympy.Eq):
            free = sympy.Symbol(f"{s.name}_free")  # no sign assumption: solve drops no root
            num = sympy.numer(sympy.together(rel.lhs - rel.rhs)).xreplace({s: free})
            sols = [x.xreplace({free: s}) for x in bounded(lambda: sympy.solve(num, free))]
            if any(as_expr(x).free_symbols for x in sols):
                return None
            sols = [x for x in sols if x.is_real and x in interval and (x.is_integer or not dom.integer)]
            return sympy.Or(*[sympy.Eq(s, x) for x in sols]) if sols else sympy.false
        found = bounded(lambda: sympy.solveset(rel, s, domain=interval))
    except _UNDECIDED:
        return None
    if isinstance(found, (sympy.ConditionSet, sympy.ImageSet)):
        return None
    if found == sympy.S.EmptySet:
        return sympy.false
    if found == interval:
        return sympy.true
    return _strip_infinite(found.as_relational(s))


def _zero_set(num: sympy.Expr, spec: ir.Spec, names: set[str], domain: dict[str, Domain]):
    """Where a polynomial numerator vanishes: one equation per factor that can be zero."""
    try:
        _, factors = bounded(lambda: sympy.factor_list(sympy.expand(num)))
    except _UNDECIDED:
        return None
    parts = []
    for f, _mult in factors:
        if f.is_positive:  # a monomial in positive symbols is never zero
            continue
        for n in _order(spec, {x.name for x in f.free_symbols}):
            free = sympy.Symbol(f"{n}_free")
            try:
                sols = bounded(lambda f=f, free=free, n=n: sympy.solve(f.xreplace({symbol(n): free}), free))
            except _UNDECIDED:
                return None
            if len(sols) != 1:
                continue
            sol = sols[0]
            if sol.free_symbols:
                parts.append(sympy.Eq(symbol(n), sol))
            elif sol.is_real and sol >= domain[n].low and (sol.is_integer or not domain[n].integer) and (
                    sol > domain[n].low or domain[n].integer):
                parts.append(sympy.Eq(symbol(n), sol))
            break
        else:
            return None
    return sympy.Or(*parts) if parts else sympy.false


def _undefined(spec: ir.Spec, q: ir.Question, names: set[str], domain: dict[str, Domain]):
    """Where a divisor in the claim (e.g. comm(dp) in a ratio) is zero, as a condition."""
    parts = []
    for side in (q.left, q.right):
        for node in ir.walk(side):
            if isinstance(node, ir.Op) and node.op == "/":
                div = costs.value_of(spec, node.args[1])
                if div.free_symbols:
                    z = _zero_set(sympy.numer(sympy.together(div)), spec, names, domain)
                    if z is not None and z is not sympy.false:
                        parts.append(z)
    return sympy.Or(*parts) if parts else None


def analyse(spec: ir.Spec, q: ir.Question, index: int) -> ClaimAnalysis:
    label = q.label or f"claim {index + 1}"
    text = f"{ir.show(q.left)} {q.op} {ir.show(q.right)}"
    lhs, rhs = costs.value_of(spec, q.left), costs.value_of(spec, q.right)
    names = {s.name for s in (as_expr(lhs).free_symbols | as_expr(rhs).free_symbols)}
    domain = _domain(spec, names)
    values = resolve_bindings(spec.bindings)
    at = _REL[q.op](lhs.xreplace(values), rhs.xreplace(values))
    shown = ", ".join(f"{n} = {values[symbol(n)]}" for n in _order(spec, names) if symbol(n) in values)
    at_values = f"{'true' if at is sympy.true else 'false' if at is sympy.false else 'undecided'}" + (
        f" at {shown}" if shown else "")
    slug = f"claims/{_slug(spec.file)}-{index + 1}"
    theorem = f"{CLAIMS}: {spec.file}"
    undefined = _undefined(spec, q, names, domain)

    conditions: list[tuple[sympy.Basic, dict[str, Domain], dict, str]] = []  # cond, domain, fixed, note
    try:
        diff = bounded(lambda: sympy.factor(sympy.cancel(sympy.together(lhs - rhs))))
    except _UNDECIDED:
        diff = None  # undecided here: the per-symbol conditions below, or unknown
    if q.op == "==" and diff is not None and diff == 0:
        conditions.append((sympy.true, domain, {}, ""))
    elif q.op == "==":
        cond = _zero_set(sympy.numer(sympy.together(lhs - rhs)), spec, names, domain)
        if cond is not None:
            conditions.append((cond, domain, {}, ""))
    if not conditions:
        # Fall back: each symbol in turn (lets, then axes), the others at their bound values;
        # a symbol for which the claim holds nowhere in its domain gives no condition.
        for n in _order(spec, names, lets_first=True):
            fixed = {symbol(m): values[symbol(m)] for m in _order(spec, names) if m != n and symbol(m) in values}
            r1 = _REL[q.op](lhs.xreplace(fixed), rhs.xreplace(fixed))
            if r1 in (sympy.true, sympy.false):
                continue
            cond = _univariate(r1, symbol(n), domain[n])
            if cond is None or cond is sympy.false or as_expr(cond).free_symbols - {symbol(n)}:
                continue
            note = ", ".join(f"{k} = {v}" for k, v in fixed.items())
            conditions.append((cond, {n: domain[n]}, fixed, note))
            if len(conditions) >= MAX_CONDITIONS:
                break

    obligations = []
    parts = []
    for i, (cond, dom, fixed, note) in enumerate(conditions):
        l1, r1 = lhs.xreplace(fixed), rhs.xreplace(fixed)
        ctext = "always" if cond is sympy.true else "never" if cond is sympy.false else _cond_text(cond)
        where = f" (with {note})" if note else ""
        if undefined is not None and undefined is not sympy.false:
            where += f" (undefined where {_cond_text(undefined)}: a ratio's divisor is 0)"
            if not fixed:
                cond = sympy.Or(cond, undefined) if cond is not sympy.true else cond
        parts.append(ctext + where)
        dom_text = ", ".join(d.text(n) for n, d in sorted(dom.items()))
        obligations.append(equivalence(
            f"{slug}{'abcdefgh'[i] if len(conditions) > 1 else ''}", theorem,
            f"{label}: holds ⇔ {ctext}{where}",
            f"∀ {dom_text}: ({text}) ⇔ {ctext}{where}", _REL[q.op](l1, r1, evaluate=False), cond, dom,
            "cost engine: the claim's cost queries, symbols free",
            detail=(("closed form", f"{sympy.sstr(_simplified(l1))} {q.op} {sympy.sstr(_simplified(r1))}"),)))
    if not conditions:
        holds, condition = ClaimHolds.UNKNOWN, "no closed-form condition found"
    elif all(c is sympy.true for c, *_ in conditions):
        holds, condition = ClaimHolds.ALWAYS, "; ".join(p for p in parts if p != "always")
    elif all(c is sympy.false for c, *_ in conditions):
        holds, condition = ClaimHolds.NEVER, ""
    else:
        holds, condition = ClaimHolds.CONDITIONAL, "; ".join(parts)
    result = ClaimResult(spec.file, label, text, holds, condition, at_values, tuple(o.key for o in obligations))
    return ClaimAnalysis(result, tuple(obligations))


def _simplified(expr):
    """``expr`` simplified within the budget, or as it is."""
    try:
        return bounded(lambda: sympy.simplify(expr))
    except _UNDECIDED:
        return expr


def _slug(file: str) -> str:
    stem = file.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return "".join(c if c.isalnum() else "-" for c in stem).strip("-") or "spec"


def claim_analyses(spec: ir.Spec) -> list[ClaimAnalysis]:
    qs = [q for q in spec.questions if q.kind == "claim"]
    return [analyse(spec, q, i) for i, q in enumerate(qs)]

