"""Padding marked only by an attention mask, as `placement trace` reads it (trace/recorder_padding.py,
trace/lift_padding.py), and the intended objective of a lifted balancing loss (``--objective``).

The fast tests edit stored traces by hand, as tests/test_trace_capacity.py and tests/test_trace_auxloss.py do:
router calls built by the capacity step's definition (``_step``) whose padding no label marks (-100) and no mask
on the routing map zeroes, an ``attention_masks`` record of the model call beside them (0 at the padded
positions). Without that record the lift states nothing of the capacity step (the padding not seen); with it, the
padding routed is ``counts_padding`` (refuted), masked ``masks_padding`` (proved), and a mask whose positions are
not the call's rows is PL614, never a proof. The slow ones run examples/traced/moe_capacity_attention_mask.py
(the padding marked by ``attention_mask=`` alone) and examples/traced/moe_aux_counts.py ``--local`` with and
without ``--objective aux_stats=per_microbatch``.
"""

from __future__ import annotations

import io
import json
import random
import re
from fractions import Fraction
from pathlib import Path

import pytest
from test_trace_auxloss import OWN, ROUTED, _routed
from test_trace_capacity import ROWS, _probs, _step, _traced

from placement_logic.cli import main
from placement_logic.outcome import Verdict
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
FRAME = {"file": "examples/traced/ddp_summed.py", "line": 27, "function": "<module>", "code": "x"}


def _verdict(text: str, name: str):
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_string

    report = check_spec(load_string(text, "lifted.place"), ["traced"], timeout=20).plans[0]
    return next((o.verdict for o in report.obligations if o.name == name), None)


def _masked_by_attention(calls: dict[int, dict], pads: dict[int, int], width: int = ROWS, real: bool = False) -> dict:
    """The capacity trace with no label ignored; each rank's model call holds an attention mask of ``width``
    positions, 0 at its last ``pads`` of the call's rows; ``real``: the labels of the positions it keeps alone
    (a loss over them, indexed), else of every position."""
    trace = _traced(calls, {r: 0 for r in pads})
    for part in trace["ranks"]:
        r = part["rank"]
        for st in part["steps"]:
            st["attention_masks"] = [{"micro": 0, "shape": [1, width], "keyword": True, "stack": [FRAME],
                                      "values": [1 if j < ROWS - pads[r] else 0 for j in range(width)]}]
            n = st["nll"][0]
            n["target"] = [j % 7 for j in range(ROWS)]  # no label at the ignore index
            if real:
                n["target"] = [y for y, m in zip(n["target"], st["attention_masks"][0]["values"]) if m]
            n["tokens"] = n["positions"] = len(n["target"])
    return trace


def _capacity_items(out) -> list:
    return [u for u in out.unliftable if u.what == "a capacity step"]


def test_padding_in_the_attention_mask_alone_is_not_seen_without_its_record():
    """The blind spot: no label ignored, no mask on the routing, the padding routed; without the attention mask's
    record the lift sees no padded position and states nothing of the capacity step."""
    rng = random.Random(11)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), True) for r, p in ((0, 5), (1, 2))}
    out = lift(_traced(calls, {0: 0, 1: 0}))
    assert "override capacity" not in out.text and any("no padded position" in n for n in out.notes)


def test_padding_in_the_attention_mask_routed_is_counts_padding_and_refuted():
    """The same calls with the attention mask recorded (0 at the 5 and 2 padded positions): the padding routed,
    C = 8 of the 16 positions."""
    rng = random.Random(11)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), True) for r, p in ((0, 5), (1, 2))}
    out = lift(_masked_by_attention(calls, {0: 5, 1: 2}))
    assert not _capacity_items(out), out.unliftable
    assert "  override capacity: counts_padding" in out.text, out.text
    assert "C = 8 of N = 16 positions" in out.text
    assert _verdict(out.text, "GI capacity") is Verdict.REFUTED
    # the loss over every position trains on the padding too: named, so the script's verdict is unknown
    assert [u for u in out.unliftable if u.what == "padding"]


def test_padding_in_the_attention_mask_masked_is_masks_padding_and_proved():
    rng = random.Random(12)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), False) for r, p in ((0, 5), (1, 2))}
    out = lift(_masked_by_attention(calls, {0: 5, 1: 2}, real=True))
    assert not out.unliftable, out.unliftable
    assert "  override capacity: masks_padding" in out.text, out.text
    # ⌈1·2·11/4⌉ = 6 of rank 0's 11 real tokens
    assert "C = 6 of N = 11 real tokens" in out.text
    assert _verdict(out.text, "GI capacity") is Verdict.PROVED


def test_an_attention_mask_over_other_positions_is_not_a_proof():
    """A mask of 24 positions with padding beside router calls of 16 rows: where the padding is is not known
    (PL614), no capacity statement."""
    rng = random.Random(13)
    calls = {r: _step(_probs(rng, 4), 3, 2, Fraction(1), True) for r in (0, 1)}
    out = lift(_masked_by_attention(calls, {0: 3, 1: 3}, width=24))
    assert "override capacity" not in out.text
    assert [u for u in _capacity_items(out) if "attention mask" in u.reason]


