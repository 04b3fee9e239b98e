"""Claims marked ``expect fails [unless NAME = VALUE, ...]``: parsed, formatted, validated where they
enter, and checked both ways (fails at the spec's values, holds with the names re-bound).

The oracle is the ZeRO paper's arithmetic, written out here: data parallelism holds
(2 + 2 + K)·Ψ bytes of model state per device and ZeRO-3 (2 + 2 + K)·Ψ / N, so their ratio
is N, and "8x less" holds exactly when N = 8."""

import io
import json
from fractions import Fraction

import pytest

from placement_logic.cli import main
from placement_logic.frontend.canonical import format_module
from placement_logic.frontend.parser import parse

SPEC = """from std.data import ddp, zero3

let psi = 7.5e9
let K = 12

model {{
  params = psi
  bytes {{
    params = 2
    grads = 2
    optimizer = K
  }}
}}

mesh {{
  dp = {dp}
}}

plan dp {{
  dp: ddp
}}

plan zero3 {{
  dp: zero3
}}

claim "8x": model_state(dp) / model_state(zero3) == 8 {expect}
"""


def run(tmp_path, dp=64, expect="", *extra):
    f = tmp_path / "z.place"
    f.write_text(SPEC.format(dp=dp, expect=expect))
    out, err = io.StringIO(), io.StringIO()
    code = main(["cost", str(f), *extra], out, err)
    return code, out.getvalue(), err.getvalue()


def ratio(n: int) -> Fraction:
    psi, k = Fraction(75 * 10**8), 12
    return (4 + k) * psi / ((4 + k) * psi / n)


def test_the_zero_example_reads_as_expected():
    out, err = io.StringIO(), io.StringIO()
    assert main(["cost", "examples/zero_paper.place", "--width", "200"], out, err) == 0
    assert 'claim "ZeRO-3 uses 8x less memory than data parallelism": fails (expected: holds only when dp = 8)' \
        in out.getvalue()
    assert "2 hold, 1 fail (1 as expected), 0 unknown; ok" in out.getvalue()


@pytest.mark.parametrize("dp", [4, 8, 16, 64])
@pytest.mark.parametrize("pin", [2, 4, 8, 16])
def test_expectations_against_the_arithmetic(tmp_path, dp, pin):
    code, out, _ = run(tmp_path, dp, f"expect fails unless dp = {pin}", "--format", "json")
    q = json.loads(out)["questions"][0]
    holds_here, holds_at_pin = ratio(dp) == 8, ratio(pin) == 8
    assert q["verdict"] == ("holds" if holds_here else "fails")
    # expected: holds exactly when dp is the pinned value
    assert q["met"] is (holds_here == (dp == pin) and holds_at_pin)
    assert q["expected"] == f"holds only when dp = {pin}"
    assert code == (0 if q["met"] else 1)
    assert json.loads(out)["summary"]["expectations_unmet"] == (0 if q["met"] else 1)


def test_expect_fails_alone(tmp_path):
    code, out, _ = run(tmp_path, 64, "expect fails")
    assert code == 0 and "fails (expected)" in out
    code, out, _ = run(tmp_path, 8, "expect fails", "--width", "200")
    assert code == 1 and "holds (UNEXPECTED: expected it to fail)" in out and "1 not as expected; FAILED" in out


def test_set_to_the_pinned_value_is_expected_to_hold(tmp_path):
    code, out, _ = run(tmp_path, 64, "expect fails unless dp = 8", "--set", "dp=8", "--width", "200")
    assert code == 0 and "holds (expected: holds only when dp = 8): dp = 8 == 8" in out


def test_unmet_at_the_pin_says_so(tmp_path):
    code, out, _ = run(tmp_path, 64, "expect fails unless dp = 4", "--width", "200")
    assert code == 1 and "fails (UNEXPECTED: expected it to hold when dp = 4, but it fails there too)" in out


def test_markdown_shows_the_expectation(tmp_path):
    _, out, _ = run(tmp_path, 64, "expect fails unless dp = 8", "--format", "markdown")
    assert "**fails (expected: holds only when dp = 8)**" in out


@pytest.mark.parametrize("clause, code", [
    ("expect fails unless dq = 8", "PL101"),
    ("expect fails unless dp = 0", "PL107"),
    ("expect fails unless dp = 2.5", "PL107"),
    ("expect fails unless dp = 8, dp = 4", "PL119"),
    ("expect fails unless psi = 1 GB", "PL201"),
    ("expect fails unless dp = memory(dp)", "PL205"),
    ("expect holds", "PL0"),
])
def test_bad_expectations_are_diagnosed(tmp_path, clause, code):
    status, _, err = run(tmp_path, 64, clause)
    assert status == 2 and f"[{code}" in err and "Traceback" not in err, err


def test_format_round_trips_the_clause():
    text = 'claim "x": a == 8 expect fails unless dp = 8, psi = 2 * 3\n'
    module = parse(text, "<t>")
    assert format_module(module, text) == text
    assert parse(format_module(module, text), "<t>") == module
