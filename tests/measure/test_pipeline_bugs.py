"""Real PyTorch runs of pipeline schedules and of bugs from the checker's catalogue.

Pipelines (4 CPU processes, dp = pp = 2): the bytes each stage holds are counted from the
torch stage modules themselves, the point-to-point bytes from the chain of virtual
stages (s·b·h fp32 activations forward, their gradients backward, per microbatch), and
the run stays within 1e-5 of one process. Bugs from examples/bugs/: each diverges from
one process on variable-length batches, the report carries the checker's counterexample
beside the measured divergence, and the safe plans on the same data stay within 1e-5.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from placement_logic.frontend.loader import load_spec
from placement_logic.measure import render
from placement_logic.measure.session import measure_many
from placement_logic.measure.shape import TinyShape

pytestmark = pytest.mark.torch

PIPELINES = [("examples/library/gpipe.place", "gpipe"), ("examples/library/one_f_one_b.place", "one_f_one_b"),
             ("examples/library/interleaved_1f1b.place", "interleaved_1f1b")]
BUGS = [("examples/bugs/dp_mean_of_means.place", "mean_of_device_means"),
        ("examples/bugs/tp_clip_local_shard.place", "tp_local_clip"),
        ("examples/bugs/grad_reduced_twice.place", "ddp_plus_manual_allreduce"),
        ("examples/bugs/zero1_no_regather.place", "zero1_forgets_allgather")]
SAFE = [("examples/library/ddp.place", "ddp"), ("examples/library/zero1.place", "zero1"),
        ("examples/library/megatron_tp.place", "megatron_tp")]


@pytest.fixture(scope="module")
def reports():
    items = [(load_spec(f), p) for f, p in PIPELINES + BUGS + SAFE]
    return {rep.plan: rep for rep in measure_many(items, steps=3, with_checker=True)}


def _row(rep, quantity):
    rows = [r for r in rep.rows if r.quantity.startswith(quantity)]
    assert len(rows) == 1, [r.quantity for r in rep.rows]
    return rows[0]


@pytest.mark.parametrize("plan", [p for _, p in PIPELINES])
def test_pipeline_matches_and_stays_equivalent(reports, plan):
    rep = reports[plan]
    assert rep.outcome == "matched", [(r.quantity, r.status, r.note) for r in rep.rows]
    assert rep.equivalence.param_rel <= 1e-5 and rep.equivalence.loss_rel <= 1e-5
    assert rep.equivalence.replicas_agree


@pytest.mark.parametrize("plan", [p for _, p in PIPELINES])
def test_stage_bytes_counted_from_the_stage_modules(reports, plan):
    from placement_logic.measure.ranks.pipeline import stage_model

    rep = reports[plan]
    sh = TinyShape(**dict(rep.shape))
    p = dict(rep.mesh)["pp"]
    v = {"interleaved_1f1b": 4}.get(plan, 1)
    held = []
    for rank in range(p):
        n = sum(q.numel() for c in range(v) for q in stage_model(sh, 0, rank + c * p, p * v).parameters())
        held.append(4 * n)
    row = _row(rep, "params held")
    # ranks in row-major (dp, pp) order: pp coordinate = rank % p
    assert row.per_rank == tuple(held[k % p] for k in range(len(row.per_rank)))
    assert sum(held) == 4 * sh.param_count()


@pytest.mark.parametrize("plan", [p for _, p in PIPELINES])
def test_point_to_point_bytes_follow_the_chain_of_stages(reports, plan):
    rep = reports[plan]
    sh = TinyShape(**dict(rep.shape))
    p = dict(rep.mesh)["pp"]
    v = {"interleaved_1f1b": 4}.get(plan, 1)
    boundary = sh.seq * sh.microbatch * sh.hidden * 4  # one microbatch's activations, fp32
    chain = p * v
    for way, phase in (("sent", "forward"), ("received", "forward"), ("sent", "backward"), ("received", "backward")):
        # forward: virtual stage k sends to k + 1; backward: k + 1 sends its input gradient to k
        sends = (way == "sent") == (phase == "forward")
        per_pp = [sh.microbatches * boundary * sum(1 for k in range(chain - 1) if (k if sends else k + 1) % p == rank)
                  for rank in range(p)]
        row = _row(rep, f"p2p {way}, {phase} over pp")
        got = row.per_rank or (row.measured,) * 4
        assert got == tuple(per_pp[k % p] for k in range(len(got)))
        # the cost engine: microbatches × chunks transfers of s·b·h per phase (an interior stage)
        assert row.predicted == sh.microbatches * v * boundary


@pytest.mark.parametrize("plan", [p for _, p in BUGS])
def test_catalogue_bugs_diverge_beside_the_checkers_counterexample(reports, plan):
    pytest.importorskip("placement_logic.check.run")
    rep = reports[plan]
    eq = rep.equivalence
    assert rep.outcome == "diverged"
    assert eq.param_rel > eq.tolerance or not eq.replicas_agree
    cex = rep.checker.counterexamples
    assert rep.checker.verdict == "refuted" and cex
    assert cex[0].command.startswith("placement check examples/bugs/") and cex[0].equation and cex[0].sizes
    text = render.text([rep])
    assert "measured divergence:" in text and "checker's counterexample" in text
    assert f"re-run: {cex[0].command}" in text and f"fails: {cex[0].equation}" in text
    doc = render.to_json([rep])["plans"][0]
    assert doc["checker"]["counterexamples"][0]["command"] == cex[0].command


def test_mean_of_means_needs_unequal_token_counts(reports):
    rep = reports["mean_of_device_means"]
    note = next(n for n in rep.notes if n.startswith("valid tokens"))
    steps = [s.split(": ")[1].split(", ") for s in note.split("masked): ")[1].split("; ")]
    assert any(len(set(counts)) > 1 for counts in steps)  # the ranks hold different numbers of tokens
    assert rep.equivalence.param_rel > 10 * rep.equivalence.tolerance
    # the checker's counterexample is the same mechanism: unequal token counts per device
    assert any("token counts" in label for label, _ in rep.checker.counterexamples[0].lines)


def test_bugs_that_break_replicas(reports):
    assert not reports["zero1_forgets_allgather"].equivalence.replicas_agree  # stale shards
    assert not reports["tp_local_clip"].equivalence.replicas_agree  # replicated params clipped differently over tp
    assert reports["ddp_plus_manual_allreduce"].equivalence.replicas_agree  # wrong (dp× too large), but everywhere


@pytest.mark.parametrize("plan", [p for _, p in SAFE])
def test_safe_plans_on_variable_length_batches(reports, plan):
    rep = reports[plan]
    assert rep.outcome == "matched"
    assert rep.equivalence.param_rel <= 1e-5 and rep.equivalence.loss_rel <= 1e-5


def test_second_all_reduce_is_explained_by_its_mechanism(reports):
    rows = [r for r in reports["ddp_plus_manual_allreduce"].rows if r.mechanism == "gradient-reduced-twice"]
    assert len(rows) == 1
    # two all-reduces of the whole fp32 gradient over dp, where the engine sizes one
    assert rows[0].measured == 2 * rows[0].predicted
