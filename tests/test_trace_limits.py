"""`placement trace` bounded: a script that prints without end and never finishes, and starts a
child that outlives it, is stopped at --rank-timeout with every process of its group gone."""

from __future__ import annotations

import io
import os
import subprocess
import time

import pytest

from placement_logic.cli import main

SCRIPT = """\
import subprocess, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open({pids!r} + str(dist.get_rank()), "w").write(str(child.pid))
for i in range(200_000):
    print("x" * 100, flush=False)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for every purpose here
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


@pytest.mark.torch
@pytest.mark.slow
def test_a_hanging_script_is_stopped_with_its_children(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "hang.py"
    script.write_text(SCRIPT.format(pids=str(tmp_path / "child")))
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    status = main(["trace", "--nproc", "2", "--rank-timeout", "15", "--", "python", str(script)], out, err)
    took = time.monotonic() - start
    assert status == 2 and "[PL613]" in err.getvalue() and "did not finish within 15 s" in err.getvalue()
    assert took < 60
    pids = [int((tmp_path / f"child{r}").read_text()) for r in range(2) if (tmp_path / f"child{r}").exists()]
    assert pids, "the script never started its children"
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)


def test_rank_timeout_is_validated():
    err = io.StringIO()
    assert main(["trace", "--nproc", "2", "--rank-timeout", "-3", "--", "python", __file__], io.StringIO(), err) == 2
    assert "[PL500]" in err.getvalue() and "--rank-timeout -3" in err.getvalue()


@pytest.mark.torch
@pytest.mark.slow
def test_an_unobserved_loss_normalisation_is_never_proved(monkeypatch):
    """examples/traced/accum_mse.py: accumulation with an MSE loss not divided by the micro-steps. The trace
    records no cross-entropy, so the normalisation is not observed: named, and the verdict unknown (exit 3)."""
    pytest.importorskip("torch")
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)
    out, err = io.StringIO(), io.StringIO()
    status = main(["trace", "--nproc", "2", "--check", "--", "python", "examples/traced/accum_mse.py"], out, err)
    text = out.getvalue() + err.getvalue()
    assert status == 3, text
    assert "the loss normalisation" in text and "no cross-entropy" in text
    assert "proved for all mesh sizes" not in out.getvalue()
    assert out.getvalue().rstrip().splitlines()[-1].startswith("verdict for examples/traced/accum_mse.py: UNKNOWN")


@pytest.mark.torch
@pytest.mark.slow
def test_optimizer_sharding_by_hand_is_never_proved(monkeypatch):
    """examples/traced/zero1_by_hand_no_sync.py: each rank steps its own share and never sends it back (the
    replicas diverge). Its parameter sets differ along dp: named as not lifted, verdict unknown (exit 3)."""
    pytest.importorskip("torch")
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out, err = io.StringIO(), io.StringIO()
    status = main(["trace", "--nproc", "2", "--check", "--", "python", "examples/traced/zero1_by_hand_no_sync.py"],
                  out, err)
    assert status == 3, out.getvalue() + err.getvalue()
    assert "the optimizer over dp" in err.getvalue() and "step different parameters" in err.getvalue()
    assert "proved for all mesh sizes" not in out.getvalue()
