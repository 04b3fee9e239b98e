"""docs/validation_time.md: every published run recomputed, its printed figures checked, and the
model's mean and maximum error against the measured times held to what the document states."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.validation_time import DOC, predicted, runs

RUNS = runs()
MEAN = Fraction(5, 100)  # the tolerance is what the model achieves on this set (docs/validation_time.md)
MAX = Fraction(9, 100)


def _error(r) -> Fraction:
    return (predicted(r) - r.measured) / r.measured


def test_the_document_lists_the_runs():
    assert len(RUNS) == 8
    # the measured times as Table 5 of Korthikanti et al. (2022) prints them, in the table's order
    assert [str(float(r.measured)) for r in RUNS] == ["1.42", "1.1", "18.13", "13.75", "49.05", "37.83",
                                                      "94.42", "71.49"]
    for r in RUNS:
        assert r.gpus % (r.tp * r.pp) == 0 and r.layers % (r.pp * r.chunks) == 0


@pytest.mark.parametrize("r", RUNS, ids=[f"{r.name}-{r.mode}" for r in RUNS])
def test_each_row_is_what_the_model_predicts(r):
    p = predicted(r)
    assert abs(float(p) - float(r.shown)) <= 0.005, (float(p), r.shown)
    e = (p - r.measured) / r.measured
    assert r.error == f"{100 * float(e):+.1f} %"
    assert abs(e) <= MAX


def test_mean_and_max_error():
    errors = [abs(_error(r)) for r in RUNS]
    mean, worst = sum(errors) / len(errors), max(errors)
    print(f"step-time model on {len(RUNS)} published runs: mean error {float(mean):.1%}, max {float(worst):.1%}")
    assert mean <= MEAN and worst <= MAX
    text = DOC.read_text()
    assert f"| mean absolute error | {100 * float(mean):.1f} %" in text
    assert f"| maximum absolute error | {100 * float(worst):.1f} %" in text


def test_the_single_mfu_convention_is_reproduced():
    """The model before the kernel model, kept as a convention: MFU 1/2 of the fp16 peak."""
    errors = []
    for r in RUNS:
        old = predicted(r, "  mfu = 1/2\n")
        errors.append(abs(old - r.measured) / r.measured)
    text = DOC.read_text()
    mean, worst = sum(errors) / len(errors), max(errors)
    assert f"| mean absolute error | {100 * float(sum([abs(_error(r)) for r in RUNS]) / len(RUNS)):.1f} % | " \
           f"{100 * float(mean):.1f} % |" in text
    assert worst > Fraction(4, 10)  # the trend the kernel model removes: off by over 40 % at 1T
