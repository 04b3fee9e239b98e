"""Shared test setup: results are never read from the user's result cache, so every test
exercises the derivation itself (tests/test_cost_cache.py tests the cache, in a scratch folder)."""

import os

os.environ["PLACEMENT_NO_CACHE"] = "1"
