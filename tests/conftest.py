"""Shared test setup: results are never read from the user's result cache, so every test
exercises the derivation itself (tests/test_cost_cache.py tests the cache, in a scratch folder);
and text output is laid out as it is for a pipe (no $COLUMNS from the terminal the suite runs
in), so golden files and document examples compare alike everywhere.

Tiers: ``pytest`` alone runs the quick tier (no real PyTorch runs, no solver-heavy sweeps:
feedback in about a minute on 2 cores, and it passes without the torch extra);
``pytest --tier all`` (the README's command, and CI's) runs everything. A test is in the slow
tier when it is marked ``slow`` or ``torch``, or named in ``SLOW`` below (tests measured among
the slowest of the quick tier, kept whole rather than trimmed). ``-m EXPR`` selects by marker
as usual and overrides the tier."""

import os

os.environ["PLACEMENT_NO_CACHE"] = "1"
os.environ.pop("COLUMNS", None)

# node ids (or their prefixes) of unmarked tests that belong to the slow tier, by measured time
SLOW = (
)


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("quick", "all"), default=os.environ.get("PLACEMENT_TEST_TIER", "quick"),
                     help="quick (default): leave out the tests marked slow or torch; all: run every test")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    if config.getoption("--tier") == "all" or config.getoption("-m"):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("slow") or item.get_closest_marker("torch") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
