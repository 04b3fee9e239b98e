"""The MoE dispatch's capacity step as `placement trace` lifts it (trace/lift_capacity.py): padded positions
routed into it (``capacity: counts_padding``) or masked before it (``masks_padding``), and its capacity factor.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json, 2 data ranks; its ``head.weight``
renamed ``router.weight``) by hand: each rank's router call of R = 16 positions over E experts with the capacity
step's record (C, each expert's kept count, the rows routed into it) that a capacity step computed here by its
definition gives (``_step``: the top-k of hand or seeded probabilities, the padding masked out of the routing map
or not, each expert keeping its C positions of the highest scores), the cross-entropy's labels -100 at the padded
positions. The slow ones run examples/traced/moe_capacity_padding.py on 2 ranks: the bug refuted ``GI capacity``
at the capacity step's line, the fix proved.
"""

from __future__ import annotations

import io
import json
import random
import re
from fractions import Fraction
from math import ceil
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
FRAME = {"file": "examples/traced/ddp_summed.py", "line": 27, "function": "<module>", "code": "x"}
ROWS = 16


def _step(probs: list[list[float]], pads: int, top_k: int, cf: Fraction, counts_padding: bool,
          c_from_rows: bool | None = None) -> dict:
    """A router call's record by the capacity step's definition: the last ``pads`` rows padded; the routing map
    the top-k of each row, masked at the padding unless ``counts_padding``; C = ⌈cf·k·N/E⌉, N the rows
    (``c_from_rows``, by default where the padding is routed) or the real tokens; each expert keeps its C rows
    of the highest positive scores."""
    rows, experts = len(probs), len(probs[0])
    real = [j < rows - pads for j in range(rows)]
    chosen = [sorted(range(experts), key=lambda i: -p[i])[:top_k] for p in probs]
    scores = [[p[i] if i in chosen[j] and (counts_padding or real[j]) else 0.0 for i in range(experts)]
              for j, p in enumerate(probs)]
    n = rows if (counts_padding if c_from_rows is None else c_from_rows) else sum(real)
    cap = ceil(cf * top_k * n / experts)
    kept = [sum(1 for s in sorted((scores[j][i] for j in range(rows)), reverse=True)[:cap] if s > 0)
            for i in range(experts)]
    return {"width": experts, "rows": rows, "colsum": [sum(p[i] for p in probs) for i in range(experts)],
            "counts": [sum(1 for c in chosen if i in c) for i in range(experts)], "top_k": top_k, "micro": 0,
            "stack": [FRAME], "capacity": cap, "kept": kept,
            "entered": [j for j in range(rows) if any(s > 0 for s in scores[j])], "capacity_stack": [FRAME]}


def _probs(rng: random.Random, experts: int) -> list[list[float]]:
    rows = [[rng.random() + 1e-3 for _ in range(experts)] for _ in range(ROWS)]
    return [[x / sum(r) for x in r] for r in rows]


def _traced(calls: dict[int, dict], pads: dict[int, int]) -> dict:
    """The stored trace with each rank's router call and labels (-100 at its last ``pads`` positions)."""
    trace = json.loads(STORED.read_text().replace('"head.weight"', '"router.weight"'))
    for part in trace["ranks"]:
        r = part["rank"]
        for st in part["steps"]:
            st["router"] = [dict(calls[r])]
            nll = st["nll"][0]
            nll["target"] = [j % 7 if j < ROWS - pads[r] else -100 for j in range(ROWS)]
            nll["classes"] = 64
    return trace


def _capacity_factor(text: str) -> Fraction | None:
    m = re.search(r"^    capacity_factor = ([0-9.]+)", text, re.M)
    return Fraction(m.group(1)) if m else None


def _verdict(text: str):
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_string

    report = check_spec(load_string(text, "lifted.place"), ["traced"], timeout=20).plans[0]
    return next((o.verdict for o in report.obligations if o.name == "GI capacity"), None)


def test_the_definition_gives_the_hand_capacities():
    """16 positions, 4 experts, top-2, factor 1: C = 8 over every position, 6 over 12 real ones; the masked
    padded rows route nowhere."""
    rng = random.Random(1)
    probs = _probs(rng, 4)
    assert _step(probs, 4, 2, Fraction(1), True)["capacity"] == 8
    masked = _step(probs, 4, 2, Fraction(1), False)
    assert masked["capacity"] == 6 and masked["entered"] == list(range(12))


def test_padding_routed_into_a_dropping_step_is_counts_padding_and_refuted():
    rng = random.Random(2)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), True) for r, p in ((0, 5), (1, 2))}
    out = lift(_traced(calls, {0: 5, 1: 2}))
    assert not [u for u in out.unliftable if u.what == "a capacity step"], out.unliftable
    assert "  override capacity: counts_padding" in out.text, out.text
    assert "    experts = 4" in out.text and "    top_k = 2" in out.text and "    hidden = 32" in out.text
    assert _capacity_factor(out.text) == 1
    from placement_logic.outcome import Verdict

    assert _verdict(out.text) is Verdict.REFUTED


def test_padding_masked_before_the_step_is_masks_padding_and_proved():
    rng = random.Random(3)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), False) for r, p in ((0, 5), (1, 2))}
    out = lift(_traced(calls, {0: 5, 1: 2}))
    assert "  override capacity: masks_padding" in out.text, out.text
    assert any("masks_padding" in n for n in out.notes)
    from placement_logic.outcome import Verdict

    assert _verdict(out.text) is Verdict.PROVED


