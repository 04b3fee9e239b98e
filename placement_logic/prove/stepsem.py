"""A small explicit step semantics, on the checker's step model, for one parameter element.

Input: a ``check.steps.StepModel`` (what a plan does: per parameter group the
dimensions its gradient is computed over, their kinds, how often each is reduced, the
loss normaliser and divisor; the re-gather behaviour), concrete dimension sizes, and
per-device token counts and gradient contributions. Output: the gradient that enters
the observer's update, the single-device (global-batch mean) gradient, and the value a
replica holds after an SGD step — written once over a small arithmetic interface so the
same code builds z3 terms (for the solver) and exact Fractions (to replay a witness).

Devices are the cells of the grid of the group's token and split dimensions (data,
context, expert-data axes and the microbatches). Device ``d`` contributes ``X_d / n(d)``,
where ``n(d)`` sums the token counts over ``d``'s normalisation group (every device for
the global mean, ``d``'s own microbatches for a per-device mean), times the size of each
repeated reduction of the count (``repeat``: a count already summed over an axis, or
replicated there, is multiplied by its size when reduced there again, as ``check.encode``
and ``check.replay`` count it; docs/semantics.md). The observer (all
coordinates 0) sums those over the devices it reduces with (dimensions with ``k ≥ 1``),
multiplied by ``n^(k-1)`` per reduced dimension and ``n^k`` per invariant one, and
divides by the divisor. The single-device gradient is ``Σ X_d / Σ N_d``.
"""

from __future__ import annotations

from itertools import product
from typing import Any, Callable

from ..check import steps

Cell = tuple[int, ...]


def grid(g: steps.GroupModel, sizes: dict[str, int]) -> tuple[list[steps.GradDim], list[Cell]]:
    dims = [d for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT) and not d.tie]
    cells = list(product(*[range(_size(d, sizes)) for d in dims]))
    return dims, cells


def _size(d: steps.GradDim, sizes: dict[str, int]) -> int:
    return sizes[d.axis if d.axis else steps.MICROBATCHES]


def device_gradient(g: steps.GroupModel, sizes: dict[str, int], counts: dict[Cell, Any], contrib: dict[Cell, Any],
                    divisor: Any, zero: Any) -> Any:
    """The observer's reduced gradient for one element of group ``g``."""
    dims, cells = grid(g, sizes)
    obs = tuple(0 for _ in dims)
    if g.objective != "mean":
        raise ValueError(f"stepsem models the token-mean objective only, not {g.objective!r} ({g.group})")
    reduced = {i for i, d in enumerate(dims) if d.k >= 1 and not d.implicit}
    norm = {i for i, d in enumerate(dims) if d.kind == steps.TOKEN and d.name in g.norm_dims}
    times = repeat(g, sizes)

    def same_except(a: Cell, b: Cell, free: set[int]) -> bool:
        return all(x == y for i, (x, y) in enumerate(zip(a, b)) if i not in free)

    total = zero
    for c in cells:
        if not same_except(c, obs, reduced):
            continue
        n = zero
        for c2 in cells:
            if same_except(c2, c, norm):
                n = n + counts[c2]
        total = total + contrib[c] / (n * times if times != 1 else n)
    mult = 1
    for i, d in enumerate(dims):
        if i in reduced:
            mult *= _size(d, sizes) ** (d.k - 1)
    for d in g.dims:
        if d.kind == steps.INVARIANT:
            mult *= _size(d, sizes) ** d.k
    return total * mult / divisor


def repeat(g: steps.GroupModel, sizes: dict[str, int]) -> int:
    """The factor the repeated reductions of g's token count multiply it by: ``n^(t-1)`` for a token
    dimension of the grid named ``t`` times in ``g.norm_dims`` (the first reduction sums its
    different counts), ``n^t`` for any other dimension (the count is already the same there)."""
    token = {d.name: d for d in g.dims if d.kind == steps.TOKEN and not d.tie}
    out = 1
    for name in dict.fromkeys(g.norm_dims):  # each name once; its multiplicity read from the tuple
        t = g.norm_dims.count(name)
        d = token.get(name) or next((x for x in g.dims if x.name == name), None)
        n = _size(d, sizes) if d is not None else sizes[name]
        out *= n ** (t - 1 if name in token else t)
    return out


def global_gradient(cells: list[Cell], counts: dict[Cell, Any], contrib: dict[Cell, Any], zero: Any) -> Any:
    t, x = zero, zero
    for c in cells:
        t = t + counts[c]
        x = x + contrib[c]
    return x / t


def divisor_of(g: steps.GroupModel, sizes: dict[str, int], value: Callable[[Any], Any]) -> Any:
    if g.divisor_value is not None:
        return value(g.divisor_value)
    out = 1
    for a in g.divisor_axes:
        out *= sizes[a]
    return out


def stale_axes(step: steps.StepModel, sizes: dict[str, int]) -> tuple[str, ...]:
    """Axes on which a replica that does not own the optimizer shard keeps a stale copy."""
    return tuple(a for a in step.regather_needed if a not in step.regather_axes and sizes.get(a, 1) >= 2)
