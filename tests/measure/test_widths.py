"""Byte widths as the spec states them: bf16 parameters and gradients, an fp32 master copy and
Adam's two fp32 moments in the optimizer (optimizer = 12), realised on real PyTorch runs (2 CPU
processes) and compared with the prediction at those widths.

Every expected byte count is written here as the parameter count of the torch model (counted
from its own tensors) times the width the spec states, over the ranks a state is sharded on.
"""

from __future__ import annotations

import re

import pytest

from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.measure.predict import predict
from placement_logic.measure.realise import Realisation, Unrealised, realise, widths_of
from placement_logic.measure.session import Prepared, mesh_sizes, prepare, run_bindings

ZERO_PAPER = "examples/zero_paper.place"  # bytes { params = 2  grads = 2  optimizer = 12 }

SPEC = """from std.data import ddp, zero3
from std.tensor import megatron_tp
model {
  transformer { hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000 }
  bytes { WIDTHS }
  seq = 1024  microbatch = 4
}
mesh { dp = 8 }
plan ddp { dp: ddp }
plan zero3 { dp: zero3 }
"""
TP_SPEC = """from std.tensor import megatron_tp
model {
  transformer { hidden = 1024 layers = 8 heads = 16 ffn = 4096 vocab = 32000 }
  bytes { params = 2  grads = 2  optimizer = 12 }
  seq = 1024  microbatch = 4
}
mesh { tp = 8 }
plan tp { tp: megatron_tp }
"""


def _spec(widths: str):
    return load_string(SPEC.replace("WIDTHS", widths), file="<widths>")


def _realise(spec, name: str) -> Realisation | Unrealised:
    plan = spec.plan(name)
    sizes = mesh_sizes(plan, None)
    return realise(plan, sizes, run_bindings(spec, sizes))


# ---- which widths run, and which cannot (no torch needed) ----

def test_stated_bf16_widths_run_in_bf16_with_a_master_copy():
    for name in ("dp", "zero1", "zero2", "zero3"):
        r = _realise(load_spec(ZERO_PAPER), name)
        assert isinstance(r, Realisation), r
        assert (r.param_bytes, r.optimizer, r.master_copy) == (2, "adam", True)
        assert widths_of(r) == {"params": 2, "grads": 2, "optimizer": 12, "activations": 2}
        assert "torch.bfloat16" in r.implementation and "master copy" in r.implementation


def test_no_stated_widths_run_in_fp32_as_before():
    spec = load_spec("examples/library/ddp.place")  # no bytes section: the defaults 2/2/12 are not stated
    assert spec.plans[0].model.bytes_stated == ()
    r = _realise(spec, "ddp")
    assert (r.param_bytes, r.optimizer, r.master_copy) == (4, "adam", False)
    assert widths_of(r) == {"params": 4, "grads": 4, "optimizer": 8, "activations": 4}
    r = _realise(load_spec("examples/measure/grad_sync_bugs.place"), "ddp_ok")  # 4/4/4 stated: SGD with momentum
    assert (r.param_bytes, r.optimizer, r.master_copy) == (4, "sgd_momentum", False)


@pytest.mark.parametrize("widths,want", [
    ("params = 4  grads = 4  optimizer = 12", (4, "adam", True)),
    ("params = 4  grads = 4  optimizer = 8", (4, "adam", False)),
    ("params = 4  grads = 4  optimizer = 0", (4, "sgd", False)),
    ("optimizer = 12", (2, "adam", True)),  # params and grads at their default 2
])
def test_stated_widths_choose_dtype_and_optimizer(widths, want):
    r = _realise(_spec(widths), "ddp")
    assert (r.param_bytes, r.optimizer, r.master_copy) == want


@pytest.mark.parametrize("widths,reason", [
    ("params = 2  grads = 4  optimizer = 12", "autograd gives a parameter's gradient"),
    ("params = 1  grads = 1  optimizer = 12", "realises 2 (torch.bfloat16) and 4"),
    ("params = 2  grads = 2  optimizer = 8", "fp32 state without a master copy"),
    ("params = 4  grads = 4  optimizer = 16", "realises 0 (SGD)"),
])
def test_widths_pytorch_cannot_realise_are_unrealised(widths, reason):
    r = _realise(_spec(widths), "ddp")
    assert isinstance(r, Unrealised)
    assert any(reason in x for x in r.reasons), r.reasons


def test_bf16_beyond_data_axes_is_unrealised():
    r = _realise(load_string(TP_SPEC, file="<tp>"), "tp")
    assert isinstance(r, Unrealised)
    assert any("realised only on data axes" in x for x in r.reasons), r.reasons


def test_the_prediction_is_made_at_the_stated_widths():
    spec = load_spec(ZERO_PAPER)
    p = prepare(spec, "dp", None, 2)
    assert isinstance(p, Prepared)
    psi = p.prediction.psi
    assert p.prediction.widths == {"params": 2, "grads": 2, "optimizer": 12, "activations": 2}
    assert p.prediction.states == {"params": 2 * psi, "grads": 2 * psi, "optimizer": 12 * psi}
    (ar,) = p.prediction.collectives
    assert (ar.kind, ar.buffer_bytes) == ("all_reduce", 2 * psi)
    # the same plan predicted in fp32 (what every run used to be compared with) is another prediction
    fp32 = predict(spec, p.plan, p.shape, p.realisation.sizes, "adam")
    assert fp32.states == {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi}


# ---- real runs ----

