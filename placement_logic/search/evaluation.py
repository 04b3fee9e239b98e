"""The search's evaluation step: each structure derived (or read from the structure cache) and
compiled, then evaluated over the size assignments the divisibility mask keeps."""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable

from ..diagnostics import DiagnosticError
from .space import SIZE_SYMBOLS, Space
from .specs import spec_text

EVAL_BLOCK = 8192  # rows evaluated at once


@contextlib.contextmanager
def fewer_collections():
    """Python's cycle collector run less often while structures are derived: sympy allocates
    millions of short-lived objects, and at the default thresholds each derivation pays many
    young-generation passes and a full pass every few structures over every object alive
    (the interpreter's own, sympy's caches, every structure kept). Nothing a derivation
    computes depends on when the collector runs; the thresholds are restored after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 20_000), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def evaluate(groups: dict, block: str, space: Space, texts: dict, tick, evaluator: Callable,
             clock: Callable[[], float] = time.perf_counter) -> tuple[list, float, float]:
    """Each structure derived (or read from the structure cache) and compiled, then evaluated
    over the rows the divisibility mask keeps: [(structure, sizes, values)], and the seconds of
    the two steps. ``evaluator(text)``: a structure's compiled forms, from its spec text; ``clock``: the
    timer of the two steps."""
    import numpy as np

    parts = []
    derive_s = 0.0
    evaluate_s = 0.0
    for n, (s, (sizes, valid)) in enumerate(groups.items()):
        tick(n, f"deriving {s.strategy}, recompute {s.recompute}" + (f", {s.schedule}" if s.schedule else ""))
        d0 = clock()
        texts[s] = spec_text(block, s, {}, space.device, space.mfu)
        try:
            fn = evaluator(texts[s])
        except DiagnosticError:
            # the structure's spec holds a size its rows share (K/V heads copied at that tensor
            # size): a file that refuses it refuses every row of the structure
            continue
        d1 = clock()
        derive_s += d1 - d0
        # only the rows the divisibility mask keeps are evaluated (every operation is elementwise:
        # a row's figures do not depend on the rows beside it)
        sizes = sizes[valid]
        cols = [sizes[:, i].astype(np.float64) for i in range(len(SIZE_SYMBOLS))]
        vals = np.empty((len(sizes), 4))
        # in blocks that stay in the cache (temporaries above ~128 KiB are fresh pages every time)
        with np.errstate(all="ignore"):  # a piecewise form evaluates every branch, a refused one too
            for a in range(0, len(sizes), EVAL_BLOCK):
                for k, x in enumerate(fn(*(c[a:a + EVAL_BLOCK] for c in cols))):
                    vals[a:a + EVAL_BLOCK, k] = x
        evaluate_s += clock() - d1
        parts.append((s, sizes, vals))
    return parts, derive_s, evaluate_s
