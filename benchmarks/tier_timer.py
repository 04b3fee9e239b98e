"""A pytest plugin that records each test's CPU time: ``-p tier_timer`` with ``benchmarks/`` on
``PYTHONPATH`` and ``TIER_TIMER_OUT`` naming a file. Every process (the run, or each pytest-xdist
worker) appends one JSON line per test: its node id, the CPU time of its setup, call and teardown in
the process (``time.process_time``) plus that of the subprocesses it waited for (``getrusage`` of the
children), and the worker's id. Read by ``benchmarks/bench_quick_tier.py``."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu()
    yield
    out = os.environ.get("TIER_TIMER_OUT")
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        line = json.dumps({"test": item.nodeid, "cpu": _cpu() - start, "worker": worker})
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
