"""The aspects of gradient integrity: what a correct system does along each dimension, and a
group's step model with one aspect as the plan does it and the rest as derived.

Input: a ``steps.GroupModel``. Output: the aspects the per-aspect explanations of
``GI grads[g]`` judge, and the isolated group models they are encoded from.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from .steps import MICROBATCHES, NORMALISATION, SPLIT, TOKEN, GradDim, GroupModel


def correct_k(d: GradDim) -> int:
    """How often a correct system reduces along ``d``: once where contributions are partial
    (accumulated once over microbatches), never where the value is invariant or sharded or
    where the MoE all-to-all already sums it."""
    if d.name == MICROBATCHES:
        return 1
    return 1 if d.kind in (TOKEN, SPLIT) and not d.implicit else 0


def gi_aspects(g: GroupModel) -> tuple[str, ...]:
    """The GI obligations of a group: every dimension its contribution is split on or the
    plan reduces over, the microbatches, and the normalisation."""
    dims = tuple(d.name for d in g.dims
                 if d.name != MICROBATCHES and (d.kind in (TOKEN, SPLIT) or d.k >= 1))
    return dims + (MICROBATCHES, NORMALISATION)


def correct_normalisation(g: GroupModel) -> tuple[tuple[str, ...], tuple[str, ...], ir.Value | None]:
    """(norm_dims, divisor_axes, divisor_value) of the global token mean: the token count
    summed over every token dimension, no divisor; for a sum objective, nothing at all."""
    if g.objective == "sum":
        return (), (), None
    return tuple(d.name for d in g.dims if d.kind == TOKEN), (), None


def isolate(g: GroupModel, aspect: str) -> GroupModel:
    """``g`` with only ``aspect`` as the plan does it and everything else as a correct
    system does it: for a dimension, every other reduction is the correct one and the
    loss is the global token mean; for NORMALISATION, every reduction is correct."""
    if aspect == NORMALISATION:
        return replace(g, dims=tuple(replace(d, k=correct_k(d)) for d in g.dims))
    norm, div_axes, div_value = correct_normalisation(g)
    dims = tuple(d if d.name == aspect else replace(d, k=correct_k(d)) for d in g.dims)
    return replace(g, dims=dims, norm_dims=norm, divisor_axes=div_axes, divisor_value=div_value)
