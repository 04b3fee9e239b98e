"""The test tiers' sizes (tests/conftest.py sets the tier before any test module is imported).

``examples(n)``: a property test's ``max_examples`` in the full tier; the quick tier draws a
tenth of them (at least 5), with the same derandomized seed, so the quick run tries the first
of the examples the full run tries."""

from __future__ import annotations

import os


def full() -> bool:
    return os.environ.get("PLACEMENT_TEST_TIER_RUNNING", "all") == "all"


def examples(n: int) -> int:
    return n if full() else max(5, n // 10)
