"""The search's evaluation step: each structure derived (or read from the structure cache) as a
program, the programs of structures over the same rows merged and compiled, then evaluated over
the size assignments the divisibility mask keeps."""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable

from ..diagnostics import DiagnosticError
from . import program
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


def evaluate(groups: dict, block: str, space: Space, texts: dict, tick, programs: Callable,
             clock: Callable[[], float] = time.perf_counter,
             prefetch: Callable[[list[str]], None] | None = None) -> tuple[list, float, float]:
    """Each structure derived (or read from the structure cache) as a program, then evaluated
    over the rows the divisibility mask keeps: [(structure, sizes, values)] in ``groups``'
    order, and the seconds of the two steps (merging and compiling the programs counted with
    the derivations). ``programs(text)``: a structure's program (``search.program``), or a
    function of the size columns where its forms have none; ``clock``: the timer.

    The structures over the same grid rows (one part of the grid, ``enumeration``: every data
    strategy, recompute and optimizer of it) share most of their terms (the kernel model, the
    shape's sizes, the collectives' volumes): their programs are merged into one, each shared
    operation computed once, and evaluated once over the rows any of them keeps; each
    structure then takes its own rows and outputs. Every operation is elementwise, so a row's
    figures do not depend on the rows beside it: each is the number its own program gives.
    ``prefetch(texts)``, given, is called with every structure's spec text first (the search derives
    the ones it has not met on several processes there, ``search.parallel``)."""
    import numpy as np

    derive_s = 0.0
    evaluate_s = 0.0
    found = []  # (structure, the part's sizes, its valid rows, its program)
    d0 = clock()
    for s in groups:
        texts[s] = spec_text(block, s, {}, space.device, space.mfu)
    if prefetch is not None:
        prefetch([texts[s] for s in groups])
    derive_s += clock() - d0
    for n, (s, (sizes, valid)) in enumerate(groups.items()):
        tick(n, f"deriving {s.strategy}, recompute {s.recompute}" + (f", {s.schedule}" if s.schedule else ""))
        d0 = clock()
        try:
            found.append((s, sizes, valid, programs(texts[s])))
        except DiagnosticError:
            # the structure's spec holds a size its rows share (K/V heads copied at that tensor
            # size): a file that refuses it refuses every row of the structure
            pass
        derive_s += clock() - d0
    together: dict = {}  # a part's sizes (the array enumeration shares) -> the structures over them
    for i, (_, sizes, _, prog) in enumerate(found):
        together.setdefault(("own", i) if callable(prog) else id(sizes), []).append(i)
    values: dict = {}
    for members in together.values():
        d0 = clock()
        progs = [found[i][3] for i in members]
        if callable(progs[0]):  # lambdified forms: a function of the columns, one by one
            lambdified, width = progs[0], 4
            run = None
        else:
            merged = program.merge(progs)
            run, width = program.compile(merged), len(merged["outputs"])
        sizes = found[members[0]][1]
        union = np.logical_or.reduce([found[i][2] for i in members])
        rows = sizes[union]
        d1 = clock()
        derive_s += d1 - d0
        cols = [rows[:, i].astype(np.float64) for i in range(len(SIZE_SYMBOLS))]
        out = np.empty((len(rows), width))
        # in blocks that stay in the cache (temporaries above ~128 KiB are fresh pages every time)
        with np.errstate(all="ignore"):  # a piecewise form evaluates every branch, a refused one too
            for a in range(0, len(rows), EVAL_BLOCK):
                chunk = [c[a:a + EVAL_BLOCK] for c in cols]
                for k, x in enumerate(run(chunk) if run is not None else lambdified(*chunk)):
                    out[a:a + EVAL_BLOCK, k] = x
        for m, i in enumerate(members):
            keep = found[i][2][union]
            values[i] = (rows[keep], out[keep][:, 4 * m:4 * m + 4])
        evaluate_s += clock() - d1
    return [(found[i][0], *values[i]) for i in range(len(found))], derive_s, evaluate_s
