"""The tree is clean under the project's ruff rules (pyproject.toml: pyflakes, import order,
bugbear, McCabe complexity), as CI runs them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff_available() -> bool:
    return shutil.which("ruff") is not None or subprocess.run(
        [sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode == 0


def test_ruff_is_clean():
    if not _ruff_available():
        pytest.skip("ruff is not installed (it comes with the test extra)")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# McCabe complexity: every function of the package is held to COMPLEXITY (pyproject.toml's max-complexity
# holds the whole tree to the same); a longer body is split into named steps.
COMPLEXITY = 20


def test_package_complexity():
    if not _ruff_available():
        pytest.skip("ruff is not installed (it comes with the test extra)")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "C901", "--output-format", "json",
                          "--config", f"lint.mccabe.max-complexity={COMPLEXITY}", "placement_logic"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    over = {}
    for d in json.loads(out.stdout):
        assert d["code"] == "C901", d
        name = re.match(r"`([^`]+)` is too complex", d["message"]).group(1)
        over[(Path(d["filename"]).resolve().relative_to(ROOT).as_posix(), name)] = d["message"]
    assert not over, f"functions over complexity {COMPLEXITY} (split them into named helpers): {over}"
