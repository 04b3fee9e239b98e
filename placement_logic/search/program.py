"""A structure's closed forms as a straight-line program over numpy arrays: data, not code.

``build`` walks the sympy forms once and lists each distinct subexpression once (a DAG in
evaluation order: a shared subterm is computed once per block of rows); ``compile`` turns the
list once into closures (the operations on constants computed then) that evaluate it over
columns of sizes (``run``: both at once); ``merge`` joins the programs of several structures
over the same columns, each shared operation once. The program is plain JSON-able lists, so it is stored in the
result cache as it is (content-addressed by the structure's spec text and the tool's source)
and read back without evaluating any text; a repeated structure then costs neither the
derivation nor a compilation. A form with a node this does not know (none of the search's
forms have one today) gives ``None``: the caller compiles that structure with ``lambdify``.

Operations: ``("sym", i)`` the i-th size column, ``("num", p, q)`` the rational p/q, ``("float", x)``,
``("add"|"mul"|"max"|"min", args)``, ``("pow", base, p, q)`` a rational power,
``("ge"|"gt"|"le"|"lt"|"eq"|"ne", a, b)``, ``("and"|"or", args)``, ``("not", a)``,
``("true",)``, ``("false",)`` and ``("select", conds, values)`` for a piecewise form (the
value of its first true condition; NaN when none is). Argument lists are indices of earlier
operations.
"""

from __future__ import annotations

import math
import operator
from fractions import Fraction

_REL = {"GreaterThan": "ge", "StrictGreaterThan": "gt", "LessThan": "le", "StrictLessThan": "lt",
        "Equality": "eq", "Unequality": "ne"}
_NARY = {"Add": "add", "Mul": "mul", "Max": "max", "Min": "min", "And": "and", "Or": "or"}


class _Unknown(Exception):
    pass


def build(forms, names: tuple[str, ...]) -> dict | None:
    """The program of ``forms`` over the size symbols ``names`` (in column order), or ``None``."""
    ops: list = []
    index: dict = {}
    column = {n: i for i, n in enumerate(names)}

    def add(op: tuple) -> int:
        if op not in index:
            index[op] = len(ops)
            ops.append(op)
        return index[op]

    seen: dict = {}  # id of a node visited -> its operation (the nodes live as long as ``forms``)

    def visit(e) -> int:
        out = seen.get(id(e))
        if out is not None:
            return out
        key = ("expr", e)  # an equal node met before as another object
        if key in index:
            out = seen[id(e)] = index[key]
            return out
        kind = type(e).__name__
        if e.is_Symbol:
            if e.name not in column:
                raise _Unknown(e.name)
            out = add(("sym", column[e.name]))
        elif e.is_Rational:
            out = add(("num", int(e.p), int(e.q)))
        elif e.is_Float:
            out = add(("float", float(e)))
        elif kind in _NARY:
            out = add((_NARY[kind], tuple([visit(a) for a in e.args])))
        elif e.is_Pow and e.exp.is_Rational:
            out = add(("pow", visit(e.base), int(e.exp.p), int(e.exp.q)))
        elif kind in _REL:
            out = add((_REL[kind], visit(e.lhs), visit(e.rhs)))
        elif kind == "Not":
            out = add(("not", visit(e.args[0])))
        elif kind == "BooleanTrue":
            out = add(("true",))
        elif kind == "BooleanFalse":
            out = add(("false",))
        elif kind == "Piecewise":
            pairs = [pair.args for pair in e.args]  # (value, condition) each
            out = add(("select", tuple([visit(c) for _, c in pairs]), tuple([visit(v) for v, _ in pairs])))
        else:
            raise _Unknown(kind)
        index[key] = seen[id(e)] = out
        return out

    try:
        outputs = [visit(f) for f in forms]
    except _Unknown:
        return None
    return {"names": list(names), "ops": [list(o) for o in ops], "outputs": outputs}


