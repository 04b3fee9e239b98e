"""Every example in docs/api.md runs and prints what the page says (from the repository root)."""

import doctest
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_api_md_examples(monkeypatch):
    monkeypatch.chdir(ROOT)
    res = doctest.testfile(str(ROOT / "docs" / "api.md"), module_relative=False,
                           optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted >= 10
    assert res.failed == 0
    assert os.getcwd() == str(ROOT)
