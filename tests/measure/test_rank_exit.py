"""A rank that dies in teardown after every rank marked its results complete loses nothing;
a rank that dies before (or a run where some rank never marked) is a failed run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from placement_logic.measure.runner import LaunchError, wait_for


def _procs(codes):
    # each child exits with the given status (abort for -6), writing nothing to stdout
    scripts = {0: "pass", 1: "import sys; sys.stderr.write('boom\\n'); sys.exit(1)",
               -6: "import os, sys; sys.stderr.write('terminate called without an active exception\\n'); "
                   "sys.stderr.flush(); os.abort()"}
    return [subprocess.Popen([sys.executable, "-c", scripts[c]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True) for c in codes]


def test_teardown_abort_after_every_marker_stands(tmp_path: Path):
    for rank in range(2):
        (tmp_path / f"done.{rank}").write_text("")
    wait_for(_procs([0, -6]), str(tmp_path))  # no error: both ranks' results were complete


def test_abort_before_a_marker_fails_the_run(tmp_path: Path):
    (tmp_path / "done.0").write_text("")
    with pytest.raises(LaunchError) as err:
        wait_for(_procs([0, -6]), str(tmp_path))
    assert "rank 1 exited with status -6: terminate called without an active exception" in str(err.value)


def test_clean_failure_is_reported(tmp_path: Path):
    with pytest.raises(LaunchError, match="rank 0 exited with status 1: boom"):
        wait_for(_procs([1, 0]), str(tmp_path))
