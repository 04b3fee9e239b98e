"""Real PyTorch runs (2 CPU processes): held bytes and collectives against the published
formulas for the tiny model, equivalence with one process, and divergence of the bugs.

Every expected byte count is written from the formulas of the ZeRO paper and Megatron-LM
(fp32: 4 bytes per parameter and gradient, 8 for Adam's two moments, 4 for SGD
momentum) with Ψ counted independently from the torch model's own tensors.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec
from placement_logic.measure.session import measure_many

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[2]

SAFE = [("examples/library/ddp.place", "ddp"), ("examples/library/zero1.place", "zero1"),
        ("examples/library/zero2.place", "zero2"), ("examples/library/zero3.place", "zero3"),
        ("examples/measure/grad_sync_bugs.place", "zero3_clip_ok")]
BUGS = [("examples/measure/grad_sync_bugs.place", "ddp_no_allreduce"),
        ("examples/measure/grad_sync_bugs.place", "ddp_sum_not_mean"),
        ("examples/measure/grad_sync_bugs.place", "zero3_local_clip")]
TP_SPEC = """from std.tensor import megatron_tp
model {
  transformer { hidden = 4096 layers = 32 heads = 32 ffn = 16384 vocab = 50304 }
  seq = 2048  microbatch = 4
}
mesh { tp = 8 }
plan tp { tp: megatron_tp }
"""
TP_TIED = TP_SPEC.replace("vocab = 50304", "vocab = 50304 tied_embeddings").replace("plan tp {", "plan tp_tied {")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tp_file = tmp_path_factory.mktemp("tp") / "tp.place"
    tp_file.write_text(TP_SPEC)
    tied_file = tp_file.with_name("tp_tied.place")
    tied_file.write_text(TP_TIED)
    items = [(load_spec(f), p) for f, p in SAFE + BUGS] + [(load_spec(str(tp_file)), "tp"),
                                                          (load_spec(str(tied_file)), "tp_tied")]
    reps = measure_many(items, steps=3, with_checker=True)
    return {rep.plan: rep for rep in reps}


def _psi(rep) -> int:
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.shape import TinyShape

    m = tiny.build(TinyShape(**dict(rep.shape)), 0)
    return sum(p.numel() for p in m.parameters())


def _row(rep, quantity):
    rows = [r for r in rep.rows if r.quantity.startswith(quantity)]
    assert len(rows) == 1, [r.quantity for r in rep.rows]
    return rows[0]


@pytest.mark.parametrize("plan,params,grads,opt", [
    ("ddp", 4, 4, 8), ("zero1", 4, 4, 4), ("zero2", 4, 2, 4), ("zero3", 2, 2, 4),
])
def test_held_bytes_follow_the_zero_paper(reports, plan, params, grads, opt):
    rep = reports[plan]
    psi = _psi(rep)
    assert _row(rep, "parameter count").measured == psi
    # bytes per parameter on one of N=2 ranks: DP 4+4+8, ZeRO-1 optimizer/N, ZeRO-2 and -3 grads/N too
    assert _row(rep, "params held").measured == params * psi
    assert _row(rep, "grads held").measured == grads * psi
    row = _row(rep, "optimizer held")
    assert sum(row.per_rank or (row.measured,) * 2) == 2 * opt * psi


@pytest.mark.parametrize("plan,expected", [
    # two microbatches per step, gradients accumulated:
    ("ddp", {"all_reduce": 4}),  # one all-reduce of the accumulated gradients (no_sync on the first)
    ("zero1", {"reduce_scatter": 4, "all_gather": 4}),  # whole gradients accumulate, then one reduce-scatter
    ("zero2", {"reduce_scatter": 8, "all_gather": 4}),  # no whole gradient to accumulate in: one per microbatch
    ("zero3", {"all_gather": 16, "reduce_scatter": 8}),  # gathered in forward and backward, per microbatch
])
def test_collectives_follow_the_zero_paper(reports, plan, expected):
    rep = reports[plan]
    psi = _psi(rep)
    measured = {}
    for r in rep.rows:
        m = re.match(r"(\w+) over dp(?: \(measured: (\w+)\))?", r.quantity)
        if m:
            measured[m.group(2) or m.group(1)] = r.measured
    assert measured == {k: v * psi for k, v in expected.items()}


def test_tensor_parallel_all_reduces(reports):
    rep = reports["tp"]
    sh = dict(rep.shape)
    # Megatron: two all-reduces of s·b·h per layer in forward and two in backward (fp32), one more for the
    # vocabulary-parallel embedding (forward) and one for the head's input gradient (backward), and the
    # vocabulary-parallel cross entropy's three all-reduces of one fp32 value per token (max, target
    # logit, sum of exponentials)
    sbh = sh["seq"] * sh["microbatch"] * sh["hidden"] * 4
    m = sh["microbatches"]  # per microbatch
    assert _row(rep, "all_reduce over tp").measured == m * ((4 * sh["layers"] + 2) * sbh + 3 * sh["seq"] * sh["microbatch"] * 4)
    # the embedding and the head are sharded over the vocabulary, as the plan says: parameters and optimizer
    # state are exact; without a data-parallel wrapper DTensor leaves the embedding's gradient whole
    # (V·h fp32), V·h·4·(t−1)/t bytes more than the plan's shard
    assert [_row(rep, f"{s} held").status for s in ("params", "optimizer")] == ["match"] * 2
    grads = _row(rep, "grads held")
    assert grads.mechanism == "dtensor-embedding-grad-whole"
    t = dict(rep.mesh)["tp"]
    assert grads.measured - grads.predicted == sh["vocab"] * sh["hidden"] * 4 * (t - 1) / t
    assert rep.outcome == "matched"


@pytest.mark.parametrize("plan", [p for _, p in SAFE] + ["tp"])
def test_safe_plans_match_and_stay_equivalent(reports, plan):
    rep = reports[plan]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    assert rep.equivalence.param_rel <= 1e-5 and rep.equivalence.loss_rel <= 1e-5
    assert rep.equivalence.replicas_agree


@pytest.mark.parametrize("plan", [p for _, p in BUGS])
def test_bugs_diverge(reports, plan):
    rep = reports[plan]
    assert rep.outcome == "diverged"
    assert rep.equivalence.param_rel > 10 * rep.equivalence.tolerance  # safe plans stay near 1e-7


@pytest.mark.parametrize("plan", [p for _, p in BUGS])
def test_checker_refutes_what_diverges(reports, plan):
    pytest.importorskip("placement_logic.check.run")
    checker = reports[plan].checker
    assert checker.available and checker.verdict == "refuted" and checker.summary


@pytest.mark.parametrize("plan", ["ddp", "zero3", "zero3_clip_ok"])
def test_checker_proves_what_stays_equivalent(reports, plan):
    pytest.importorskip("placement_logic.check.run")
    assert reports[plan].checker.verdict == "proved"


def test_skipped_allreduce_leaves_replicas_apart(reports):
    assert not reports["ddp_no_allreduce"].equivalence.replicas_agree
    assert reports["ddp_sum_not_mean"].equivalence.replicas_agree  # wrong, but the same everywhere


def _doc_commands():
    text = (ROOT / "docs" / "validation.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("placement measure"):
                yield line


@pytest.mark.slow
def test_documented_command_runs():
    import shlex

    commands = list(_doc_commands())
    assert commands
    out, err = io.StringIO(), io.StringIO()
    argv = shlex.split(commands[0])[1:]
    status = main(argv + ["--format", "json"], out=out, err=err)
    doc = json.loads(out.getvalue())
    assert status == 1  # the documented example contains a diverging bug
    outcomes = {p["plan"]: p["outcome"] for p in doc["plans"]}
    assert outcomes == {"ddp_ok": "matched", "ddp_sum_not_mean": "diverged"}


def test_tied_embedding_kept_whole_under_tensor_parallelism(reports):
    """With tied embeddings the harness keeps the embedding (the head) whole on the tensor axis:
    V·h·(t−1)/t more bytes per parameter width than the plan's shard, in every state."""
    rep = reports["tp_tied"]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    sh, t = dict(rep.shape), dict(rep.mesh)["tp"]
    excess = sh["vocab"] * sh["hidden"] * (t - 1) // t
    for state, width in (("params", 4), ("grads", 4), ("optimizer", 8)):
        row = _row(rep, f"{state} held")
        assert row.mechanism == "tensor-replicated-params"
        assert row.measured - row.predicted == width * excess


def test_clip_scalars_are_explained_by_their_mechanism(reports):
    rows = [r for r in reports["zero3_clip_ok"].rows if r.mechanism == "clip-norm-scalars"]
    assert len(rows) == 1 and rows[0].predicted == 0
    assert rows[0].measured == 4 * _psi_tensors(reports["zero3_clip_ok"])


def _psi_tensors(rep) -> int:
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.shape import TinyShape

    return len(list(tiny.build(TinyShape(**dict(rep.shape)), 0).parameters()))
