"""The search's structures derived in worker processes: each structure's derivation (sympy's,
about 25 ms of CPU for a 70B model) is independent of every other, so a first search (an empty
structure cache) derives them on several cores, each worker returning the structure's program
(``search.program``'s plain data). A worker inherits the parent's imports and caches (``fork``,
where the platform has it; else ``spawn``, which imports the tool again in each worker), and
writes each program to the structure cache as the parent would. What a worker cannot hand back
(a structure its spec refuses, forms the program does not cover) the parent derives itself, so
the result is the serial search's: every figure is its own structure's program, however it was
derived."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

# fewer structures than this per worker are derived in the process itself: a pool's start-up
# (forking and handing the texts over) costs about what two derivations do
PER_WORKER = 4


def default_jobs() -> int:
    """The worker processes a search starts by default: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def derive_all(texts: list[str], derive: Callable[[str], object], jobs: int,
               tick: Callable[[int, str], None]) -> dict[str, object]:
    """``derive(text)`` of every text on ``jobs`` worker processes (in the order given, ``tick(n,
    label)`` as each ends): {text: its result}; ``{}`` when there are too few texts for the workers
    to pay for themselves (``PER_WORKER``), or one job. ``derive`` is a module-level function."""
    jobs = min(jobs, len(texts) // PER_WORKER)
    if jobs < 2:
        return {}
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    out: dict[str, object] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method)) as pool:
        for n, (text, result) in enumerate(zip(texts, pool.map(derive, texts, chunksize=2))):
            tick(n, "deriving structures on %d processes" % jobs)
            out[text] = result
    return out
