"""The loss's extra terms, its mask and the count it is normalised by, as `placement trace` lifts them.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json) by hand: each edit states, with
hand-chosen numbers, what a script did (a term added to the cross-entropy, a count all-reduced before the loss,
a mask multiplied into the per-token losses), and the lifted spec must state it. The slow ones run the scripts
of examples/traced/ and require each verdict at the script line that caused it.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift
from placement_logic.trace.lift_terms import _snap

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
FRAME = {"file": "examples/traced/ddp_summed.py", "line": 27, "function": "<module>", "code": "x"}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def stored() -> dict:
    return json.loads(STORED.read_text())


def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.parametrize("value,snapped", [(1e-4, 1e-4), (1.000002e-4, 1e-4), (4.3004e-4, None), (0.1, 0.1), (2e-3, 2e-3), (5.0, 5.0),
                                           (0.12345, None), (1.2345e-4, None), (-1e-4, None), (0.0, None)])
def test_a_coefficient_has_two_significant_digits(value, snapped):
    got = _snap(value)
    assert (got is None) == (snapped is None)
    if snapped is not None:
        assert abs(got - snapped) <= 1e-12


def _with_term(trace: dict, coefficient: float, key: str = "zsq_true", sliced: bool = False,
               ce_weight: float = 1.0) -> dict:
    """Every rank's every step: ``ce_weight`` times its cross-entropy plus a term whose value per token is
    ``coefficient`` times the statistic ``key`` over the step's tokens (the stats chosen by hand, no two read
    as one coefficient)."""
    for part in trace["ranks"]:
        for st in part["steps"]:
            n = st["nll"][0]
            n["classes"], n["width"] = 64, 32 if sliced else 64
            n["stats"] = {"zsq_true": 41.3, "zsq_local": 25.7, "smooth_true": 3.0, "smooth_local": 2.0}
            other = coefficient * n["stats"][key] / n["tokens"]  # a mean over the tokens, as the cross-entropy's
            st["terms"] = [{"ce": ce_weight * n["value"], "other": other, "micro": 0, "stack": [FRAME]}]
            st["losses"][0]["value"] = ce_weight * n["value"] + other
    return trace


def _divisor(text: str) -> list[str]:
    return [x.split("#")[0].strip() for x in text.splitlines() if "divide by" in x]


def test_a_z_loss_term_is_lifted_in_the_model_block():
    out = lift(_with_term(stored(), 1e-4))
    assert "    logit_z_loss = true" in out.text and "label_smoothing" not in out.text
    assert not [u for u in out.unliftable if u.what == "an auxiliary loss"]
    assert "activations[loss]" not in out.text  # whole logits on every rank: nothing to all-reduce


@pytest.mark.parametrize("ce_weight,coefficient", [(0.9, 0.1), (1.0, 0.1), (0.5, 0.5), (1.0, 1.0), (0.8, 0.2),
                                                   (1.0, 0.25)],
                         ids=["(1-a)CE+a.smooth", "CE+c.smooth", "a=0.5", "CE+1.smooth", "a=0.2", "CE+0.25.smooth"])
def test_a_smoothing_term_is_lifted_with_the_cross_entropy_read_whole(ce_weight, coefficient):
    """Megatron's (1 − α)·CE + α·smooth (α = 0.1) and CE + 0.1·smooth: the loss's normalisation is the plain
    cross-entropy's (the stored trace's own divisor, read without a term), the weight 1 − α no divisor. α = 0.5
    and α = 0.2 are also CE + c·smooth by value (c = α / (1 − α) = 1, 0.25, two digits each): the operand's own
    multiplier 1 − α tells the reading, and CE + 1·smooth, CE + 0.25·smooth (multiplier 1) are read as written."""
    plain = _divisor(lift(stored()).text)
    out = lift(_with_term(stored(), coefficient, "smooth_true", ce_weight=ce_weight))
    assert "    label_smoothing = true" in out.text
    assert not out.unliftable
    assert _divisor(out.text) == plain


@pytest.mark.parametrize("ce_weight,coefficient", [(0.25, 0.25), (0.4, 0.1)])
def test_a_smoothing_term_whose_multiplier_tells_neither_reading_is_reported(ce_weight, coefficient):
    """0.25·CE + 0.25·smooth is CE + 1·smooth scaled by 1/4 or (1 − 0.5)·CE + 0.5·smooth scaled by 1/2 (and
    0.4·CE + 0.1·smooth: c = 0.25 or α = 0.2): the operand's multiplier is neither 1 nor 1 − α, so the term is
    no one term (PL614), never lifted as smoothing."""
    out = lift(_with_term(stored(), coefficient, "smooth_true", ce_weight=ce_weight))
    assert "label_smoothing" not in out.text
    assert [u for u in out.unliftable if u.what == "an auxiliary loss" and "tells neither" in u.reason], out.unliftable


def test_a_term_of_another_size_stays_an_auxiliary_loss():
    out = lift(_with_term(stored(), 1.2345e-4))
    assert "losses {" not in out.text
    assert [u for u in out.unliftable if u.what == "an auxiliary loss"]


def test_a_coefficient_that_differs_between_ranks_is_no_term():
    trace = _with_term(stored(), 1e-4)
    _with_term({"ranks": trace["ranks"][1:]}, 2e-4)  # rank 1: another coefficient
    out = lift(trace)
    assert [u for u in out.unliftable if u.what == "an auxiliary loss" and "differs" in u.reason]


def test_a_term_read_on_some_ranks_only_is_reported():
    trace = _with_term(stored(), 1e-4)
    _with_term({"ranks": trace["ranks"][1:]}, 1.2345e-4)  # rank 1: a term of no two-digit coefficient
    out = lift(trace)
    assert [u for u in out.unliftable if u.what == "an auxiliary loss" and "rank 1" in u.reason]


def test_a_term_over_the_vocabulary_slice_without_a_tensor_axis_is_reported():
    out = lift(_with_term(stored(), 1e-4, "zsq_local", sliced=True))
    assert [u for u in out.unliftable if u.what == "the logit z loss term"]


def test_label_smoothing_passed_to_cross_entropy_is_lifted():
    trace = stored()
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["nll"][0]["label_smoothing"] = 0.1
    out = lift(trace)
    assert "    label_smoothing = true" in out.text and not out.unliftable


def _counted(trace: dict, counted: int, tokens: int = 12, mask: bool = False) -> dict:
    """Each rank: a summed cross-entropy over ``tokens`` labelled of 16 positions (or a per-token one times a mask
    keeping ``tokens``), divided by a one-element count all-reduced in forward whose value is ``counted`` on every
    rank, times the world size."""
    world = len(trace["ranks"])
    for part in trace["ranks"]:
        for st in part["steps"]:
            n = st["nll"][0]
            total = n["value"] * n["tokens"]
            n.update(reduction="none" if mask else "sum", tokens=16 if mask else tokens, positions=16,
                     value=0.0 if mask else total)
            if mask:
                n["mask"] = {"sum": tokens, "labelled": tokens, "value": total, "stack": [FRAME]}
            st["losses"][0]["value"] = total * world / (counted * world)
            part["collectives"].append({
                "seq": 10_000 + st["step"], "step": st["step"], "phase": "forward", "kind": "all_reduce",
                "ranks": list(range(world)), "dtype": "int64", "bytes": 8, "numel": 1, "op": "sum",
                "api": "c10d.allreduce_", "carried": [], "value_in": float(counted),
                "value_out": float(counted * world), "micro": 0, "stack": [FRAME]})
    return trace


@pytest.mark.parametrize("mask", [False, True], ids=["ignore_index", "mask"])
def test_a_count_of_every_position_is_count_ignored(mask):
    out = lift(_counted(stored(), 16, mask=mask))
    assert "  override tokens: count_ignored" in out.text, out.text
    assert not out.unliftable


@pytest.mark.parametrize("mask", [False, True], ids=["ignore_index", "mask"])
def test_a_count_of_the_labelled_tokens_is_the_derivation(mask):
    """The count read as the token count either way: the gradients' divisor (the stored trace's DDP hook sums
    and never averages) is the same, only the ignored tokens counted differ."""
    out = lift(_counted(stored(), 12, mask=mask))
    assert "count_ignored" not in out.text and not out.unliftable, out.text
    assert _divisor(out.text) == _divisor(lift(_counted(stored(), 16, mask=mask)).text)


def test_the_lift_reads_an_edited_trace_twice_alike():
    trace = _counted(_with_term(stored(), 1e-4), 16, mask=True)
    first = lift(copy.deepcopy(trace)).text
    lift(trace)
    assert lift(trace).text == first


# --------------------------------------------------------------------------- slow: the examples

SCRIPTS = [
    # script, arguments, exit status, lines of the lifted spec, (refuted obligation, text of its script line)
    ("loss_terms.py", [], 0, ["    label_smoothing = true", "    logit_z_loss = true"], None),
    ("tp_loss_terms.py", [], 1, ["    logit_z_loss = true", "  override activations[loss]: reduce_zloss over ()"],
     ("GI activations[loss]", "loss = ce + BETA")),
    ("tp_loss_terms.py", ["--fixed"], 0, ["  override activations[loss]: reduce_zloss over (tp)"], None),
    ("tp_loss_terms.py", ["--smoothing"], 1, ["    label_smoothing = true",
                                              "  override activations[loss]: reduce_smoothing over ()"],
     ("GI activations[loss]", "loss = (1 - ALPHA)")),
    ("tp_loss_terms.py", ["--smoothing", "--fixed"], 0, ["  override activations[loss]: reduce_smoothing over (tp)"],
     None),
    ("tokens_ignored.py", [], 1, ["  override tokens: count_ignored"],
     ("GI grads[dense] normalisation", "dist.all_reduce(count)")),
    ("tokens_ignored.py", ["--fixed"], 0, [], None),
    ("loss_mask.py", [], 1, ["  override tokens: count_ignored"],
     ("GI grads[dense] normalisation", "dist.all_reduce(count)")),
    ("loss_mask.py", ["--fixed"], 0, [], None),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,argv,status,lines,refuted", SCRIPTS,
                         ids=[" ".join([s[0], *s[1]]) for s in SCRIPTS])
def test_the_loss_terms_mask_and_count_are_lifted(script, argv, status, lines, refuted, tmp_path, monkeypatch):
    """Proved where the script computes single-device training's loss; refuted with the term's, or the count's,
    own cause at its line otherwise; nothing left unlifted either way."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    for line in lines:
        assert line in text, text
    if "--fixed" in argv:
        assert "count_ignored" not in text and "over ()" not in text
    if refuted is None:
        assert "proved for all mesh sizes" in out
    else:
        obligation, where = refuted
        assert f"1 finding in examples/traced/{script}:" in out, out
        assert f"examples/traced/{script}:{_line(script, where)}: refuted {obligation}: " in out, out


