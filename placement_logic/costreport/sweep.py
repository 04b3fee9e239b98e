"""Sweeps: a spec, fixed ``--set`` values and swept ones in; one row per configuration and plan out.

Input: an ``ir.Spec``, plan names, single re-bindings (name -> exact number) and sweeps
(name -> values, from ``commands.options.parse_sweep_sets``). Output: a ``SweepReport``:
per configuration of the cartesian product of the sweeps (the last name varying fastest)
and per plan, the device memory per state, transient and total (per pipeline stage with a
pipeline), the communication bytes per device per step in total and per link, and the
verdict of every ``assert`` and ``claim``.

Two evaluations, the same numbers:

- *compiled* (default): the plan's closed forms are derived once per *class* of
  configurations and compiled (``costs.compiled``) over the swept symbols. A class is the
  set of mesh axes whose size is 1 in the configuration: an axis of one device sends and
  gathers nothing (``costs.derive(..., sized=True)``), so the forms differ there; a swept
  axis otherwise keeps its symbol (K/V heads split as min(t, kv)). Values are float64;
  the first and the last configuration of every class are re-derived exactly and compared
  (``costs.compiled.agrees``); a class that disagreed is re-derived exactly row by row, with
  a note. A comparison of an assert whose two sides are within rounding of each other is
  decided exactly.
  The rows are produced a chunk of configurations at a time (``costreport.sweeprows``;
  ``plan_sweep`` leaves them to stream, ``build_sweep`` keeps them), so that a long sweep's
  memory does not grow with its rows.
- *exact* (``--exact``): every configuration is bound with ``--set`` semantics and derived
  as a single ``placement cost`` would (``with_sizes``, ``derive``), in exact rationals.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable, Iterator, Mapping

import sympy

from .. import costs, ir
from ..costs.compiled import (  # noqa: F401 - compile_exprs, numpy_or_none: sweeprows calls them from here
    CompiledCost,
    agrees,
    compile_exprs,
    cost_exprs,
    exact_value,
    numpy_or_none,
)
from ..costs.symbolic import rational, resolve_bindings, symbol, to_sympy
from ..diagnostics import Code, Diagnostic, DiagnosticError, did_you_mean
from ..ir.walker import fold
from ..outcome import QuestionVerdict
from ..resolve.validate import check_rebinding, rebinding_diagnostics, shape_names, sources

_OPS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}
_NO_SUBS = sympy.Symbol("_sweep_no_binding")  # keeps query_value on its sized path when nothing is bound


@dataclass(frozen=True)
class SweepQuestion:
    kind: str  # assert | claim
    label: str | None
    op: str
    where: str  # file:line:col


@dataclass(frozen=True)
class SweepRow:
    values: tuple[Fraction, ...]  # the swept values, in ``SweepReport.swept`` order
    plan: str
    numbers: dict  # quantity name (costs.compiled.cost_exprs) -> Fraction (exact) or float (compiled)
    verdicts: tuple[QuestionVerdict, ...]  # per question: holds | fails

    def get(self, name: str):
        return self.numbers.get(name, 0)


@dataclass(frozen=True)
class SweepReport:
    command: str  # cost | compare
    file: str
    swept: tuple[str, ...]
    fixed: tuple[tuple[str, Fraction], ...]  # the --set single values
    plans: tuple[str, ...]
    rows: tuple[SweepRow, ...]
    questions: tuple[SweepQuestion, ...]
    evaluation: str  # compiled | exact
    backend: str  # numpy | math | sympy
    staged: tuple[str, ...] = ()  # plans with pipeline stages
    links: tuple[str, ...] = ()  # link classes that carry traffic in some row
    axes: tuple[str, ...] = ()  # mesh axes
    baseline: str | None = None
    notes: tuple[str, ...] = field(default=())
    quantities: tuple[str, ...] = ()  # every quantity name some row carries
    count: int | None = None  # configurations (the product of the sweeps' lengths)
    source: Callable[[], Iterator[SweepRow]] | None = field(default=None, repr=False, compare=False)

    def iter_rows(self) -> Iterator[SweepRow]:
        """The rows, in order: those kept, or (a streamed report) produced again from its source."""
        return iter(self.rows) if self.source is None else self.source()

    def materialised(self) -> SweepReport:
        """The report with every row kept (``rows``), for callers that need them all (a plot)."""
        return self if self.source is None else replace(self, rows=tuple(self.source()), source=None)

    @property
    def failed_asserts(self) -> int:
        return sum(1 for r in self.iter_rows() for q, v in zip(self.questions, r.verdicts)
                   if q.kind == "assert" and v == QuestionVerdict.FAILS)

    @property
    def exit_status(self) -> int:
        """1 when an ``assert`` fails on some row, else 0 (every symbol is bound: nothing is unknown)."""
        return 1 if self.failed_asserts else 0

    @property
    def unknown_asserts(self) -> int:
        return 0  # every symbol is bound in a sweep

    def configurations(self) -> int:
        return self.count if self.count is not None else len({r.values for r in self.rows})


def _fixed_bindings(spec: ir.Spec, sets: Mapping[str, Fraction], swept: tuple[str, ...]) -> dict:
    """The spec's bindings with ``sets`` applied, in terms of the swept symbols (left free)."""
    out: dict[sympy.Symbol, sympy.Expr] = {}
    rest = dict(sets)
    for name, value in spec.bindings:
        if name in swept:
            rest.pop(name, None)
            continue
        out[symbol(name)] = rational(rest.pop(name)) if name in rest else to_sympy(value).xreplace(out)
    for name, v in rest.items():
        if name not in swept:
            out[symbol(name)] = rational(v)
    return out


