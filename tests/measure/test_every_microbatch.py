"""`override grads: reduce_every_microbatch` measured: DDP without no_sync all-reduces its
buckets after each of the m backward passes, so the step's all-reduce bytes are m times the
gradient buffer, as predicted; the step is still the single-process step."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _spec(every: bool):
    from placement_logic.frontend.loader import load_string

    text = (ROOT / "examples" / "library" / "ddp.place").read_text().replace("microbatches = 1", "microbatches = 4")
    if every:
        text = text.replace("  dp: ddp\n", "  dp: ddp\n  override grads: reduce_every_microbatch\n")
    return load_string(text, "ddp_every.place")


@pytest.mark.torch
@pytest.mark.slow
def test_all_reduce_after_every_microbatch_is_measured():
    pytest.importorskip("torch")
    from placement_logic.measure.session import measure_many

    once, every = measure_many([(_spec(False), "ddp")], steps=2)[0], measure_many([(_spec(True), "ddp")], steps=2)[0]
    rows = {}
    for name, rep in (("once", once), ("every", every)):
        assert rep.outcome == "matched", rep
        [row] = [r for r in rep.rows if r.quantity.startswith("all_reduce over dp")]
        assert row.status == "match" and row.predicted == row.measured
        rows[name] = row.measured
    # the harness runs 2 microbatches per step: two all-reduces of the whole gradient buffer instead of one
    assert rows["every"] == 2 * rows["once"]
    assert "no no_sync" in every.implementation
    assert every.equivalence.within
