"""Every example in docs/costs.md runs and prints what the page says."""

import doctest


def test_costs_md_examples():
    res = doctest.testfile("../docs/costs.md", optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted >= 10
    assert res.failed == 0
