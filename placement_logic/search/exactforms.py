"""A structure's exact figures compiled once, then evaluated at a configuration in exact rationals.

Input: a structure's derivation with its sizes as symbols (a ``PlanCost`` and its step time).
Output: a *record* (the figures a ranked row prints, written as a ``search.program`` straight-line
program: peak memory per device, step time, compute plus optimizer time, each pipeline stage's
peak and each link class's bytes), plain JSON-able data stored in the structure cache beside
the numeric program, and from it a function of the sizes that gives those figures as
``Fraction`` (``compile``), with the arithmetic of ``costs.extrema.exact_at``: sums, products,
integer powers, maxima and minima and piecewise forms (the first branch whose condition holds)
over integers and ``Fraction``, never floats. Nodes are evaluated on demand (a branch not taken
is never computed) and each shared subterm once per call.

A configuration of the structure (its sizes decide nothing the structure's facts do not: see
``search.space.Structure.facts``) then costs one evaluation of the program instead of a
derivation of its own. A record with a floating-point number or a fractional power is not
kept (``build`` gives ``None``); a point where the value is undefined (a division by zero, no
branch that holds) gives ``None``: the caller derives that configuration on its own.
"""

from __future__ import annotations

import operator
from fractions import Fraction
from typing import Callable

from . import program

_RELATIONS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt, "eq": operator.eq,
              "ne": operator.ne}
_HEAD = 3  # memory, step, compute + optimizer; then the stages, then the links


class _Undefined(Exception):
    """No exact value at this point (a division by zero, a piecewise form with no branch that holds)."""


def forms(pc, st) -> tuple[list, list[str], list[str]]:
    """The forms of a derivation's exact figures, with the names of its stages and link classes."""
    stages = list(pc.memory.stages)
    per_link = pc.communication.per_link()
    out = [pc.memory.device_total, st.step, st.compute + st.optimizer]
    out += [s.device_total for s in stages] + [b for b, _ in per_link.values()]
    return out, [s.stage for s in stages], list(per_link)


def build(pc, st, names: tuple[str, ...]) -> dict | None:
    """The record of a derivation over the size symbols ``names``, or ``None`` when a form has a
    node the program or exact arithmetic does not take."""
    fs, stages, links = forms(pc, st)
    prog = program.build(fs, names)
    if prog is None or any(op[0] == "float" or (op[0] == "pow" and op[3] != 1) for op in prog["ops"]):
        return None
    return {"program": prog, "stages": stages, "links": links}


def load(data) -> dict | None:
    """A record read back from JSON, checked for shape (``None`` when it is not one)."""
    try:
        prog = program.load(data["program"])
        stages, links = [str(s) for s in data["stages"]], [str(k) for k in data["links"]]
    except (KeyError, TypeError, ValueError):
        return None
    if prog is None or len(prog["outputs"]) != _HEAD + len(stages) + len(links):
        return None
    if any(op[0] == "float" or (op[0] == "pow" and op[3] != 1) for op in prog["ops"]):
        return None
    return {"program": prog, "stages": stages, "links": links}


def compile(record: dict) -> Callable[[list], tuple | None]:  # noqa: A001 - the module's verb
    """``f(sizes)`` (integers in the program's column order) -> (memory, step, {stage: bytes},
    {link: bytes}, exposed seconds) as ``Fraction``, or ``None`` where a figure has no value."""
    prog = record["program"]
    ops = prog["ops"]
    uses = [0] * len(ops)
    for op in ops:
        for r in _refs(op):
            uses[r] += 1
    fns: list = []
    for i, op in enumerate(ops):
        f = _node(op, fns)
        if uses[i] > 1 and op[0] not in ("sym", "num", "true", "false"):
            f = _memo(i, f)
        fns.append(f)
    outs = [fns[i] for i in prog["outputs"]]
    stages, links, n = record["stages"], record["links"], len(ops)

    def figures(sizes: list) -> tuple | None:
        v: list = [_MISSING] * n
        v.append(sizes)
        try:
            vals = [Fraction(o(v)) for o in outs]
        except (_Undefined, ZeroDivisionError):
            return None
        memory, step, busy = vals[:_HEAD]
        rest = vals[_HEAD:]
        return (memory, step, dict(zip(stages, rest[:len(stages)])), dict(zip(links, rest[len(stages):])),
                step - busy)
    return figures


_MISSING = object()


def _refs(op) -> list:
    kind = op[0]
    if kind in ("add", "mul", "max", "min", "and", "or"):
        return list(op[1])
    if kind == "select":
        return list(op[1]) + list(op[2])
    if kind in ("pow", "not"):
        return [op[1]]
    if kind in _RELATIONS:
        return [op[1], op[2]]
    return []


def _memo(i: int, f: Callable) -> Callable:
    def once(v):
        x = v[i]
        if x is _MISSING:
            x = v[i] = f(v)
        return x
    return once


def _fold(fn, fs: list) -> Callable:
    first, rest = fs[0], fs[1:]

    def f(v):
        t = first(v)
        for g in rest:
            t = fn(t, g(v))
        return t
    return f


def _power(base: Callable, p: int) -> Callable:
    def f(v):
        b = base(v)
        if p >= 0:
            return b ** p
        if b == 0:
            raise _Undefined()  # sympy's value is zoo
        return Fraction(1, b ** -p) if isinstance(b, int) else b ** p
    return f


def _select(pairs: list) -> Callable:
    def f(v):
        for cond, value in pairs:
            if cond(v):
                return value(v)
        raise _Undefined()
    return f


def _node(op, fns: list) -> Callable:  # noqa: C901 - one branch per operation
    kind = op[0]
    if kind == "sym":
        j = op[1]
        return lambda v: v[-1][j]
    if kind == "num":
        c = op[1] if op[2] == 1 else Fraction(op[1], op[2])
        return lambda v: c
    if kind in ("true", "false"):
        c = kind == "true"
        return lambda v: c
    if kind in ("add", "mul"):
        return _fold(operator.add if kind == "add" else operator.mul, [fns[a] for a in op[1]])
    if kind in ("max", "min"):
        pick, fs = (max if kind == "max" else min), [fns[a] for a in op[1]]
        return lambda v: pick([g(v) for g in fs])
    if kind == "pow":
        return _power(fns[op[1]], op[2])
    if kind in _RELATIONS:
        rel, a, b = _RELATIONS[kind], fns[op[1]], fns[op[2]]
        return lambda v: rel(a(v), b(v))
    if kind in ("and", "or"):
        test, fs = (all if kind == "and" else any), [fns[a] for a in op[1]]
        return lambda v: test(g(v) for g in fs)
    if kind == "not":
        a = fns[op[1]]
        return lambda v: not a(v)
    if kind == "select":
        return _select([(fns[c], fns[x]) for c, x in zip(op[1], op[2])])
    raise ValueError(f"not an exact operation: {kind}")