def merge(programs: list) -> dict:
    """One program computing the outputs of every program of ``programs`` (over the same size
    columns), each operation they share computed once: its outputs are theirs, program after
    program. Every operation keeps its own arguments (the same values, in the same order), so
    each output is the number its own program gives."""
    ops: list = []
    index: dict = {}
    outputs: list = []
    for prog in programs:
        slot: list = []  # the program's operation -> the merged one
        for op in prog["ops"]:
            kind = op[0]
            if kind in _NARY_KINDS:
                op = (kind, tuple([slot[a] for a in op[1]]))
            elif kind in _BINARY:
                op = (kind, slot[op[1]], slot[op[2]])
            elif kind == "select":
                op = (kind, tuple([slot[c] for c in op[1]]), tuple([slot[v] for v in op[2]]))
            elif kind in ("pow", "not"):
                op = (kind, slot[op[1]], *op[2:])
            else:
                op = tuple(op)
            # a float keyed with its sign too (0.0 == -0.0 as keys; 1/x tells them apart)
            key = (op, math.copysign(1.0, op[1])) if kind == "float" else op
            j = index.get(key)
            if j is None:
                j = index[key] = len(ops)
                ops.append(op)
            slot.append(j)
        outputs += [slot[i] for i in prog["outputs"]]
    return {"names": list(programs[0]["names"]), "ops": ops, "outputs": outputs}


def lambdified(forms, names: tuple[str, ...]):
    """``forms`` compiled with ``sympy.lambdify`` to numpy over the size symbols ``names``: for
    a structure whose forms ``build`` does not cover (not stored)."""
    import sympy

    from ..costs.symbolic import symbol

    # no common-subexpression pass: on the kernel model's piecewise forms it costs more to compile than
    # it saves evaluating
    return sympy.lambdify([symbol(n) for n in names], forms, modules=[{"Max": _np_max, "Min": _np_min}, "numpy"],
                          cse=False)


def _np_max(*xs):
    import numpy as np

    out = xs[0]
    for x in xs[1:]:
        out = np.maximum(out, x)
    return out


def _np_min(*xs):
    import numpy as np

    out = xs[0]
    for x in xs[1:]:
        out = np.minimum(out, x)
    return out


def _tuple(x):
    return tuple(_tuple(v) for v in x) if isinstance(x, list) else x


def load(data) -> dict | None:
    """A program read back from JSON, checked for shape (``None`` when it is not one)."""
    try:
        ops = [_tuple(o) for o in data["ops"]]
        outputs = [int(i) for i in data["outputs"]]
        names = tuple(data["names"])
        for n, op in enumerate(ops):
            refs = [r for a in op[1:] if isinstance(a, tuple) for r in a] if op[0] in ("add", "mul", "max", "min",
                                                                                      "and", "or", "select") else \
                [op[1]] if op[0] in ("pow", "not") else list(op[1:3]) if op[0] in _REL.values() else []
            if op[0] not in _OPS or not all(isinstance(r, int) and 0 <= r < n for r in refs):
                return None
        if not all(0 <= i < len(ops) for i in outputs):
            return None
        return {"names": list(names), "ops": ops, "outputs": outputs}
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def run(program: dict, columns: list) -> list:
    """The program's outputs over ``columns`` (numpy float64 arrays, one per name)."""
    return compile(program)(columns)


def compile(program: dict):  # noqa: A001 - the module's verb
    """``f(columns) -> outputs``: the program turned once into a list of steps, each a closure
    over its arguments' slots, with every operation whose arguments are all constants computed
    here (the same operation on the same values as a run would make: the same numbers), so a
    run evaluates only the operations that read a size column."""
    import numpy as np

    ops = program["ops"]
    template: list = [None] * len(ops)
    const = [False] * len(ops)
    columns_at: list = []  # (slot, column)
    steps: list = []  # (slot, closure over the slots)
    with np.errstate(all="ignore"):
        for i, op in enumerate(ops):
            kind = op[0]
            if kind == "sym":
                columns_at.append((i, op[1]))
                continue
            if kind in _CONSTANTS:
                template[i], const[i] = _CONSTANTS[kind](op), True
                continue
            step = _step(np, op)
            if all(const[r] for r in _refs(op)):
                try:
                    template[i], const[i] = step(template), True
                except (ArithmeticError, ValueError):  # left to the run, where it raises as before
                    steps.append((i, step))
            else:
                steps.append((i, step))
    outputs = list(program["outputs"])

    def evaluate(columns: list) -> list:
        vals = template.copy()
        for i, c in columns_at:
            vals[i] = columns[c]
        for i, step in steps:
            vals[i] = step(vals)
        return [vals[i] for i in outputs]

    return evaluate


def _refs(op) -> tuple:
    """The slots an operation reads."""
    kind = op[0]
    if kind in _NARY_KINDS:
        return op[1]
    if kind in _BINARY:
        return op[1:3]
    if kind == "select":
        return op[1] + op[2]
    return op[1:2]  # pow, not


