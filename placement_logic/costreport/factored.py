"""``sympy.factor_terms`` of report formulas, each subformula factored once per process.

A report shows many formulas that share large parts (the step time is inside the throughput,
the MFU and the time per token; a stage's total is inside the peak). ``sympy.factor_terms``
walks each formula whole and re-evaluates every maximum and minimum it rebuilds (sympy's
search for an order between their arguments, from the assumptions); here the same walk is
made with its result stored per subformula, so a shared part is factored once, and a
maximum or minimum is rebuilt with ``extremum`` (sympy's evaluation, less the search where
the arguments are unordered), or, where one of two arguments is shown larger at every point
(``dominant``), is that argument (the order sympy's evaluation proves, in about 7 ms a
maximum, for every such maximum of every example's report: tests/test_factored.py). The walk is ``factor_terms``'s own (sympy 1.14's, default
flags: ``radical=False, clear=False, fraction=False, sign=True``), so the result is the same
expression (tests/test_factored.py compares it with ``sympy.factor_terms``)."""

from __future__ import annotations

import sympy
from sympy.core.exprtools import _factor_sum_int, gcd_terms
from sympy.core.mul import _keep_coeff
from sympy.utilities.iterables import iterable

from ..costs.extrema import dominant, unordered

_DONE: dict[sympy.Basic, sympy.Basic] = {}


def factored(expr: sympy.Expr) -> sympy.Expr:
    """``sympy.factor_terms(expr)``, from the per-process store of factored subformulas."""
    return _do(sympy.Add(expr))  # the formula itself, as a sympy expression


def _do(expr):
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        if iterable(expr):
            return type(expr)([_do(i) for i in expr])
        return expr
    out = _DONE.get(expr)
    if out is None:
        out = _DONE[expr] = _factor(expr)
    return out


def _factor(expr):
    """One step of ``factor_terms``'s ``do`` (sympy.core.exprtools), recursing through ``_do``."""
    if expr.is_Pow or expr.is_Function or iterable(expr) or not hasattr(expr, "args_cnc"):
        args = expr.args
        newargs = tuple([_do(i) for i in args])
        if newargs == args:
            return expr
        if isinstance(expr, (sympy.Max, sympy.Min)):
            return _extremum(expr.func, newargs)
        if isinstance(expr, sympy.Piecewise):  # its cases as written: sympy's collapsing compares every pair of
            return sympy.Piecewise(*newargs, evaluate=False)  # conditions (minutes for the Ulysses share's 60)
        return expr.func(*newargs)
    if isinstance(expr, (sympy.Sum, sympy.Integral)):
        return _factor_sum_int(expr, radical=False, clear=False, fraction=False, sign=True)
    cont, p = expr.as_content_primitive(radical=False, clear=False)
    if p.is_Add:
        list_args = [_do(a) for a in sympy.Add.make_args(p)]
        # a common negative (if there), which gcd_terms does not remove
        if not any(a.as_coeff_Mul()[0].extract_multiplicatively(-1) is None for a in list_args):
            cont = -cont
            list_args = [-a for a in list_args]
        # exp(-(x+2)), which gcd_terms would change to exp(-x-2)
        special = {}
        for i, a in enumerate(list_args):
            b, e = a.as_base_exp()
            if e.is_Mul and e != sympy.Mul(*e.args):
                list_args[i] = sympy.Dummy()
                special[list_args[i]] = a
        # p rebuilt without regard to order, which gcd_terms fixes
        p = sympy.Add._from_args(list_args)
        p = gcd_terms(p, isprimitive=True, clear=False, fraction=False).xreplace(special)
    elif isinstance(p, (sympy.Max, sympy.Min)):
        p = _extremum(p.func, [_do(a) for a in p.args])
    elif p.args:  # a case analysis kept as written (above)
        p = p.func(*[_do(a) for a in p.args], **({"evaluate": False} if isinstance(p, sympy.Piecewise) else {}))
    return _keep_coeff(cont, p, clear=False, sign=True)


def _extremum(kind: type, args: list) -> sympy.Expr:
    """``kind(*args)`` (``sympy.Max`` or ``sympy.Min``) as the report prints it: unevaluated
    where the arguments are unordered (``extremum``); of two arguments one of which is larger
    at every positive point (``dominant``: their difference a sum of positive terms), the
    larger for a maximum and the smaller for a minimum, the value sympy's evaluation gives
    once it has proved that order; otherwise sympy's evaluation."""
    if unordered(args):
        return kind(*args, evaluate=False)
    i = dominant(args)
    if i is not None:
        return args[i] if kind is sympy.Max else args[1 - i]
    return kind(*args)
