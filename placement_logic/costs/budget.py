"""Time limits on sympy: each simplification or solution of a user's expression runs under a
budget (5 s by default, ``--timeout`` of cost and compare for a block), and a call past it is
``OutOfTime``: its result is then unknown, never assumed, and never a hang.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

SYMPY_BUDGET = 5.0  # seconds one simplification or solution of a user's expression may take, by default
_budget = [SYMPY_BUDGET]  # the budget in force (``budget`` sets it for a block: cost and compare --timeout)


class OutOfTime(Exception):
    """A sympy call that ran past its budget (its result is then unknown, never assumed)."""


@contextmanager
def budget(seconds: float):
    """Within the block, each bounded sympy call may take ``seconds`` (``--timeout`` of cost and compare)."""
    _budget.append(seconds)
    try:
        yield
    finally:
        _budget.pop()


def bounded(fn: Callable[[], object], seconds: float | None = None):
    """``fn()``, or ``OutOfTime`` once ``seconds`` (default: the budget in force) have passed. The
    limit is a SIGALRM timer, so it applies on the main thread of a Unix process (where the CLI
    runs); elsewhere ``fn`` runs unbounded. Every simplification of a user's expression goes
    through here."""
    import signal
    import threading

    seconds = _budget[-1] if seconds is None else seconds

    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return fn()

    def expire(signum, frame):
        raise OutOfTime()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
