"""The installed wheel (not the source tree) carries and loads the canonical grammar
and the strategy library."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (path,) = out.glob("placement_logic-*.whl")
    return path


@pytest.mark.slow
def test_wheel_ships_the_canonical_grammar(wheel):
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("placement_logic/grammar/placement.lark").decode()
        names = zf.namelist()
    assert shipped == (ROOT / "grammar" / "placement.lark").read_text()
    assert "placement_logic/stdlib/data.place" in names


@pytest.mark.slow
def test_installed_wheel_loads_its_own_grammar(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    probe = (
        "import placement_logic, placement_logic.frontend.parser as p\n"
        "from importlib import resources\n"
        "assert placement_logic.__file__.startswith(%r), placement_logic.__file__\n"
        "assert resources.files('placement_logic').joinpath('grammar', 'placement.lark').is_file()\n"
        "from placement_logic.frontend.loader import load_string\n"
        "spec = load_string('from std.data import zero3\\nmodel { params = 1e9 }\\nmesh { dp = 8 }\\n"
        "plan p { dp: zero3 }\\n')\n"
        "print(spec.plans[0].placement('params').modes)\n"
    ) % str(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "S*" in result.stdout


def test_the_documented_install_lines_work_from_a_clone():
    """Every `pip install` of the project in the tutorial and README installs the clone ('.'),
    never a package named on a public index, and asks only for extras pyproject.toml defines."""
    import re
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    lines = []
    for doc in (ROOT / "docs" / "tutorial.md", ROOT / "README.md"):
        lines += [m.group(1) for m in re.finditer(r"pip install (?:-e )?'?([^\s'`]+)'?", doc.read_text())]
    assert ".[proofs]" in lines
    for target in lines:
        assert not target.startswith("placement-logic"), target
        m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
        assert m is not None, target
        assert set(filter(None, (m.group(1) or "").split(","))) <= extras, target
