"""A spec with some of its lets and axis sizes re-bound to numbers (``--set NAME=VALUE``).

Input: a checked ``ir.Spec`` and re-bindings (name -> exact number; the names are lets or
mesh axes of the spec, already checked by ``commands.options``). Output: the same spec with
each named binding's value replaced by its number, and each named axis of the spec's mesh
and of every plan's mesh given that size. Values that refer to a re-bound name (a let
``n = dp * 2``, an axis ``dp = n``) keep their expression and so fold to the new number.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Mapping

from . import nodes as ir


def rebind(spec: ir.Spec, sets: Mapping[str, Fraction]) -> ir.Spec:
    """``spec`` with ``sets`` applied (``spec`` itself when there is nothing to apply)."""
    if not sets:
        return spec
    consts = {name: ir.const(v) for name, v in sets.items()}

    def mesh(m: ir.Mesh | None) -> ir.Mesh | None:
        if m is None or not any(a.name in consts for a in m.axes):
            return m
        return replace(m, axes=tuple(replace(a, size=consts[a.name]) if a.name in consts else a for a in m.axes))

    return replace(spec, bindings=tuple((k, consts.get(k, v)) for k, v in spec.bindings), mesh=mesh(spec.mesh),
                   plans=tuple(replace(p, mesh=mesh(p.mesh)) for p in spec.plans))