@pytest.mark.slow
@pytest.mark.torch
def test_a_z_loss_averaged_over_every_position_is_an_auxiliary_loss(tmp_path, monkeypatch):
    """Padded batches whose z-loss averages over every position, not the labelled tokens: no term the model
    states, reported (PL614) and never proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/loss_terms.py", "--padded"])
    assert got == 3 and "not lifted: an auxiliary loss" in err, out + err
    assert "logit_z_loss" not in spec.read_text() and "proved for all mesh sizes" not in out


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("alpha", ["0.5", "0.1"])
def test_label_smoothing_by_hand_is_lifted_as_the_model_states(alpha, tmp_path, monkeypatch):
    """(1 − α)·CE + α·(lse − mean logit) written by hand: at α = 0.5 the term's value is also CE + 1·smooth's, and
    the cross-entropy operand (0.5·CE) must not be read as a halved loss. The expectation, independent of the lift:
    the script's loss is torch's own label-smoothed cross-entropy (checked here on random logits), and DDP averages
    it over the ranks, so single-device training's step: ``label_smoothing = true``, no override of the gradients'
    divisor, proved."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    a = float(alpha)
    logits, labels = torch.randn(24, 17, generator=torch.Generator().manual_seed(3)), torch.arange(24) % 17
    by_hand = (1 - a) * F.cross_entropy(logits, labels) + a * (logits.logsumexp(-1) - logits.mean(-1)).mean()
    assert torch.allclose(by_hand, F.cross_entropy(logits, labels, label_smoothing=a), rtol=1e-6)
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/smoothing_by_hand.py", "--alpha", alpha])
    assert got == 0 and "[PL614]" not in err, out + err
    text = spec.read_text()
    line = _line("smoothing_by_hand.py", "loss = (1 - ALPHA)")
    assert f"    label_smoothing = true  # examples/traced/smoothing_by_hand.py:{line}" in text, text
    assert "override grads" not in text and "divide by" not in text and "activations[loss]" not in text, text
    assert "proved for all mesh sizes" in out
