"""The layout of context parallelism's chunks, read from the values each context rank holds.

The fast tests rewrite the stored trace of examples/traced/cp_zigzag.py ``--fixed`` (tests/data/traces/cp_zigzag.json,
2 context ranks, 2 sequences of 16 tokens) with sequences of their own, each tensor cut into the 4 chunks by the
layout the test names (contiguous: rank i holds chunks 2i, 2i + 1; zigzag: i, 3 - i; the labels each token's next
token), and require the lifted statements that layout implies and the verdict `placement check` gives them; what
no layout statement expresses (labels that are no chunk's next tokens, another order of the chunks) is
named, never proved; values that do not fix the order (ignored labels at the chunks' ends, repeated tokens) are
noted and the layout left to the derivation. The slow test runs the script.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "cp_zigzag.json"
SEQ, ROWS, C = 16, 2, 2
H = SEQ // (2 * C)
SLOTS = {"contiguous": lambda k: (2 * k, 2 * k + 1), "zigzag": lambda k: (k, 2 * C - 1 - k),
         "strided": lambda k: (k, k + C)}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _cut(rows: list[list[int]], rank: int, layout: str) -> list[int]:
    """This rank's two chunks of every row, flattened row-major."""
    out = []
    for row in rows:
        for k in SLOTS[layout](rank):
            out.extend(row[k * H:(k + 1) * H])
    return out


def _traced(inputs="zigzag", labels=None, positions=None, seqs=None) -> dict:
    """The stored trace, every step's tokens, labels and position ids laid out as named (labels and positions
    following the inputs unless named)."""
    rng = random.Random(0)
    seqs = seqs or [[rng.randrange(64) for _ in range(SEQ + 1)] for _ in range(ROWS)]
    tokens, nexts = [s[:-1] for s in seqs], [s[1:] for s in seqs]
    pos = [list(range(SEQ)) for _ in range(ROWS)]
    trace = json.loads(STORED.read_text())
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["inputs"][0].update(values=_cut(tokens, part["rank"], inputs),
                                   position_ids=_cut(pos, part["rank"], positions or inputs))
            if callable(labels):
                st["nll"][0]["target"] = labels(tokens, part["rank"])
            else:
                st["nll"][0]["target"] = _cut(nexts, part["rank"], labels or inputs)
    return trace


def _layout_lines(text: str) -> list[str]:
    return [x.split("  #")[0].strip() for x in text.splitlines() if x.startswith("  override layout")]


@pytest.mark.parametrize("inputs", ["contiguous", "zigzag"])
@pytest.mark.parametrize("labels", ["contiguous", "zigzag"])
@pytest.mark.parametrize("positions", ["contiguous", "zigzag"])
def test_each_tensors_layout_is_read_from_its_values(inputs, labels, positions):
    lifted = lift(_traced(inputs, labels, positions))
    want = (["override layout[inputs]: zigzag"] if inputs == "zigzag" else []) + \
        ([f"override layout[labels]: {labels}"] if labels != inputs else []) + \
        ([f"override layout[position_ids]: {positions}"] if positions != inputs else [])
    assert _layout_lines(lifted.text) == want, lifted.text
    assert not lifted.unliftable, lifted.unliftable


@pytest.mark.parametrize("labels,positions,verdict", [
    (None, None, "proved"),                        # every tensor zigzag
    ("contiguous", None, "refuted GI layout[labels]"),
    (None, "contiguous", "refuted GI layout[position_ids]"),
])
def test_the_lifted_layouts_are_judged(labels, positions, verdict, tmp_path):
    lifted = lift(_traced("zigzag", labels, positions))
    path = tmp_path / "lifted.place"
    path.write_text(lifted.text)
    status, out, _ = run(["check", str(path)])
    if verdict == "proved":
        assert status == 0, out
    else:
        at = next(i for i, x in enumerate(lifted.text.splitlines(), 1) if "override layout[" in x and "inputs" not in x)
        assert status == 1 and f"lifted.place:{at}:3: {verdict}" in out, out


def _shifted_after_split(tokens, rank):
    """Each rank's labels its own zigzag tokens shifted by one (the last one ignored): wrong at a chunk's end."""
    mine = _cut(tokens, rank, "zigzag")
    out = []
    for r in range(ROWS):
        row = mine[r * 2 * H:(r + 1) * 2 * H]
        out.extend(row[1:] + [-100])
    return out


