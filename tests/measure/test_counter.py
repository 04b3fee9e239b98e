"""The collective counter sees known collectives with their true kind, group and bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from placement_logic.measure.runner import free_port

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[2]


def test_counter_sees_known_collectives(tmp_path):
    port = str(free_port())
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    probe = Path(__file__).with_name("_counter_probe.py")
    procs = [subprocess.Popen([sys.executable, str(probe), str(tmp_path), str(r), "2", port], env=env,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for rank in range(2):
        records = json.loads(Path(tmp_path, f"{rank}.json").read_text())
        got = [(r["kind"], tuple(r["ranks"]), r["bytes"]) for r in records]
        assert got == [
            ("all_reduce", (0, 1), 1000 * 4),  # 1000 fp32 elements
            ("all_gather", (0, 1), 2 * 500 * 4),  # the gathered output
            ("reduce_scatter", (0, 1), 500 * 4),  # the full input
            ("broadcast", (0, 1), 10 * 8),  # fp64
            ("all_reduce", (0, 1), 300 * 4),  # a functional collective (DTensor's path)
            # point to point: (source, destination) and the tensor's bytes
            ("send" if rank == 0 else "recv", (0, 1), 100 * 4),  # send / recv
            ("send" if rank == 1 else "recv", (1, 0), 7 * 8),  # isend / irecv, fp64
            ("send", (rank, 1 - rank), 20 * 4),  # batch_isend_irecv: both ways at once
            ("recv", (1 - rank, rank), 20 * 4),
        ]
        # a tagged buffer takes its phase from the tag (pipeline schedules tag theirs)
        assert [r["phase"] for r in records[-2:]] == ["backward", ""]
        # an unknown collective (c10d reduce, which no plan's cost model has) fails the step by name
        refusal = Path(tmp_path, f"{rank}.refusal").read_text()
        assert refusal.startswith("UnknownCollective: the collective counter does not know c10d.reduce_")