def _step(np, op):
    """One operation as a closure over the slots (the fold of an n-ary one left to right, as
    ``_OPS`` computes it)."""
    kind = op[0]
    if kind in _NARY_KINDS:
        f, args = _NARY_FNS[kind](np), op[1]
        if len(args) == 2:
            a, b = args
            return lambda v: f(v[a], v[b])
        first, rest = args[0], args[1:]

        def fold(v):
            out = v[first]
            for j in rest:
                out = f(out, v[j])
            return out
        return fold
    if kind in _BINARY:
        f, a, b = _BINARY[kind](np), op[1], op[2]
        return lambda v: f(v[a], v[b])
    if kind == "not":
        a = op[1]
        return lambda v: np.logical_not(v[a])
    if kind == "select":
        conds, values = op[1][::-1], op[2][::-1]

        def select(v):  # ``_select``'s value: the last true condition's value put in first, so the first wins
            n = max((np.size(v[i]) for i in op[1] + op[2]), default=1)
            out = np.full(n, np.nan)
            for c, x in zip(conds, values):
                out = np.where(v[c], v[x], out)
            return out
        return select
    fn = _OPS[kind]
    return lambda v: fn(np, op, v, None)


_NARY_KINDS = ("add", "mul", "max", "min", "and", "or")
_NARY_FNS = {"add": lambda np: operator.add, "mul": lambda np: operator.mul, "max": lambda np: np.maximum,
             "min": lambda np: np.minimum, "and": lambda np: np.logical_and, "or": lambda np: np.logical_or}
_BINARY = {"ge": lambda np: np.greater_equal, "gt": lambda np: np.greater, "le": lambda np: np.less_equal,
           "lt": lambda np: np.less, "eq": lambda np: np.equal, "ne": lambda np: np.not_equal}
_CONSTANTS = {"num": lambda op: op[1] / op[2],  # correctly rounded, as float(Fraction(p, q)) is
              "float": lambda op: float(op[1]),
              "true": lambda op: True, "false": lambda op: False}


def _nary(fn):
    def apply(np, op, vals, cols):
        args = [vals[i] for i in op[1]]
        out = args[0]
        for a in args[1:]:
            out = fn(np, out, a)
        return out
    return apply


def _pow(np, op, vals, cols):
    base, p, q = vals[op[1]], op[2], op[3]
    if q == 1:
        if p == -1:
            return 1.0 / base
        if p >= 0:
            return base ** float(p)
        return 1.0 / base ** float(-p)
    return np.power(base, p / q)


def _select(np, op, vals, cols):
    conds = [vals[i] for i in op[1]]
    values = [vals[i] for i in op[2]]
    n = max((np.size(v) for v in conds + values), default=1)
    return np.select([np.broadcast_to(c, (n,)) for c in conds], [np.broadcast_to(v, (n,)) for v in values],
                     default=np.nan)


_OPS = {
    "sym": lambda np, op, vals, cols: cols[op[1]],
    "num": lambda np, op, vals, cols: float(Fraction(op[1], op[2])),
    "float": lambda np, op, vals, cols: float(op[1]),
    "add": _nary(lambda np, a, b: a + b),
    "mul": _nary(lambda np, a, b: a * b),
    "max": _nary(lambda np, a, b: np.maximum(a, b)),
    "min": _nary(lambda np, a, b: np.minimum(a, b)),
    "and": _nary(lambda np, a, b: np.logical_and(a, b)),
    "or": _nary(lambda np, a, b: np.logical_or(a, b)),
    "pow": _pow,
    "ge": lambda np, op, vals, cols: np.greater_equal(vals[op[1]], vals[op[2]]),
    "gt": lambda np, op, vals, cols: np.greater(vals[op[1]], vals[op[2]]),
    "le": lambda np, op, vals, cols: np.less_equal(vals[op[1]], vals[op[2]]),
    "lt": lambda np, op, vals, cols: np.less(vals[op[1]], vals[op[2]]),
    "eq": lambda np, op, vals, cols: np.equal(vals[op[1]], vals[op[2]]),
    "ne": lambda np, op, vals, cols: np.not_equal(vals[op[1]], vals[op[2]]),
    "not": lambda np, op, vals, cols: np.logical_not(vals[op[1]]),
    "true": lambda np, op, vals, cols: True,
    "false": lambda np, op, vals, cols: False,
    "select": _select,
}
