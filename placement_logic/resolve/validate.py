"""Re-bound values held to what written values are (``--set NAME=VALUE``, sweeps, the API).

Input: a checked ``ir.Spec`` and re-bindings (name -> exact number: lets, mesh axis sizes,
and the free symbols a cost report may bind). Output: nothing, or a ``DiagnosticError``
(exit 2) with the diagnostics writing those values in the file would give: a size of an
axis that is not a positive integer (PL107), a size a plan's strategies cannot split evenly
(PL130, PL131), a model count or shape field out of its range (PL114), parallel folding of a tensor axis without sequence parallelism (PL133).
Each is located in the file, where the file's own value would be reported, and says which
``--set`` gave the value. Values that refer to a re-bound name (``let n = dp * 2``) fold to
the new number. Every command that re-binds calls this one check: ``check`` and the API's
``check_spec`` (``check.run``), ``cost`` and ``compare`` and their sweeps (``costreport``),
``inspect`` and ``measure`` (``rebound``), and ``search`` for each row it ranks.
"""

from __future__ import annotations

from dataclasses import fields
from fractions import Fraction
from pathlib import Path
from typing import Mapping

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.rebinding import rebind
from .context import Context
from .modelvalues import check_model_values
from .shapes import check_shapes, check_sizes
from .values import Values


def _shown(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def rebinding_diagnostics(spec: ir.Spec, sets: Mapping[str, Fraction], origin: str | None = None
                          ) -> list[Diagnostic]:
    """The diagnostics of ``spec`` with ``sets`` written in place of its values, in source
    order (none when the values hold), each with a note saying where the values came from
    (``origin``, else the ``--set`` options that give them). Names the spec does not bind are
    symbols a report leaves free (``s``, ``b``): they fold where the model refers to them."""
    if not sets:
        return []
    sets = {k: Fraction(v) for k, v in sets.items()}
    bound = {k for k, _ in spec.bindings}
    rebound = rebind(spec, {k: v for k, v in sets.items() if k in bound})
    cx = Context(spec.file, dict)
    vals = Values(cx)
    vals.values = {**{k: ir.const(v) for k, v in sets.items()}, **dict(rebound.bindings)}
    axes = spec.mesh.names if spec.mesh is not None else ()
    for name, v in sets.items():
        if name in axes and (v.denominator != 1 or v < 1):
            axis = spec.mesh.axis(name)
            span = axis.size.span if isinstance(axis.size, ir.Const) and axis.size.span.line else axis.span
            cx.error(Code.BAD_AXIS_SIZE, f"the size of axis '{name}' must be a positive integer, not {_shown(v)}", span)
    if cx.diags:  # sizes that are no sizes: the shapes are not judged over them
        return _finish(cx.diags, sets, origin)
    if rebound.mesh is not None:
        check_sizes(rebound.mesh, vals)
    if rebound.model is not None:
        check_model_values(rebound.model, vals, cx.error)
    for plan in rebound.plans:
        check_shapes(plan, vals, cx.error)
    return _finish(cx.diags, sets, origin)


def shape_names(spec: ir.Spec) -> frozenset[str]:
    """The names whose values ``rebinding_diagnostics`` can depend on: the axes a plan or an
    expert group gives a role other than data, and every name the transformer shape, the
    sequence, a schedule's chunks or an axis size written as an expression refers to (through
    lets). A re-binding of other names alone meets the checks whenever the spec does (a
    sweep judges each distinct setting of these names once)."""
    out: set[str] = set()
    values: list = []
    for plan in spec.plans:
        out.update(a for a in plan.mesh.names if plan.role(a) is not ir.Role.DATA)
        if plan.schedule is not None:
            values.append(plan.schedule.chunks)
        values += [a.size for a in plan.mesh.axes if not isinstance(a.size, ir.Const)]
    model = spec.model
    if model is not None:
        out.update(a for g in model.groups for a, _ in g.roles)
        values.append(model.seq)
        t = model.transformer
        if t is not None:
            values += [getattr(t, f.name) for f in fields(t)]
    pending = [n for v in values if isinstance(v, ir.Value) for n in ir.symbols(v)]
    bindings = spec.binding_map
    while pending:
        n = pending.pop()
        if n not in out:
            out.add(n)
            if isinstance(bindings.get(n), ir.Value):
                pending += ir.symbols(bindings[n])
    return frozenset(out)


def _finish(diags: list[Diagnostic], sets: Mapping[str, Fraction], origin: str | None) -> list[Diagnostic]:
    note = origin or ("the value given by " if len(sets) == 1 else "the values given by ") + " ".join(
        f"--set {k}={_shown(v)}" for k, v in sets.items())
    out: list[Diagnostic] = []
    for d in sorted(diags, key=lambda d: (d.span.line, d.span.column)):
        d = Diagnostic(d.code, d.message, d.span, d.severity, d.notes + (note,))
        if d not in out:  # a plan extended by another is judged once
            out.append(d)
    return out


def sources(spec: ir.Spec) -> dict[str, str]:
    """The texts a diagnostic of ``spec`` may show a line of: the spec's file and its inputs."""
    out = dict(spec.inputs)
    try:
        path = Path(spec.file)
        if path.is_file():
            out[spec.file] = path.read_text()
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return out


def check_rebinding(spec: ir.Spec, sets: Mapping[str, Fraction], extra_notes: tuple[str, ...] = ()) -> None:
    """Raise ``DiagnosticError`` (exit 2) with ``rebinding_diagnostics`` when there are any;
    ``extra_notes`` go on the first (e.g. every invalid point of a sweep)."""
    diags = rebinding_diagnostics(spec, sets)
    if diags:
        first = diags[0]
        diags[0] = Diagnostic(first.code, first.message, first.span, first.severity, first.notes + extra_notes)
        raise DiagnosticError(diags, sources(spec))


def rebound(spec: ir.Spec, sets: Mapping[str, Fraction]) -> ir.Spec:
    """``spec`` with ``sets`` applied (``ir.rebinding.rebind``), after ``check_rebinding``."""
    check_rebinding(spec, sets)
    return rebind(spec, sets)
