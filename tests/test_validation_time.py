"""docs/validation_time.md: every published run recomputed, its printed figures checked, and the
model's mean and maximum error against the measured times held to what the document states."""

from __future__ import annotations

from fractions import Fraction

import pytest

from placement_logic.costs.steptime import MODEL_ERROR
from tests.validation_time import DOC, errors, predicted, runs, summary_lines

RUNS = runs()
# the tolerance is what the model achieves on this set (docs/validation_time.md), not the goal (5 % and 10 %)
MEAN = Fraction(27, 1000)
MAX = Fraction(7, 100)
MEAN_HELD_OUT = Fraction(3, 100)


def test_the_document_lists_the_runs():
    assert len(RUNS) >= 20
    by = {s: [r for r in RUNS if r.source == s] for s in ("K22 T5", "N21 T1", "N21 T2")}
    assert sum(map(len, by.values())) == len(RUNS)
    # the measured times as Table 5 of Korthikanti et al. (2022) prints them, in the table's order
    assert [r.published for r in by["K22 T5"]] == ["1.42 s", "1.10 s", "18.13 s", "13.75 s", "49.05 s", "37.83 s",
                                                    "94.42 s", "71.49 s"]
    # Table 1 of Narayanan et al. (2021): TFLOP/s per GPU, and its aggregate PFLOP/s column (GPUs × that)
    t1 = by["N21 T1"]
    assert [r.published for r in t1] == [f"{x} TFLOP/s" for x in (137, 138, 142, 135, 138, 140, 148, 155, 163, 163)]
    aggregate = [Fraction(x) for x in ("4.4", "8.8", "18.2", "34.6", "70.8", "143.8", "227.1", "297.4", "410.2",
                                       "502.0")]
    for r, pf in zip(t1, aggregate):  # both rounded: half a TFLOP/s per GPU, 0.05 PFLOP/s
        assert abs(r.gpus * Fraction(r.published.split()[0]) / 1000 - pf) <= Fraction(r.gpus, 2000) + Fraction(1, 20)
    for r in RUNS:
        assert r.gpus % (r.tp * r.pp) == 0 and r.layers % (r.pp * r.chunks) == 0
        assert r.batch % (r.micro * r.dp) == 0
        assert (r.ddp == "-") == (r.dp == 1)
        if r.chunks > 1:  # the interleaved schedule needs the microbatches in multiples of the stages
            assert (r.batch // (r.micro * r.dp)) % r.pp == 0


def test_seconds_from_throughput_match_the_published_figures():
    """Narayanan et al. (2021) quote 1T on 3,072 GPUs at 502 PFLOP/s: the iteration time the page
    derives from 163 TFLOP/s per GPU is the paper's FLOP count over that aggregate, within its rounding."""
    one_t = next(r for r in RUNS if r.source == "N21 T1" and r.name == "1T")
    b, s, ll, h, v = 3072, 2048, 128, 25600, 51200
    flops = 96 * b * s * ll * h * h + 16 * b * s * s * ll * h + 6 * b * s * h * v  # eq. (3), expanded
    assert abs(float(one_t.measured) - flops / 502.0e15) / (flops / 502.0e15) < 0.005
    for r in RUNS:
        assert f"{float(r.measured):.2f}" == r.shown_measured


@pytest.mark.parametrize("r", RUNS, ids=[f"{i}-{r.name}-{r.mode}" for i, r in enumerate(RUNS, 1)])
def test_each_row_is_what_the_model_predicts(r):
    p = predicted(r)
    assert abs(float(p) - float(r.shown)) <= 0.005, (float(p), r.shown)
    e = (p - r.measured) / r.measured
    assert r.error == f"{100 * float(e):+.1f} %"
    assert abs(e) <= MAX


def test_mean_and_max_error():
    errs = errors(RUNS)
    mean, worst = sum(errs) / len(errs), max(errs)
    held = errors([r for r in RUNS if r.source != "K22 T5"])
    print(f"step-time model on {len(RUNS)} published runs: mean error {float(mean):.1%}, max {float(worst):.1%}; "
          f"held out: mean {float(sum(held) / len(held)):.1%}, max {float(max(held)):.1%}")
    assert mean <= MEAN and worst <= MAX and sum(held) / len(held) <= MEAN_HELD_OUT
    assert worst <= MODEL_ERROR["kernels"]  # search's error band covers every row
    text = DOC.read_text()
    for line in summary_lines(RUNS):
        assert line in text, line


def test_the_single_mfu_convention_is_reproduced():
    """The model before the kernel model, kept as a convention: MFU 1/2 of the fp16 peak."""
    errs = errors(RUNS, "  mfu = 1/2\n")
    assert max(errs) > Fraction(4, 10)  # the trend the kernel model removes: off by over 40 % at 1T
    assert max(errs) <= MODEL_ERROR["mfu"]
    assert sum(errs) / len(errs) > 3 * sum(errors(RUNS)) / len(RUNS)
