"""Shared test setup: results are never read from the user's result cache, so every test
exercises the derivation itself (tests/test_cost_cache.py tests the cache, in a scratch folder);
and text output is laid out as it is for a pipe (no $COLUMNS from the terminal the suite runs
in), so golden files and document examples compare alike everywhere."""

import os

os.environ["PLACEMENT_NO_CACHE"] = "1"
os.environ.pop("COLUMNS", None)