def test_labels_of_the_real_positions_alone_pair_through_the_mask():
    """A loss over the positions the mask keeps (labels of 11 and 14 real positions, indexed out of 16): the
    router calls pair with them through the mask, the padding routed read as counts_padding."""
    rng = random.Random(14)
    calls = {r: _step(_probs(rng, 4), p, 2, Fraction(1), True) for r, p in ((0, 5), (1, 2))}
    out = lift(_masked_by_attention(calls, {0: 5, 1: 2}, real=True))
    assert "  override capacity: counts_padding" in out.text, out.unliftable
    assert not out.unliftable, out.unliftable
    assert _verdict(out.text, "GI capacity") is Verdict.REFUTED


# --------------------------------------------------------------------------- the token count


def _tokens_trace(labels_ignored: bool) -> dict:
    """The stored DDP trace (16 positions a rank, mean cross-entropy) with an attention mask zero at the last 4
    positions; their labels ignored or not."""
    trace = json.loads((ROOT / "tests" / "data" / "traces" / "ddp_summed.json").read_text())
    for part in trace["ranks"]:
        for st in part["steps"]:
            mask = [1] * 12 + [0] * 4
            st["attention_masks"] = [{"micro": 0, "shape": [2, 8], "values": mask, "keyword": True, "stack": [FRAME]}]
            n = st["nll"][0]
            n["target"] = [j % 7 if m or not labels_ignored else -100 for j, m in enumerate(mask)]
            n["tokens"] = 12 if labels_ignored else 16
    return trace


def test_a_loss_over_the_padding_the_attention_mask_marks_is_named():
    """16 labelled positions, 4 of them padding by the mask: the token count the lift would state holds the
    padding as tokens; named (PL614), the verdict unknown."""
    out = lift(_tokens_trace(labels_ignored=False))
    bad = [u for u in out.unliftable if u.what == "padding"]
    assert bad and "counts 4 position(s)" in bad[0].reason, out.unliftable
    assert 'unobserved "padding' in out.text


def test_a_loss_that_ignores_the_padded_labels_is_lifted():
    out = lift(_tokens_trace(labels_ignored=True))
    assert not [u for u in out.unliftable if u.what == "padding"], out.unliftable


# --------------------------------------------------------------------------- the balancing loss's statistics


def _aux_padded(marked_by: str) -> dict:
    """The balancing-loss trace (each rank's own statistics over its 4 router rows), its last row padding marked
    by the labels (-100) or by an attention mask of the 4 positions alone."""
    trace = _routed(OWN, gathered=False)
    for part in trace["ranks"]:
        for st in part["steps"]:
            n = st["nll"][0]
            n["target"] = [1, 2, 3, -100 if marked_by == "labels" else 4]
            n["tokens"], n["positions"] = (3 if marked_by == "labels" else 4), 4
            if marked_by == "mask":
                st["attention_masks"] = [{"micro": 0, "shape": [1, 4], "values": [1, 1, 1, 0], "keyword": True,
                                          "stack": [FRAME]}]
    return trace


@pytest.mark.parametrize("marked_by", ["labels", "mask"])
def test_statistics_over_padded_rows_are_stats_count_padding_and_refuted(marked_by):
    """The statistics read over every router row (lift_auxloss), one of the 4 padding: ``stats_count_padding``,
    whose objective counts real tokens only: ``GI aux_stats`` refuted."""
    assert ROUTED[0][0] == [3, 1]  # the hand routing the balancing loss's value is computed from
    out = lift(_aux_padded(marked_by))
    assert "  override loss[aux]: stats_count_padding" in out.text, (out.text, out.unliftable)
    assert _verdict(out.text, "GI aux_stats") is Verdict.REFUTED


def test_statistics_whose_rows_no_mask_locates_are_not_a_proof():
    trace = _aux_padded("mask")
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["attention_masks"][0]["values"] = [1, 1, 1, 0, 1, 1]  # 6 positions beside 4 router rows
    out = lift(trace)
    assert "loss[aux]" not in out.text
    assert [u for u in out.unliftable if u.what == "an auxiliary loss" and "attention mask" in u.reason]


# --------------------------------------------------------------------------- the stated objective


def test_the_default_objective_refutes_per_microbatch_statistics_and_the_stated_one_proves_them():
    """Each rank's own statistics (one micro-step): against single-device training's objective (global_batch)
    refuted; with ``aux_stats = per_microbatch`` stated, read per microbatch and proved."""
    default = lift(_routed(OWN, gathered=False))
    assert "    aux_stats = global_batch" in default.text
    assert _verdict(default.text, "GI aux_stats") is Verdict.REFUTED
    stated = lift(_routed(OWN, gathered=False), objective={"aux_stats": "per_microbatch"})
    assert "    aux_stats = per_microbatch" in stated.text
    assert "  override loss[aux]: stats_per_microbatch over ()" in stated.text
    assert _verdict(stated.text, "GI aux_stats") is Verdict.PROVED


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("value,why", [("aux_stats=per_batch", "expected one of global_batch, per_microbatch"),
                                       ("aux=per_microbatch", "no objective 'aux'"),
                                       ("per_microbatch", "expected KEY=VALUE")])