@pytest.fixture(scope="module")
def reports():
    torch = pytest.importorskip("torch")  # noqa: F841
    from placement_logic.measure.session import measure_many

    spec = load_spec(ZERO_PAPER)
    items = [(spec, name) for name in ("dp", "zero1", "zero2", "zero3")]
    items.append((_spec("params = 4  grads = 4  optimizer = 12"), "ddp"))
    reps = measure_many(items, steps=3, with_checker=False)
    return {("fp32_master" if rep.file == "<widths>" else rep.plan): rep for rep in reps}


def _psi(rep) -> int:
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.shape import TinyShape

    m = tiny.build(TinyShape(**dict(rep.shape)), 0)
    return sum(p.numel() for p in m.parameters())


def _row(rep, quantity):
    rows = [r for r in rep.rows if r.quantity.startswith(quantity)]
    assert len(rows) == 1, [r.quantity for r in rep.rows]
    return rows[0]


@pytest.mark.torch
@pytest.mark.parametrize("plan,params,grads,opt", [
    # bytes per parameter on one of N = 2 ranks at params 2, grads 2, optimizer 12 (4 + 4 + 4)
    ("dp", 2, 2, 12), ("zero1", 2, 2, 6), ("zero2", 2, 1, 6), ("zero3", 1, 1, 6),
    ("fp32_master", 4, 4, 12),  # params 4, grads 4, optimizer 12: Adam with a master copy of fp32 parameters
])
def test_held_bytes_are_count_times_stated_width(reports, plan, params, grads, opt):
    rep = reports[plan]
    psi = _psi(rep)
    assert _row(rep, "parameter count").measured == psi
    for state, per in (("params", params), ("grads", grads), ("optimizer", opt)):
        row = _row(rep, f"{state} held")
        assert row.status == "match", (state, row)
        assert row.measured == row.predicted == per * psi, state
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]


@pytest.mark.torch
@pytest.mark.parametrize("plan,expected", [
    # the ZeRO paper's collectives at 2 bytes per element, two microbatches per step
    ("dp", {"all_reduce": 2}),
    ("zero1", {"reduce_scatter": 2, "all_gather": 2}),
    ("zero2", {"reduce_scatter": 4, "all_gather": 2}),
    ("zero3", {"all_gather": 8, "reduce_scatter": 4}),
    ("fp32_master", {"all_reduce": 4}),
])
def test_collectives_carry_the_stated_width(reports, plan, expected):
    rep = reports[plan]
    psi = _psi(rep)
    measured = {}
    for r in rep.rows:
        m = re.match(r"(\w+) over dp(?: \(measured: (\w+)\))?", r.quantity)
        if m:
            assert r.status == "match", r
            measured[m.group(2) or m.group(1)] = r.measured
    assert measured == {k: v * psi for k, v in expected.items()}


@pytest.mark.torch
@pytest.mark.parametrize("plan", ["dp", "zero1", "zero2", "zero3"])
def test_bf16_runs_stay_equivalent_within_bf16_round_off(reports, plan):
    eq = reports[plan].equivalence
    assert eq.tolerance == 2.0 ** -8 and eq.within and eq.replicas_agree
    assert any("(bf16)" in n for n in reports[plan].notes)


HYBRID = """from std.data import hybrid_shard
model {
  transformer { hidden = 4096 layers = 32 heads = 32 ffn = 16384 vocab = 50304 }
  bytes { params = 2  grads = 2  optimizer = 12 }
  seq = 2048  microbatch = 4
}
mesh { node = 4  gpu = 8 }
plan hsdp { [node, gpu]: hybrid_shard }
"""
ONE_AXIS = """from std.data import ddp, fsdp_shard_grad_op
model {
  transformer { hidden = 4096 layers = 32 heads = 32 ffn = 16384 vocab = 50304 }
  bytes { params = 2  grads = 2  optimizer = 12 }
  seq = 2048  microbatch = 4
}
mesh { gpu = 8 }
plan shard_grad_op { gpu: fsdp_shard_grad_op }
plan no_allreduce { gpu: ddp  override grads: reduce over () }
"""


@pytest.mark.torch
@pytest.mark.slow
def test_bf16_hybrid_shard_shard_grad_op_and_a_bug():
    """HYBRID_SHARD on 4 ranks (2 × 2) and SHARD_GRAD_OP at the stated widths match count × width;
    DDP without its all-reduce in bf16 leaves the replicas apart."""
    pytest.importorskip("torch")
    from placement_logic.measure.session import measure_many

    one = load_string(ONE_AXIS, file="<one>")
    reps = {rep.plan: rep for rep in measure_many(
        [(load_string(HYBRID, file="<hsdp>"), "hsdp"), (one, "shard_grad_op"), (one, "no_allreduce")],
        steps=3, with_checker=False)}
    psi = _psi(reps["hsdp"])
    for name in ("hsdp", "shard_grad_op"):
        rep = reps[name]
        assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
        # sharded over the 2 ranks of the shard axis: 2/2, 2/2, 12/2 bytes per parameter
        assert [_row(rep, f"{s} held").measured for s in ("params", "grads", "optimizer")] == [psi, psi, 6 * psi]
    # the replicas' all-reduce of the bf16 gradient shards: 2 bytes × Ψ/2 per rank
    assert _row(reps["hsdp"], "all_reduce over node").measured == psi
    bug = reps["no_allreduce"]
    assert bug.outcome == "diverged" and not bug.equivalence.replicas_agree


@pytest.mark.torch
def test_the_report_says_which_widths_ran(reports):
    notes = reports["dp"].notes
    assert any("params 2 B and grads 2 B per element (torch.bfloat16), optimizer 12 B per parameter "
               "(an fp32 master copy (4) + Adam's two fp32 moments (8))" in n for n in notes), notes
