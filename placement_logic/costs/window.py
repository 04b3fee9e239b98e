"""The share of the attention's score matrix a masked kernel computes (``attention { window = W }``).

With causal masking the time model counts half of the s × s scores (the convention: a kernel skips the masked
blocks, docs/costs.md). Under a sliding window of W keys a query p attends min(p + 1, W) keys, so the exact share
is Σ_p min(p + 1, W) / s² = (W(W + 1)/2 + (s − W)·W) / s² where W < s; a window of s or more keys never binds and
the share is the causal half. Averaged over the context ranks as the causal half is (the busiest rank's own
count is not taken: the step-time model prices every rank at the group's average share of causal attention, the
contiguous layout's busiest rank included, so the zigzag window keeps that convention). Under chunked attention
(``attention { chunk = C }``, C < s) a query at offset i of its chunk attends i + 1 keys (min(i + 1, W) with a
window too): s = mC + r gives m·f(C) + f(r) over s², f(L) = Σ_{i<L} min(i + 1, W). The independent check:
tests/test_cost_window.py counts the unmasked pairs one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .symbolic import to_sympy

HALF = sympy.Rational(1, 2)


@dataclass(frozen=True)
class Chunked:
    """The model's chunked attention (``attention { chunk = C }``), with its window if it states one."""

    chunk: object  # ir.Value or a sympy number
    window: object = None


def _num(v):
    return v if isinstance(v, sympy.Basic) else to_sympy(v)


def _within(n: sympy.Expr, w) -> sympy.Expr:
    """Σ_{i<n} min(i + 1, W): the keys the first n queries of a chunk attend (W None: no window)."""
    tri = n * (n + 1) / 2
    if w is None:
        return tri
    return sympy.Piecewise((w * (w + 1) / 2 + (n - w) * w, w < n), (tri, True))


def causal_share(s: sympy.Expr, window=None) -> sympy.Expr:
    """The share of the s × s scores computed with causal masking and, where the model states one, the window
    (an ir.Value or a sympy number; None: none)."""
    if window is None:
        return HALF
    if isinstance(window, Chunked):
        c = _num(window.chunk)
        w = None if window.window is None else _num(window.window)
        m = sympy.floor(s / c)
        exact = (m * _within(c, w) + _within(s - m * c, w)) / s**2
        return sympy.Piecewise((exact, c < s), (causal_share(s, w), True))
    w = _num(window)
    exact = (w * (w + 1) / 2 + (s - w) * w) / s**2
    return sympy.Piecewise((exact, w < s), (HALF, True))


def of(plan):
    """The model's window (an ir.Value), its chunks (``Chunked``) where it states them, or None."""
    win = plan.model.attention_window[0] if plan.model.attention_window is not None else None
    if plan.model.attention_chunk is not None:
        return Chunked(plan.model.attention_chunk[0], win)
    return win


def words(plan) -> str:
    """The time model's assumption on the attention's masked share."""
    mask = of(plan)
    if isinstance(mask, Chunked):
        return "attention FLOPs of each query's keys in its chunk, Σ (p mod C) + 1 per sequence" + (
            " (min with the sliding window W)" if mask.window is not None else "")
    if mask is not None:
        return "attention FLOPs of the sliding window's keys, Σ min(p + 1, W) per sequence"
    return "attention FLOPs halved by causal masking"
