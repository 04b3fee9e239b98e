"""The compiled evaluation of a sweep, streamed: rows produced a chunk of configurations at a
time, in the order of the cartesian product, in memory that does not grow with their number.

Input: the spec, the plans, the fixed ``--set`` values and the sweeps (name -> values).
Output: ``compiled_source``: a function that yields the rows (``sweep.SweepRow``) each time it is
called, the backend's name, the notes, and (through ``keys``) the quantity names each plan's
rows carry, all known before the first row.

Two passes over the configurations, neither keeping them: the first finds every *class*
(the mesh axes of one device, the tensor axes wider than the K/V heads: ``sweep`` says why the
forms differ there) with its first and last configuration and its size; each class's closed
forms are derived and compiled once (``costs.compiled``, float64) and checked against the exact
values (``costs.exactfn``) at its first and last configuration; a class that disagrees is
evaluated exactly row by row, with a note. The second pass evaluates the configurations
``CHUNK`` at a time, each class's in one vectorised call, and yields the rows. A question
whose two sides are within rounding of each other is decided by the exact values of that
configuration (``CompiledCost.exact``, exact rationals compiled once per class).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Callable, Iterator

import sympy

from .. import costs
from ..costs.compiled import CompiledCost, cost_exprs, exact_value
from ..costs.symbolic import symbol

CHUNK = 1024  # configurations evaluated in one vectorised call (their rows are what a sweep holds at once)


def _chunks(sweeps: dict, swept: tuple[str, ...]) -> Iterator[list[tuple]]:
    it = itertools.product(*(sweeps[n] for n in swept))
    while chunk := list(itertools.islice(it, CHUNK)):
        yield chunk


def _columns(np, chunk: list[tuple], swept: tuple[str, ...]) -> dict:
    """The chunk's values of each swept name, as the backend takes them (float64)."""
    return {n: (np.array([float(v[k]) for v in chunk]) if np is not None else [float(v[k]) for v in chunk])
            for k, n in enumerate(swept)}


def _classifier(sweep, spec, fixed: dict, swept: tuple[str, ...], syms: list) -> Callable[[list[tuple]], list]:
    """The class of each configuration of a chunk: the mesh axes of one device, and the tensor axes wider
    than the K/V heads with their sizes."""
    from .. import ir
    from ..ir import views

    mesh = spec.mesh.names if spec.mesh else ()
    # each axis size in terms of the swept symbols: which configurations give it one device
    sizes = {a: fixed.get(symbol(a), symbol(a)) for a in mesh}
    free = {s.name for e in sizes.values() for s in e.free_symbols} - set(swept)
    if free:
        raise sweep._unbound(free)
    varying = [a for a in mesh if sizes[a].free_symbols]
    constant = frozenset(a for a in mesh if not sizes[a].free_symbols and exact_value(sizes[a], {}) == 1)
    size_fn = sweep.compile_exprs({a: sizes[a] for a in varying}, syms) if varying else None
    # a tensor axis wider than the kv heads copies each head: the schedule then sums the copies' gradients,
    # a structure of its own, so such an axis is derived at its number (``ir.heads``)
    kv = sweep._kv_heads(spec)
    tensor = [a for a in varying if kv is not None and any(
        views.view(p).role(a) in (ir.Role.TENSOR, ir.Role.SEQUENCE) for p in spec.plans)]

    def classify(chunk: list[tuple]) -> list[frozenset]:
        if size_fn is None:
            return [constant] * len(chunk)
        got = size_fn.evaluate(**{n: [float(v[k]) for v in chunk] for k, n in enumerate(swept)})
        out = []
        for i in range(len(chunk)):
            ones = constant | frozenset(a for a in varying if abs(float(got[a][i]) - 1) < 1e-9)
            wide = frozenset((a, round(float(got[a][i]))) for a in tensor if float(got[a][i]) > kv + 1e-9)
            out.append(ones | wide)
        return out

    return classify