def _kv_heads(spec: ir.Spec) -> int | None:
    """The model's kv heads as a number, when it has a transformer shape that gives them."""
    t = spec.model.transformer if spec.model is not None else None
    heads = None if t is None else (t.kv_heads if t.kv_heads is not None else t.heads)
    if heads is None:
        return None
    v = fold(heads, dict(spec.bindings))
    return int(v) if v is not None and v.denominator == 1 else None


def _class_plan(plan: ir.Plan, ones: frozenset, fixed: Mapping) -> ir.Plan:
    """The plan for one class: axes of one device sized 1, axes given a number by the class (a tensor
    axis wider than the kv heads) and fixed integer sizes as numbers, every other axis (its size
    swept) a symbol of its own name."""
    pinned = dict(x for x in ones if isinstance(x, tuple))
    axes = []
    for a in plan.mesh.axes:
        v = fixed.get(symbol(a.name))
        if a.name in pinned:
            a = replace(a, size=ir.const(pinned[a.name]))
        elif a.name in ones:
            a = replace(a, size=ir.const(1))
        elif v is not None and getattr(v, "is_Integer", False) and v >= 1:
            a = replace(a, size=ir.const(int(v)))
        else:
            a = replace(a, size=ir.Sym(a.name))
        axes.append(a)
    return replace(plan, mesh=replace(plan.mesh, axes=tuple(axes)))


def _questions(spec: ir.Spec) -> tuple[SweepQuestion, ...]:
    return tuple(SweepQuestion(q.kind, q.label, q.op, f"{q.span.file}:{q.span.line}:{q.span.column}")
                 for q in spec.questions)


def _check_plans(spec: ir.Spec, names: list[str], baseline: str | None) -> None:
    known = [p.name for p in spec.plans]
    for n in names + ([baseline] if baseline else []):
        if n not in known:
            raise DiagnosticError([Diagnostic(Code.UNKNOWN_PLAN, f"no plan named '{n}' in {spec.file}",
                                              notes=did_you_mean(n, known))])


def _unbound(free: set[str]) -> DiagnosticError:
    return DiagnosticError([Diagnostic(
        Code.SWEEP_UNBOUND, f"a sweep evaluates numbers, but {', '.join(sorted(free))} "
        f"{'is' if len(free) == 1 else 'are'} not bound: give {'it' if len(free) == 1 else 'them'} with --set "
        "or in the spec")])


def build_sweep(spec: ir.Spec, plans=(), sets: Mapping[str, Fraction] | None = None,
                sweeps: Mapping[str, tuple[Fraction, ...]] | None = None, command: str = "cost",
                baseline: str | None = None, exact: bool = False) -> SweepReport:
    """The sweep with every row kept (``SweepReport.rows``)."""
    return plan_sweep(spec, plans, sets, sweeps, command, baseline, exact).materialised()


def plan_sweep(spec: ir.Spec, plans=(), sets: Mapping[str, Fraction] | None = None,
               sweeps: Mapping[str, tuple[Fraction, ...]] | None = None, command: str = "cost",
               baseline: str | None = None, exact: bool = False) -> SweepReport:
    """The sweep checked, derived and compiled, its rows left to stream (``SweepReport.iter_rows``):
    every error is raised here, before a row is produced. An ``--exact`` sweep keeps its rows (each
    is derived in sympy: which quantities and links the rows carry is known only once every row is)."""
    sets = dict(sets or {})
    sweeps = dict(sweeps or {})
    names = list(plans) or [p.name for p in spec.plans]
    _check_plans(spec, names, baseline)
    if command == "compare":
        baseline = baseline or (names[0] if names else None)
        if baseline and baseline not in names:
            names.insert(0, baseline)
    swept = tuple(sweeps)
    count = 1
    for n in swept:
        count *= len(sweeps[n])
    check_points(spec, sets, swept, lambda: itertools.product(*(sweeps[n] for n in swept)), count)
    questions = _questions(spec)
    keys: dict[str, dict] = {n: {} for n in names}  # plan -> the quantity names its rows carry
    source = None
    if exact:
        grid = itertools.product(*(sweeps[n] for n in swept))
        rows, backend, notes = tuple(_exact_rows(spec, names, sets, swept, grid, keys)), "sympy", []
    else:
        from .sweeprows import compiled_source

        rows = ()
        source, backend, notes = compiled_source(sys.modules[__name__], spec, names, sets, swept, sweeps, keys)
    staged = tuple(n for n in names if any(k.startswith("stage.") for k in keys[n]))
    every = dict.fromkeys(k for n in names for k in keys[n])
    links = tuple(k[len("comm.link."):] for k in every if k.startswith("comm.link."))
    return SweepReport(command, spec.file, swept, tuple(sets.items()), tuple(names), rows, questions,
                       "exact" if exact else "compiled", backend, staged, links,
                       spec.mesh.names if spec.mesh else (), baseline if command == "compare" else None,
                       tuple(notes), tuple(every), count, source)