@pytest.mark.parametrize("seed", range(12))
def test_the_lifted_factor_gives_every_calls_capacity(seed):
    """Random probabilities, padding, k, E and factor: the verb is the one the step ran, and the lifted factor
    gives each call's C from the count that verb implies (the positions, or the real tokens)."""
    rng = random.Random(seed)
    experts = rng.choice([4, 6, 8])
    top_k, cf = rng.choice([1, 2]), rng.choice([Fraction(1, 2), Fraction(3, 4), Fraction(1), Fraction(5, 4)])
    counts = rng.random() < 0.5
    pads = {0: rng.randint(1, 8), 1: rng.randint(0, 8)}
    calls = {r: _step(_probs(rng, experts), pads[r], top_k, cf, counts) for r in (0, 1)}
    out = lift(_traced(calls, pads))
    if counts and cf * top_k >= experts:
        assert "override capacity" not in out.text and any("drops no token" in n for n in out.notes)
        return
    assert f"  override capacity: {'counts_padding' if counts else 'masks_padding'}" in out.text, out.text
    got = _capacity_factor(out.text)
    for r, call in calls.items():
        n = ROWS if counts else ROWS - pads[r]
        assert ceil(got * top_k * n / experts) == call["capacity"]


def _unliftable(out) -> list:
    return [u for u in out.unliftable if u.what == "a capacity step"]


def test_padding_routed_on_one_rank_and_masked_on_the_other_is_not_lifted():
    rng = random.Random(4)
    calls = {0: _step(_probs(rng, 4), 3, 2, Fraction(1), True), 1: _step(_probs(rng, 4), 3, 2, Fraction(1), False)}
    out = lift(_traced(calls, {0: 3, 1: 3}))
    assert "override capacity" not in out.text
    assert [u for u in _unliftable(out) if "some router calls" in u.reason]


def test_padding_masked_but_capacity_from_every_position_is_not_lifted():
    """The padding masked out of the routing map, C still from the 16 positions: no factor gives C = 8 of 11 and
    of 15 real tokens at once (⌈f·2·11/4⌉ = 8 needs f in (14/11, 16/11], of 15 f in (14/15, 16/15])."""
    rng = random.Random(5)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), False, c_from_rows=True) for r, p in ((0, 5), (1, 1))}
    out = lift(_traced(calls, {0: 5, 1: 1}))
    assert "override capacity" not in out.text
    assert [u for u in _unliftable(out) if "no one capacity factor" in u.reason]


def test_no_padded_position_states_nothing():
    rng = random.Random(6)
    calls = {r: _step(_probs(rng, 4), 0, 2, Fraction(1), True) for r in (0, 1)}
    out = lift(_traced(calls, {0: 0, 1: 0}))
    assert "override capacity" not in out.text and "transformer {" not in out.text
    assert any("no padded position" in n for n in out.notes) and not _unliftable(out)


def test_a_padding_mask_on_the_routing_map_marks_the_padded_positions():
    """Labels not ignored at the padding, the routing map multiplied by the padding mask (``masked``): those rows
    are the padding, masked before the step (C = ⌈2·12/4⌉ = 6 of the 12 real tokens)."""
    rng = random.Random(8)
    calls = {r: _step(_probs(rng, 4), 4, 2, Fraction(1), False) for r in (0, 1)}
    for call in calls.values():
        call["masked"] = list(range(12, ROWS))
    out = lift(_traced(calls, {0: 0, 1: 0}))
    assert "  override capacity: masks_padding" in out.text, out.text
    assert "C = 6 of N = 12 real tokens" in out.text


def test_a_loss_mask_without_padded_labels_cannot_tell_the_padding():
    """No label ignored and no mask on the routing, but a loss mask leaving out 4 positions: they may be padding
    routed into the step (PL614)."""
    rng = random.Random(9)
    calls = {r: _step(_probs(rng, 4), 0, 2, Fraction(1), True) for r in (0, 1)}
    trace = _traced(calls, {0: 0, 1: 0})
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["nll"][0]["mask"] = {"sum": ROWS - 4, "labelled": ROWS - 4, "value": 1.0}
    out = lift(trace)
    assert "override capacity" not in out.text
    assert [u for u in _unliftable(out) if "loss mask" in u.reason]


def test_a_call_without_labels_of_its_positions_is_not_lifted():
    rng = random.Random(7)
    calls = {r: _step(_probs(rng, 4), 3, 2, Fraction(1), True) for r in (0, 1)}
    trace = _traced(calls, {0: 3, 1: 3})
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["nll"][0]["target"] = st["nll"][0]["target"][:-1]
    out = lift(trace)
    assert "override capacity" not in out.text
    assert [u for u in _unliftable(out) if "not paired" in u.reason]


# --------------------------------------------------------------------------- slow: the example

def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(text: str) -> int:
    lines = (ROOT / "examples" / "traced" / "moe_capacity_padding.py").read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,verb,n", [([], 1, "counts_padding", "N = 16 positions"),
                                               (["--fixed"], 0, "masks_padding", "real tokens")],
                         ids=["bug", "fixed"])
def test_the_capacity_step_of_the_example_is_lifted(argv, status, verb, n, tmp_path, monkeypatch):
    """The padding routed into the capacity step (top-2 of 4 experts, factor 1, 2 × 8 positions a call):
    counts_padding, refuted GI capacity at the capacity step's topk; masked, masks_padding, proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/moe_capacity_padding.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    assert f"  override capacity: {verb}" in text, text
    assert "    experts = 4" in text and "    top_k = 2" in text and _capacity_factor(text) == 1, text
    assert n in text, text
    if status == 0:
        assert "proved for all mesh sizes" in out and re.search(r"proved GI capacity", out), out
    else:
        where = _line("scores.topk(capacity, dim=0)")
        assert f"examples/traced/moe_capacity_padding.py:{where}: refuted GI capacity: " in out, out
        assert "counts the padded positions" in out