def _compile_class(sweep, spec, names, fixed: dict, swept: tuple[str, ...], syms: list, backend: str, np,
                   key: frozenset, ends: list[tuple], count: int, keys: dict,
                   notes: list[str]) -> tuple[CompiledCost, bool, list]:
    """One class's closed forms compiled and checked at its first and last configuration (``ends``):
    the compiled function, whether it disagreed (its rows then exact), and each plan's quantities."""
    spec_c = replace(spec, plans=tuple(sweep._class_plan(p, key, fixed) for p in spec.plans))
    exprs: dict[str, sympy.Expr] = {}
    for name in names:
        pc = costs.derive(spec_c.plan(name), sized=True)
        for k, e in cost_exprs(pc, fixed).items():
            exprs[f"{name}\0{k}"] = e
    for j, qn in enumerate(spec.questions):
        q_subs = fixed or {sweep._NO_SUBS: 0}
        exprs[f"\0q{j}\0left"] = costs.value_of(spec_c, qn.left, q_subs).xreplace(fixed)
        exprs[f"\0q{j}\0right"] = costs.value_of(spec_c, qn.right, q_subs).xreplace(fixed)
    free = {s.name for e in exprs.values() for s in e.free_symbols} - set(swept)
    if free:
        raise sweep._unbound(free)
    fn = sweep.compile_exprs(exprs, syms, backend)
    out = _evaluate(fn, np, ends, swept)
    bad = []
    for pos, values in enumerate(ends):
        bad += fn.check(pos, out, **dict(zip(swept, values)))
    if bad:
        notes.append(f"the compiled evaluation disagreed with the exact one on "
                     f"{', '.join(sweep._display(k) for k in dict.fromkeys(bad))}; "
                     f"{count} configuration(s) re-derived exactly")
    per_plan = []
    for name in names:
        prefix = f"{name}\0"
        shorts = [(k[len(prefix):], k) for k in fn.names if k.startswith(prefix)]
        keys[name].update(dict.fromkeys(short for short, _ in shorts))
        per_plan.append((name, shorts))
    return fn, bool(bad), per_plan


def compiled_source(sweep, spec, names, sets, swept, sweeps, keys: dict) -> tuple[Callable[[], Iterator], str, list[str]]:
    """``sweep``: the module ``costreport.sweep`` itself, passed by it (its row type and helpers; its compile_exprs
    and numpy_or_none as they are at the call, what a test replaces there)."""
    fixed = sweep._fixed_bindings(spec, sets, swept)
    syms = [symbol(n) for n in swept]
    classify = _classifier(sweep, spec, fixed, swept, syms)
    seen: dict[frozenset, list] = {}  # class -> [first configuration, last configuration, how many]
    for chunk in _chunks(sweeps, swept):
        for values, key in zip(chunk, classify(chunk)):
            entry = seen.setdefault(key, [values, values, 0])
            entry[1] = values
            entry[2] += 1
    backend = "numpy" if sweep.numpy_or_none() is not None else "math"
    np = sweep.numpy_or_none() if backend == "numpy" else None
    notes: list[str] = []
    compiled = {key: _compile_class(sweep, spec, names, fixed, swept, syms, backend, np, key,
                                    [first] if count == 1 else [first, last], count, keys, notes)
                for key, (first, last, count) in seen.items()}
    questions = [(f"\0q{j}\0left", f"\0q{j}\0right") for j in range(len(spec.questions))]

    def rows() -> Iterator:
        for chunk in _chunks(sweeps, swept):
            groups: dict[frozenset, list[int]] = {}
            for pos, key in enumerate(classify(chunk)):
                groups.setdefault(key, []).append(pos)
            made: list = [None] * len(chunk)
            for key, idx in groups.items():
                _chunk_rows(sweep, spec, compiled[key], chunk, idx, np, swept, questions, made)
            for group in made:
                yield from group

    return rows, backend, notes


def _chunk_rows(sweep, spec, compiled: tuple, chunk: list[tuple], idx: list[int], np, swept: tuple[str, ...],
                questions: list, made: list) -> None:
    """The rows of one class's configurations of a chunk (positions ``idx``), into ``made``."""
    fn, exact, per_plan = compiled
    points = [chunk[i] for i in idx]
    if exact:
        lists = {k: [] for k in fn.names}
        for values in points:
            for k, v in fn.exact(**dict(zip(swept, values))).items():
                lists[k].append(v)
    else:
        lists = _evaluate(fn, np, points, swept)
        lists = {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in lists.items()}
    for pos, (i, values) in enumerate(zip(idx, points)):
        sides = [(lists[left][pos], lists[right][pos]) for left, right in questions]
        verdicts = sweep._verdicts(spec, fn, sides, lambda values=values: dict(zip(swept, values)))
        made[i] = [sweep.SweepRow(values, name, {short: lists[k][pos] for short, k in shorts}, verdicts)
                   for name, shorts in per_plan]


def _evaluate(fn: CompiledCost, np, points: list[tuple], swept: tuple[str, ...]) -> dict:
    out = fn.evaluate(**_columns(np, points, swept))
    if not swept:  # no symbol: one configuration, scalars
        out = {k: [float(v)] for k, v in out.items()}
    return out