def check_points(spec: ir.Spec, sets: Mapping[str, Fraction], swept: tuple[str, ...], grid: Callable[[], Iterator],
                 count: int) -> None:
    """Every configuration of the sweep is held to what its values written in the file are
    (``resolve.validate``): an invalid one is an error of the whole sweep (exit 2), never a row
    of numbers. The diagnostics are those of the first invalid configuration; a note lists
    every invalid one. ``grid()`` yields the configurations (again at each call); ``count``: how many."""
    check_rebinding(spec, sets)
    if not swept:
        return
    relevant = shape_names(spec)
    judged: dict[tuple, bool] = {}  # the values of the names the checks read -> whether they hold
    first, bad = None, []
    for values in grid():
        point = dict(zip(swept, values))
        key = tuple(v if n in relevant or v.denominator != 1 or v < 1 else None for n, v in point.items())
        if judged.get(key, False):
            continue
        shown = ", ".join(f"{n}={_fraction_text(v)}" for n, v in point.items())
        diags = rebinding_diagnostics(spec, {**sets, **point}, f"swept by --set: the sweep point {shown}")
        if None in key or diags:  # a key of every swept value is never met again: not kept
            judged[key] = not diags
        if diags:
            bad.append(shown)
            first = first or diags
    if first is None:
        return
    listed = "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else "")
    notes = (f"{len(bad)} of the {count} configurations of the sweep are invalid: {listed}",)
    if len(swept) == 1:
        good = [_fraction_text(v[0]) for v in grid() if f"{swept[0]}={_fraction_text(v[0])}" not in bad]
        if good:
            notes += (f"sweep the valid values only: --set {swept[0]}={','.join(good)}",)
    d = first[0]
    first[0] = Diagnostic(d.code, d.message, d.span, d.severity, d.notes + notes)
    raise DiagnosticError(first, sources(spec))


def _fraction_text(v: Fraction) -> str:
    v = Fraction(v)
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


# --------------------------------------------------------------------------- exact, row by row


def _exact_rows(spec, names, sets, swept, grid, keys: dict) -> Iterator[SweepRow]:
    for values in grid:
        row_sets = {**sets, **dict(zip(swept, values))}
        subs = resolve_bindings(spec.bindings, row_sets)
        verdicts = []
        for qn in spec.questions:
            left = costs.value_of(spec, qn.left, subs or {_NO_SUBS: 0})
            right = costs.value_of(spec, qn.right, subs or {_NO_SUBS: 0})
            try:
                lv, rv = exact_value(left, subs), exact_value(right, subs)
            except ValueError:
                raise _unbound({s.name for s in (left - right).xreplace(subs).free_symbols}) from None
            verdicts.append(QuestionVerdict.HOLDS if _OPS[qn.op](lv, rv) else QuestionVerdict.FAILS)
        for name in names:
            pc = costs.derive(costs.with_sizes(spec.plan(name), subs), sized=True)
            exprs = cost_exprs(pc, subs)
            free = {s.name for e in exprs.values() for s in e.free_symbols}
            if free:
                raise _unbound(free)
            keys[name].update(dict.fromkeys(exprs))
            yield SweepRow(values, name, {k: exact_value(e, {}) for k, e in exprs.items()}, tuple(verdicts))


def _display(key: str) -> str:
    """A compiled quantity's name as a reader sees it: ``plan: memory.total``, ``question 1 (left)``."""
    head, _, rest = key.partition("\0")
    if not head:
        j, _, side = rest.partition("\0")
        return f"question {int(j[1:]) + 1} ({side})"
    return f"{head}: {rest}"


def _verdicts(spec, fn: CompiledCost, sides: list, point) -> tuple[QuestionVerdict, ...]:
    """Each question's verdict from its two sides; floats too close to call are decided exactly
    (``point()``: the configuration's exact values)."""
    out = []
    exact = None
    for j, (qn, (left, right)) in enumerate(zip(spec.questions, sides)):
        if isinstance(left, float) or isinstance(right, float):
            scale = max(abs(left), abs(right), 1.0)
            if abs(left - right) <= 1e-9 * scale or left != left or right != right:
                exact = exact or fn.exact(**point())
                left, right = exact[f"\0q{j}\0left"], exact[f"\0q{j}\0right"]
        out.append(QuestionVerdict.HOLDS if _OPS[qn.op](left, right) else QuestionVerdict.FAILS)
    return tuple(out)


def compiled_agrees(row: SweepRow, exact_numbers: Mapping[str, Fraction]) -> list[str]:
    """The quantities of a compiled row that disagree with exact values (``costs.compiled.agrees``)."""
    return [k for k, v in exact_numbers.items()
            if not (agrees(row.get(k), v) if isinstance(row.get(k), float) else row.get(k) == v)]
