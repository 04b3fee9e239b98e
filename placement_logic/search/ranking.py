"""The search's ranking: the model's error band, the ties ordered by robustness, and rows of two
strategies with the same figures shown as one."""

from __future__ import annotations

from fractions import Fraction

from ..costs import steptime
from .space import Space


def error_band(space: Space) -> Fraction:
    """The model's largest error on the published measured runs (docs/validation_time.md): under
    it two predicted step times do not tell which configuration is faster."""
    return steptime.MODEL_ERROR["mfu" if space.mfu is not None else "kernels"]


def by_robustness(rows: list, band: Fraction) -> list:
    """The re-derived rows, the ties first: every row whose exact step time is within ``band`` of
    the fastest, ordered by robustness (less communication on the critical path, then less memory,
    so more headroom, then step time), then the others in their order (by step time)."""
    if not rows:
        return rows
    best = min(c.exact_step for c in rows)
    tied = [c for c in rows if c.exact_step <= best * (1 + band)]
    ids = {id(c) for c in tied}
    tied.sort(key=lambda c: (c.exposed, c.exact_memory, c.exact_step))
    return tied + [c for c in rows if id(c) not in ids]


def same_row(parts, a: tuple, b: tuple) -> bool:
    """Rows of two strategies with the same sizes, recompute, schedule and layout whose
    vectorised memory and step time are equal (zero3 and fsdp, say): one row naming both,
    once their exact figures agree too."""
    (sa, za, va), (sb, zb, vb) = parts[a[0]], parts[b[0]]
    same_shape = (sa.recompute, sa.schedule, sa.axes, sa.folded, sa.optimizer, sa.facts) == \
        (sb.recompute, sb.schedule, sb.axes, sb.folded, sb.optimizer, sb.facts)
    return (sa.strategy != sb.strategy and same_shape and bool((za[a[1]] == zb[b[1]]).all())
            and va[a[1], 0] == vb[b[1], 0] and va[a[1], 1] == vb[b[1], 1])