def test_a_bad_objective_is_a_located_diagnostic(value, why, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(_routed(OWN, gathered=False)))
    for argv in (["lift", str(trace), "--objective", value],
                 ["trace", "--nproc", "2", "--check", "--objective", value, "--", "python", "missing.py"]):
        status, out, err = run(argv)
        assert status == 2 and "[PL611]" in err and f"--objective {value}" in err and why in err, err
        assert "Traceback" not in err


def test_the_lift_command_writes_the_stated_objective(tmp_path):
    trace = tmp_path / "t.json"
    routed = _routed(OWN, gathered=False)
    for part in routed["ranks"]:
        for st in part["steps"]:
            st["nll"][0]["stats"].update(zsq_local=41.3, smooth_local=3.0)  # the schema's four sums
    trace.write_text(json.dumps(routed))
    status, out, err = run(["lift", str(trace), "--objective", "aux_stats=per_microbatch"])
    assert status == 0 and "    aux_stats = per_microbatch" in out, err


# --------------------------------------------------------------------------- the recorder's reading


@pytest.mark.torch
def test_the_recorder_reads_an_attention_mask_beside_the_token_ids():
    """Keyword ``attention_mask``, a positional bool or 0/1 tensor of the ids' shape, keyword ``input_ids``: read
    (0 a padded position); position ids (every row 0, 1, 2, ...), another shape or values other than 0/1: not."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_padding import note_attention_mask

    ids = torch.arange(8).view(2, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])

    def read(args, kwargs):
        step: dict = {}
        note_attention_mask(step, 0, args, kwargs)
        return [m["values"] for m in step.get("attention_masks", [])]

    expected = [[1, 1, 1, 0, 1, 1, 0, 0]]
    assert read((ids,), {"attention_mask": mask}) == expected
    assert read((ids, mask.bool()), {}) == expected
    assert read((ids, mask.float()), {}) == expected
    assert read((), {"input_ids": ids, "attention_mask": mask}) == expected
    assert read((ids, torch.arange(4).expand(2, 4)), {}) == []  # position ids
    assert read((ids, torch.tensor([[0, 1, 0, 1]] * 2)), {}) == [[0, 1, 0, 1, 0, 1, 0, 1]]  # 0/1, no ramp
    assert read((ids, mask.flatten()), {}) == []  # not the ids' shape
    assert read((ids, mask * 2), {}) == []


# --------------------------------------------------------------------------- slow: the examples


def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,verb", [([], 1, "counts_padding"), (["--fixed"], 0, "masks_padding")],
                         ids=["bug", "fixed"])
def test_the_attention_mask_example_is_lifted(argv, status, verb, tmp_path, monkeypatch):
    """The padding marked by ``attention_mask=`` alone, read by the recorder: routed, counts_padding refuted at the
    capacity step's topk; masked, masks_padding proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec, saved = tmp_path / "lifted.place", tmp_path / "trace.json"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--trace-file", str(saved),
                         "--", "python", "examples/traced/moe_capacity_attention_mask.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    trace = json.loads(saved.read_text())
    masks = [m for part in trace["ranks"] for st in part["steps"] for m in st.get("attention_masks") or []]
    # tiny.padded_batch: 2 sequences of 8, each cut to a random length: some position of some rank is padding
    assert masks and all(m["keyword"] and m["shape"] == [2, 8] for m in masks) and any(0 in m["values"] for m in masks)
    assert f"  override capacity: {verb}" in spec.read_text()
    if status == 0:
        assert "proved for all mesh sizes" in out, out
    else:
        where = _line("moe_capacity_attention_mask.py", "scores.topk(capacity, dim=0)")
        assert f"examples/traced/moe_capacity_attention_mask.py:{where}: refuted GI capacity: " in out, out


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("objective,status", [([], 1), (["--objective", "aux_stats=per_microbatch"], 0)],
                         ids=["default", "per_microbatch"])
def test_the_stated_objective_of_a_traced_script(objective, status, monkeypatch):
    """Each rank's own balancing-loss statistics (``--local``, Megatron's per-microbatch aux loss): refuted
    against single-device training's objective at the loss line, proved against the one stated."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    got, out, err = run(["trace", "--nproc", "4", "--check", *objective, "--", "python",
                         "examples/traced/moe_aux_counts.py", "--local"])
    assert got == status, out + err
    if status == 0:
        assert re.search(r"proved for all mesh sizes.*the objective stated: aux_stats=per_microbatch", out), out
    else:
        where = _line("moe_aux_counts.py", "loss = ce + AUX_COEFF")
        assert f"examples/traced/moe_aux_counts.py:{where}: refuted GI aux_stats: " in out, out
