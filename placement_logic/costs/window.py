"""The share of the attention's score matrix a masked kernel computes (``attention { window = W }``).

With causal masking the time model counts half of the s × s scores (the convention: a kernel skips the masked
blocks, docs/costs.md). Under a sliding window of W keys a query p attends min(p + 1, W) keys, so the exact share
is Σ_p min(p + 1, W) / s² = (W(W + 1)/2 + (s − W)·W) / s² where W < s; a window of s or more keys never binds and
the share is the causal half. Averaged over the context ranks as the causal half is (the busiest rank's own
count is not taken). The independent check: tests/test_steptime.py counts the unmasked pairs one by one.
"""

from __future__ import annotations

import sympy

from .symbolic import to_sympy

HALF = sympy.Rational(1, 2)


def causal_share(s: sympy.Expr, window=None) -> sympy.Expr:
    """The share of the s × s scores computed with causal masking and, where the model states one, the window
    (an ir.Value or a sympy number; None: none)."""
    if window is None:
        return HALF
    w = window if isinstance(window, sympy.Basic) else to_sympy(window)
    exact = (w * (w + 1) / 2 + (s - w) * w) / s**2
    return sympy.Piecewise((exact, w < s), (HALF, True))


def of(plan):
    """The model's window (an ir.Value), or None."""
    return plan.model.attention_window[0] if plan.model.attention_window is not None else None
