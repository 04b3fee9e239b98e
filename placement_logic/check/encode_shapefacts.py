"""The sizes the model's own shape checks accept, as side conditions on the checker's sizes.

Resolution refuses a plan whose sizes split the transformer unevenly (``resolve/shapes.py``,
PL130: the attention heads, the kv heads, the MLP width and the vocabulary over the tensor
axes; the layers over the pipeline stages and their chunks; the experts over the expert axes;
the sequence over the context axes and, under sequence parallelism, the tensor axes; PL197: the
heads of each tensor rank over a Ulysses all-to-all group). A size
the checker quantifies over is held to the same facts, so a solver witness, and every smaller
variant the replay tries, is a configuration a user could run: never tp = 3 over 32 heads.
A proof then holds for the sizes the model takes, which is all a plan can be run at.

Input: the plan and its ``let`` bindings. Output: ``Fact``s (a product of axis sizes, times a
chunk count, that must divide a number, or, for kv heads fewer than the ranks, be a multiple
of it), their z3 form over an encoding's size terms (``side``) and their concrete check
(``holds``). A value that is not a number here (a symbol the file leaves free) gives no fact.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import z3

from .. import ir
from ..diagnostics import DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from .values import fold, resolver

_SPLIT = (ir.Mode.S, ir.Mode.O)


@dataclass(frozen=True)
class Fact:
    """The product of ``axes``' sizes times ``scale`` divides ``value`` (or, ``copies_ok``, is a multiple of it)."""

    what: str
    axes: tuple[str, ...]
    value: int
    scale: int = 1
    copies_ok: bool = False

    def text(self) -> str:
        over = "·".join(self.axes) + (f"·{self.scale}" if self.scale != 1 else "")
        tail = " (or a multiple of it: copies)" if self.copies_ok else ""
        return f"{over} divides {self.what} ({self.value}){tail}"


def _int(v: ir.Value | None, bindings: dict) -> int | None:
    if v is None:
        return None
    try:
        x = Fraction(fold(v, resolver(bindings, {})))
    except (DiagnosticError, TypeError, ValueError, ZeroDivisionError):
        return None
    return int(x) if x.denominator == 1 and x >= 1 else None


def facts(plan: ir.Plan, bindings: dict) -> tuple[Fact, ...]:
    """The divisibility facts resolution holds the plan's sizes to (the ones over mesh axes)."""
    t = plan.model.transformer
    if t is None:
        return ()
    out: list[Fact] = []

    def need(what: str, value: ir.Value | None, axes: tuple[str, ...], scale: int = 1, copies_ok: bool = False):
        v = _int(value, bindings)
        if axes and v is not None:
            out.append(Fact(what, axes, v, scale, copies_ok))

    par = plan.placement(ir.State.PARAMS)
    tensor = tuple(a for a in plan.axes_with_role(ir.Role.TENSOR, ir.Role.SEQUENCE) if par.mode(a) in _SPLIT)
    need("the attention heads", t.heads, tensor)
    if t.kv_heads is not t.heads:
        need("the kv heads", t.kv_heads, tensor, copies_ok=True)
    need("the MLP width", t.ffn, tensor)
    vocab, multiple = _int(t.vocab, bindings), _int(t.vocab_multiple, bindings)
    if vocab is not None and multiple is not None:
        need("the padded vocabulary", ir.const(-(-vocab // multiple) * multiple), tensor)
    else:
        need("the vocabulary", t.vocab, tensor)
    pipe = plan.axes_with_role(ir.Role.PIPELINE)
    chunks = _int(plan.schedule.chunks, bindings) if plan.schedule is not None else 1
    if chunks is not None:
        need("the layer count", t.layers, pipe, chunks)
    folded = any(d.name == "experts" and d.roles for d in plan.model.groups)
    experts = plan.axes_with_role(ir.Role.EXPERT)
    if not folded and _int(t.experts, bindings) not in (None, 1):
        need("the expert count", t.experts, experts)
    seq_axes = plan.axes_with_role(ir.Role.CONTEXT) + (tensor if plan.sequence_parallel else ())
    need("the sequence length", plan.model.seq, seq_axes)
    uneven = any(o.target == OverrideTarget.HEADS for o in plan.overrides)  # a stated split: no PL197 fact
    for o in plan.overrides:  # PL197: Ulysses' group g divides each tensor rank's h/t heads (kv: or a multiple)
        if not uneven and o.group == "context" and o.verb == OverrideVerb.ALL_TO_ALL and o.axes and not set(o.axes) & set(tensor):
            group = tensor + tuple(a for a in plan.mesh.names if a in o.axes)
            need("the attention heads", t.heads, group)
            if t.kv_heads is not t.heads:
                need("the kv heads", t.kv_heads, group, copies_ok=True)
    return tuple(dict.fromkeys(out))


def _divisors(v: int) -> list[int]:
    if v > 10**12:  # a trial division up to √v would not end (seq = 10**30): factor it
        from .divisors import divisors

        return divisors(v)
    small = [d for d in range(1, int(v ** 0.5) + 1) if v % d == 0]
    return sorted(set(small + [v // d for d in small]))


_BUILT: dict = {}  # (facts, the size terms' ids) -> (the size terms, their constraints): one build per query shape


def side(sizes: dict[str, Any], found: tuple[Fact, ...]) -> list:
    """The facts as constraints on an encoding's size terms (axes it has no term for are skipped). The
    queries of one check share their size terms (z3 gives a name one term per context), so the
    constraints are built once for them and reused; a hit is confirmed term by term (``eq``)."""
    if not found:
        return []
    names = tuple(sorted({a for f in found for a in f.axes if a in sizes}))
    terms = tuple(sizes[a] for a in names)
    if not all(isinstance(t, z3.ExprRef) for t in terms):
        return _side(sizes, found)
    key = (found, names, tuple(t.get_id() for t in terms))
    hit = _BUILT.get(key)
    if hit is not None and all(a.ctx is b.ctx and a.eq(b) for a, b in zip(hit[0], terms)):
        return list(hit[1])
    out = _side(sizes, found)
    if len(_BUILT) >= 256:
        _BUILT.clear()
    _BUILT[key] = (terms, tuple(out))
    return out


def _side(sizes: dict[str, Any], found: tuple[Fact, ...]) -> list:
    out = []
    for f in found:
        if not all(a in sizes for a in f.axes):
            continue
        n = sizes[f.axes[0]]
        for a in f.axes[1:]:
            n = n * sizes[a]
        if f.scale != 1:
            n = n * f.scale
        ok = [n == d for d in _divisors(f.value)]
        if f.copies_ok:
            ok.append(n % f.value == 0)
        out.append(z3.Or(ok))
        if not f.copies_ok:  # each factor divides the value too: a finite domain per axis
            out += [z3.Or([sizes[a] == d for d in _divisors(f.value)]) for a in f.axes]
    return out


def holds(found: tuple[Fact, ...], sizes: dict[str, int]) -> bool:
    """Whether concrete sizes meet every fact (a size missing from ``sizes`` is not judged)."""
    for f in found:
        if not all(a in sizes for a in f.axes):
            continue
        n = f.scale
        for a in f.axes:
            n *= sizes[a]
        if f.value % n and not (f.copies_ok and n % f.value == 0):
            return False
    return True