def _unshifted(tokens, rank):
    """Each rank's labels its own tokens (the shift forgotten): the next tokens of no chunk."""
    return _cut(tokens, rank, "zigzag")


def _padded(tokens, rank):
    """Rank 0's labels its zigzag chunks' next tokens; rank 1's every label ignored (padding)."""
    return _cut([s[1:] + [0] for s in tokens], 0, "zigzag") if rank == 0 else [-100] * (ROWS * 2 * H)


def _padded_and_wrong(tokens, rank):
    """Rank 1's labels all padding, rank 0's the next tokens of no chunk (every token plus one)."""
    return _cut([[t + 1 for t in s] for s in tokens], 0, "zigzag") if rank == 0 else [-100] * (ROWS * 2 * H)


@pytest.mark.parametrize("edit,what", [
    (dict(labels=_unshifted), "the layout of the chunks over cp"),
    (dict(labels=_padded_and_wrong), "the layout of the chunks over cp"),
    (dict(inputs="strided", labels="strided"), "the layout of the inputs over cp"),
])
def test_what_no_layout_statement_expresses_is_named(edit, what):
    lifted = lift(_traced(**edit))
    assert "override layout[labels]" not in lifted.text, lifted.text
    assert [u for u in lifted.unliftable if u.what == what], lifted.unliftable
    assert f'unobserved "{what}' in lifted.text


@pytest.mark.parametrize("edit", [
    dict(labels=_shifted_after_split),         # ignored labels at every rank's block end: the chain breaks there
    dict(seqs=[[5] * (SEQ + 1)] * ROWS),        # the tokens repeat: every label chunk fits every input chunk
    dict(labels=_padded),                       # rank 1's labels all padding: no evidence of their chunks
])
def test_an_order_the_values_do_not_fix_is_noted_and_left_to_the_derivation(edit):
    lifted = lift(_traced(**edit))
    assert not _layout_lines(lifted.text) and not lifted.unliftable, lifted.text
    assert any("the order of every sequence's chunks is not read" in n for n in lifted.notes), lifted.notes


def test_a_second_argument_that_is_no_positions_is_noted():
    trace = _traced("zigzag")
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["inputs"][0]["position_ids"] = [1] * len(st["inputs"][0]["values"])  # token types, say
    lifted = lift(trace)
    assert _layout_lines(lifted.text) == ["override layout[inputs]: zigzag"] and not lifted.unliftable, lifted.text
    assert any("not read as position ids" in n for n in lifted.notes), lifted.notes


def test_unrecorded_values_leave_the_layout_to_the_derivation():
    trace = _traced("zigzag", "contiguous")
    for part in trace["ranks"]:
        for st in part["steps"]:
            del st["nll"][0]["target"]
    lifted = lift(trace)
    assert not _layout_lines(lifted.text) and any("no labels" in n for n in lifted.notes), lifted.text


# --------------------------------------------------------------------------- slow: the example

def _line(text: str) -> int:
    lines = (ROOT / "examples" / "traced" / "cp_zigzag.py").read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,lifted,obligation,where", [
    ([], 1, ["override layout[inputs]: zigzag", "override layout[labels]: contiguous"], "GI layout[labels]",
     "loss = F.cross_entropy("),
    (["--position-ids"], 1, ["override layout[inputs]: zigzag", "override layout[position_ids]: contiguous"],
     "GI layout[position_ids]", "logits = model(x, pos)"),
    (["--fixed"], 0, ["override layout[inputs]: zigzag"], None, None),
    (["--contiguous"], 0, [], None, None),
])
def test_the_context_layout_is_lifted_and_judged(argv, status, lifted, obligation, where, tmp_path, monkeypatch):
    """Zigzag tokens with contiguous labels (or position ids) lifted as the two layouts and refuted at the line
    the departing tensor is read at; every tensor zigzag, or every one contiguous, proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/cp_zigzag.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    assert "  cp: context_parallel" in text and _layout_lines(text) == lifted, text
    if status == 0:
        assert "proved for all mesh sizes" in out
    else:
        assert f"examples/traced/cp_zigzag.py:{_line(where)}: refuted {obligation}: " in out, out
