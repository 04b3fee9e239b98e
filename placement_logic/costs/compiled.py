"""Closed forms compiled to fast numeric functions, with an exact re-derivation beside them.

Input: named sympy expressions (any: a ``PlanCost``'s memory and communication through
``compile_costs``, or a caller's own through ``compile_exprs``) and the symbols that vary.
Output: a ``CompiledCost`` whose ``evaluate`` takes one array (or sequence) of values per
symbol and returns one float64 array per expression, and whose ``exact`` gives the same
expressions' exact values (``Fraction``) at one point, by substituting exact rationals.

Backends: with numpy importable the expressions are compiled once with ``sympy.lambdify``
to numpy (vectorised; ``Max``/``Min`` as ``maximum``/``minimum``, ``Piecewise`` as
``select``, ``ceiling`` as ``ceil``); without it, to Python's ``math`` module and evaluated
value by value (the same numbers, slower). numpy is not a core dependency.

Precision: the compiled values are IEEE float64. Each agrees with the exact value within
``tolerance(exact)`` = max(2⁻¹⁰ B, 2⁻⁴⁴ × |exact|), well under one byte below 2⁴³ B (8 TiB);
``agrees`` and ``CompiledCost.check`` state the comparison, and reports that need exact
bytes re-derive them (``exact``), never round a float and call it exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterable, Mapping, Sequence

import sympy

from .. import ir

ABSOLUTE_TOLERANCE = Fraction(1, 2**10)  # bytes
RELATIVE_TOLERANCE = Fraction(1, 2**44)


def numpy_or_none():
    """numpy when it can be imported, else None (the ``math`` fallback is used)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def tolerance(exact: Fraction) -> Fraction:
    """The largest difference between a compiled float and its exact value that is accepted."""
    return max(ABSOLUTE_TOLERANCE, RELATIVE_TOLERANCE * abs(Fraction(exact)))


def agrees(value: float, exact: Fraction) -> bool:
    """A compiled float and an exact value agree within ``tolerance`` (NaN and ±inf never do)."""
    if value != value or value in (float("inf"), float("-inf")):
        return False
    return abs(Fraction(value) - Fraction(exact)) <= tolerance(exact)


def as_expr(value) -> sympy.Expr:
    """A sympy expression, an int or a ``Fraction`` as sympy (never text: nothing is parsed)."""
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise TypeError(f"not an expression or an exact number: {value!r}")
    f = Fraction(value)
    return sympy.Rational(f.numerator, f.denominator)


def exact_value(expr: sympy.Expr, subs: Mapping[sympy.Symbol, sympy.Expr]) -> Fraction:
    """An expression's exact value once ``subs`` binds its symbols (``ValueError`` if one stays free)."""
    v = as_expr(expr).xreplace(dict(subs))
    if not v.is_Rational:
        v = v.doit()
    if not v.is_Rational:
        v = sympy.nsimplify(v)
    if not v.is_Rational:
        free = sorted(s.name for s in v.free_symbols)
        raise ValueError(f"not a number once bound: {v}" + (f" (unbound: {', '.join(free)})" if free else ""))
    return Fraction(int(v.p), int(v.q))


def _fraction(x) -> Fraction:
    if isinstance(x, sympy.Basic):
        x = Fraction(int(x.p), int(x.q))
    return Fraction(x) if not isinstance(x, float) else Fraction(x).limit_denominator(10**12)


