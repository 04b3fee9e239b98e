"""Real runs of the plans the harness reaches beyond one or two axes (slow: 4 and 8 processes).

Data × tensor × pipeline (8 processes, full recomputation), tensor × pipeline, ZeRO-1
under a pipeline, and full recomputation under sequence parallelism. Every expected
number is written from Megatron-LM's and the ZeRO paper's counts for the tiny shape
(per layer and microbatch: 2 + 2 tensor-parallel collectives of s·b·h, 2 more when the
forward is recomputed; one s·b·h more for the vocabulary-parallel embedding and one for
the head; three fp32 values per token for the vocabulary-parallel cross entropy) and from
the parameters each stage holds, counted from the shape.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.measure.session import measure_many

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TP_PP = """from std.tensor import megatron_tp
from std.pipeline import one_f_one_b
from std.data import zero1
model {
  transformer { hidden = 4096 layers = 32 heads = 32 ffn = 16384 vocab = 50304 }
  seq = 2048  microbatch = 4  microbatches = 8
}
mesh { tp = 8  pp = 4 }
plan tp_pp { tp: megatron_tp  pp: one_f_one_b }
"""
ZERO1_PP = TP_PP.replace("mesh { tp = 8  pp = 4 }", "mesh { dp = 2  pp = 4 }").replace(
    "plan tp_pp { tp: megatron_tp  pp: one_f_one_b }", "plan zero1_pp { dp: zero1  pp: one_f_one_b }")


@pytest.fixture(scope="module")
def reports():
    items = [(load_spec("examples/llama70b_3d.place"), "plain_3d"), (load_string(TP_PP, file="<tp_pp>"), "tp_pp"),
             (load_string(ZERO1_PP, file="<zero1_pp>"), "zero1_pp"),
             (load_spec("examples/safe/pipeline_parallel.place"), "one_f_one_b"),
             (load_spec("examples/library/full_recompute.place"), "full_recompute")]
    reps = {}
    for spec_, name in items:  # one launch per plan: the meshes differ in size
        (rep,) = measure_many([(spec_, name)], steps=2, with_checker=False)
        reps[name] = rep
    return reps


def _row(rep, quantity):
    rows = [r for r in rep.rows if r.quantity.startswith(quantity)]
    assert len(rows) == 1, [r.quantity for r in rep.rows]
    return rows[0]


def _tp_all_reduces(sh, stages, recompute, rank_stage):
    sbh, per_token = sh["seq"] * sh["microbatch"] * sh["hidden"] * 4, sh["seq"] * sh["microbatch"] * 4
    m = sh["microbatches"]
    calls = (6 if recompute else 4) * sh["layers"] // stages * m
    first, last = rank_stage == 0, rank_stage == stages - 1
    return (calls + m * first + m * last) * sbh + 3 * m * last * per_token


def test_three_d_plan_runs_on_eight_processes(reports):
    rep = reports["plain_3d"]
    assert dict(rep.mesh) == {"dp": 2, "tp": 2, "pp": 2} and rep.devices == 8
    assert rep.equivalence.within and rep.equivalence.replicas_agree
    for state in ("params", "grads", "optimizer"):
        assert _row(rep, f"{state} held").status == "match"
    row = _row(rep, "all_reduce over tp")
    assert row.mechanism == "vocab-parallel-stage-ends"
    sh = dict(rep.shape)
    # ranks in (dp, tp, pp) row-major order: the pipeline coordinate is the rank's last digit
    want = tuple(_tp_all_reduces(sh, 2, True, rank % 2) for rank in range(8))
    assert (row.per_rank or (row.measured,) * 8) == want


def test_tensor_times_pipeline(reports):
    rep = reports["tp_pp"]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    sh = dict(rep.shape)
    row = _row(rep, "all_reduce over tp")
    want = tuple(_tp_all_reduces(sh, 2, False, rank % 2) for rank in range(4))
    assert (row.per_rank or (row.measured,) * 4) == want


def test_zero1_under_a_pipeline(reports):
    rep = reports["zero1_pp"]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    from placement_logic.measure.shape import TinyShape

    shape = TinyShape(**dict(rep.shape))
    # ZeRO-1 per stage: the stage's parameters reduce-scattered and all-gathered over dp (4 B each)
    stage = tuple(4 * shape.stage_param_count(rank % 2, 2) for rank in range(4))
    for kind in ("reduce_scatter over dp", "all_gather over dp"):
        row = _row(rep, kind)
        assert (row.per_rank or (row.measured,) * 4) == stage
    assert _row(rep, "optimizer held").per_rank == stage  # Adam's 8 B per parameter over 2 ranks


def test_full_recompute_reruns_the_tensor_parallel_collectives(reports):
    rep = reports["full_recompute"]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    sh = dict(rep.shape)
    sbh = sh["seq"] * sh["microbatch"] * sh["hidden"] * 4
    # sequence parallelism: per layer 2 all-gathers + 2 reduce-scatters forward, as many in the
    # recomputed forward, and as many backward; one more each for the embedding and the head; per microbatch
    for kind in ("all_gather over tp", "reduce_scatter over tp"):
        assert _row(rep, kind).measured == sh["microbatches"] * (6 * sh["layers"] + 2) * sbh


def test_tied_embeddings_across_stages(reports):
    rep = reports["one_f_one_b"]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    from placement_logic.measure.shape import TinyShape

    shape = TinyShape(**dict(rep.shape))
    assert shape.tied_embeddings
    # the last stage holds its own copy of the embedding: V·h more parameters than its blocks and norm
    assert shape.stage_param_count(1, 2) == shape.layers // 2 * shape.block_params() + shape.final_params() \
        + shape.vocab * shape.hidden
    held = _row(rep, "params held")
    assert (held.per_rank or (held.measured,) * 4) == tuple(4 * shape.stage_param_count(rank % 2, 2)
                                                           for rank in range(4))
    # Megatron's embedding group: one all-reduce of the V·h fp32 gradient between the first and last stage
    sync = _row(rep, "all_reduce over pp")
    assert (sync.measured, sync.mechanism) == (shape.vocab * shape.hidden * 4, "tied-embedding-sync")