@dataclass
class CompiledCost:
    """Named expressions compiled over ``symbols``: ``evaluate`` (floats) and ``exact`` (fractions)."""

    names: tuple[str, ...]
    exprs: tuple[sympy.Expr, ...]
    symbols: tuple[sympy.Symbol, ...]
    backend: str  # "numpy" | "math"
    _fn: Callable = field(repr=False)
    _exact_fn: object = field(default=None, repr=False)  # costs.exactfn.ExactFunction, built on first use

    @property
    def symbol_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.symbols)

    def _args(self, values: Mapping[str, object]) -> list:
        missing = [n for n in self.symbol_names if n not in values]
        extra = [n for n in values if n not in self.symbol_names]
        if missing or extra:
            raise TypeError(f"values for {', '.join(self.symbol_names) or 'no symbols'} expected"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unexpected {', '.join(extra)}" if extra else ""))
        return [values[n] for n in self.symbol_names]

    def evaluate(self, **values) -> dict[str, object]:
        """One float64 result per expression: numpy arrays (numpy backend) or lists of floats.

        Each argument is a scalar or a 1-D sequence; sequences must have one length."""
        args = self._args(values)
        np = numpy_or_none() if self.backend == "numpy" else None
        if np is not None:
            arrays = [np.asarray(a, dtype=np.float64) for a in args]
            shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
            with np.errstate(all="ignore"):
                out = self._fn(*arrays)
            return {n: np.broadcast_to(np.asarray(v, dtype=np.float64), shape).copy()
                    for n, v in zip(self.names, out)}
        columns = [list(a) if isinstance(a, (list, tuple)) or hasattr(a, "__len__") else None for a in args]
        length = max((len(c) for c in columns if c is not None), default=None)
        if length is None:
            return {n: float(v) for n, v in zip(self.names, self._fn(*(float(a) for a in args)))}
        if any(c is not None and len(c) != length for c in columns):
            raise ValueError("every sequence of values must have the same length")
        rows = [self._fn(*(float(c[i]) if c is not None else float(a) for c, a in zip(columns, args)))
                for i in range(length)]
        return {n: [float(r[k]) for r in rows] for k, n in enumerate(self.names)}

    def exact(self, **values) -> dict[str, Fraction]:
        """Every expression's exact value at one point (values exact: int, ``Fraction``, or a
        float read as the nearest fraction with a denominator up to 10¹²): by the exact-rational
        function compiled once (``costs.exactfn``), or by substitution in sympy where it has none."""
        args = [_fraction(v) for v in self._args(values)]
        if self._exact_fn is None:
            from .exactfn import compile_exact

            self._exact_fn = compile_exact(self.names, self.exprs, self.symbols) or False
        if self._exact_fn:
            try:
                return self._exact_fn(*args)
            except ValueError:
                pass  # a point the exact function cannot take: substitute in sympy
        subs = {s: sympy.Rational(v.numerator, v.denominator) for s, v in zip(self.symbols, args)}
        return {n: exact_value(e, subs) for n, e in zip(self.names, self.exprs)}

    def check(self, index: int, evaluated: Mapping[str, object], **values) -> list[str]:
        """Names whose compiled value at row ``index`` of ``evaluated`` disagrees with the exact
        value at ``values`` (empty: every one agrees within ``tolerance``)."""
        exact = self.exact(**values)
        return [n for n in self.names if not agrees(float(evaluated[n][index]), exact[n])]


def compile_exprs(exprs: Mapping[str, sympy.Expr], symbols: Sequence[sympy.Symbol | str],
                  backend: str | None = None) -> CompiledCost:
    """Compile named expressions over ``symbols`` (sympy symbols or spec names). Every free
    symbol of the expressions must be among them. ``backend``: "numpy", "math" or None (numpy
    when importable)."""
    from ..costs.symbolic import symbol

    syms = tuple(s if isinstance(s, sympy.Symbol) else symbol(s) for s in symbols)
    names = tuple(exprs)
    forms = tuple(as_expr(exprs[n]) for n in names)
    free = sorted({s.name for e in forms for s in e.free_symbols} - {s.name for s in syms})
    if free:
        raise ValueError(f"unbound symbols in the expressions: {', '.join(free)}")
    if backend is None:
        backend = "numpy" if numpy_or_none() is not None else "math"
    if backend == "numpy" and numpy_or_none() is None:
        raise ValueError("numpy is not installed")
    fn = sympy.lambdify(syms, list(forms), backend, cse=True)
    return CompiledCost(names, forms, syms, backend, fn)


def cost_exprs(pc, subs: Mapping[sympy.Symbol, sympy.Expr] | None = None) -> dict[str, sympy.Expr]:
    """A ``PlanCost``'s reported quantities by name, each with ``subs`` applied.

    ``memory.<state>`` (params, optimizer, grads, activations: the maximum over stages with a
    pipeline), ``memory.transient``, ``memory.total``, ``memory.host``, ``memory.model_state``;
    with pipeline stages ``stage.<first|last>.<state|transient|total>``; ``comm.total`` and
    ``volume.total`` (network, per device per step), ``comm.link.<link>`` per link class
    (``host`` transfers under their own), ``comm.group.<axes>`` per group of axes.
    """
    subs = dict(subs or {})
    mem, comm = pc.memory, pc.communication
    out: dict[str, sympy.Expr] = {}
    for s in ir.STATES:
        out[f"memory.{s.value}"] = mem.device[s]
    out["memory.transient"] = mem.transient_total
    out["memory.total"] = mem.device_total
    out["memory.host"] = mem.host_total
    out["memory.model_state"] = mem.model_state
    for st in mem.stages:
        for s in ir.STATES:
            out[f"stage.{st.stage}.{s.value}"] = st.device[s]
        out[f"stage.{st.stage}.transient"] = st.transient_total
        out[f"stage.{st.stage}.total"] = st.device_total
    out["comm.total"] = comm.total_bytes
    out["volume.total"] = comm.total_volume
    for link, (b, _v) in comm.per_link().items():
        out[f"comm.link.{link}"] = b
    for group, (_link, b, _v) in comm.per_group().items():
        out[f"comm.group.{group}"] = b
    return {k: as_expr(v).xreplace(subs) for k, v in out.items()}


def compile_costs(pc, symbols: Iterable[sympy.Symbol | str], subs: Mapping[sympy.Symbol, sympy.Expr] | None = None,
                  backend: str | None = None, extra: Mapping[str, sympy.Expr] | None = None) -> CompiledCost:
    """``compile_exprs`` of ``cost_exprs(pc, subs)`` (plus ``extra`` expressions, ``subs`` applied)."""
    exprs = cost_exprs(pc, subs)
    for k, v in (extra or {}).items():
        exprs[k] = as_expr(v).xreplace(dict(subs or {}))
    return compile_exprs(exprs, tuple(symbols), backend)
