"""Time within a step, measured: `grads: no_zero_grad` (DDP's buffers not cleared after the step),
`optimizer: step_every_microbatch` (DDP synchronising and stepping after every microbatch) and
`grads: reduce_accumulated_every_microbatch` (ZeRO's whole buffer kept and reduce-scattered into
the shard's gradient after every microbatch).

The oracles: the realisation's reasons read against the strategies each statement is realised
with; the harness's own update arithmetic on one parameter with plain SGD (lr 0.05), the expected
values written out by hand; the real runs of the catalogue's bug specs against single-device
training (each diverges, its safe twin matches) beside the checker's refutation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.measure.realise import Realisation, Unrealised, realise
from placement_logic.measure.session import run_bindings

ROOT = Path(__file__).resolve().parents[2]

# (bug spec, its plan, the safe twin's plan)
PAIRS = [("bf16_zero0_zero_grad_skipped", "bf16_stage0_no_zero_grad", "bf16_stage0_zero_grad"),
         ("openprompt_step_outside_accumulation", "tutorial_step_every_backward", "tutorial_step_at_the_boundary"),
         ("per_block_adamw_every_microbatch", "per_block_adamw_per_microbatch", "per_block_adamw_per_window"),
         ("colossalai_zero_accumulation_rereduced", "zero_accumulation_rereduced", "zero_accumulation_reduced_once"),
         ("zero2_reduced_grads_not_cleared", "zero2_tp_grads_not_cleared", "zero2_tp_grads_cleared")]


def _realise(text: str, sizes: dict[str, int]):
    spec = load_string(text, "time.place")
    return realise(spec.plans[0], sizes, run_bindings(spec, sizes))


def _plan(data: str, *overrides: str) -> str:
    lines = "".join(f"  override {o}\n" for o in overrides)
    return (f"from std.data import {data}\nmodel {{\n  params = 1e6\n  microbatches = 4\n}}\nmesh {{\n  dp = 2\n}}\n"
            f"plan p {{\n  dp: {data}\n{lines}}}\n")


# ---- which strategies carry each statement (no torch) ----

@pytest.mark.parametrize("data, override, field", [
    ("ddp", "grads: no_zero_grad", "carry_gradients"),
    ("ddp", "optimizer: step_every_microbatch", "step_every_microbatch"),
    ("zero1", "grads: reduce_accumulated_every_microbatch", "reduce_accumulated"),
    ("zero2", "grads: reduce_accumulated_every_microbatch", "reduce_accumulated")])
def test_each_statement_is_realised_on_its_strategy(data, override, field):
    r = _realise(_plan(data, override), {"dp": 2})
    assert isinstance(r, Realisation), r
    assert getattr(r, field) is True
    plain = _realise(_plan(data), {"dp": 2})
    assert getattr(plain, field) is False  # the derived step: nothing of it


@pytest.mark.parametrize("data, overrides, words", [
    # ZeRO's flat shard would count a carried gradient twice (the shard's gradient and the buffer): not run
    ("zero2", ("grads: no_zero_grad",), "no_zero_grad is realised only with DistributedDataParallel"),
    ("zero3", ("optimizer: step_every_microbatch",), "step_every_microbatch is realised only with Distributed"),
    ("ddp", ("grads: reduce_accumulated_every_microbatch",), "realised only with ZeRO-1 or ZeRO-2"),
    # a model of Ψ alone: its one group, dense, has no layout in the harness's transformer
    ("ddp", ("optimizer[dense]: step_every_microbatch",), "realised for every group, or for the groups"),
    ("ddp", ("grads[dense]: no_zero_grad",), "grads[dense]: no_zero_grad is not realised by the harness"),
    ("ddp", ("grads: no_zero_grad", "optimizer: step_every_microbatch"), "together are not realised")])
def test_what_the_harness_cannot_run_keeps_its_reason(data, overrides, words):
    r = _realise(_plan(data, *overrides), {"dp": 2})
    assert isinstance(r, Unrealised)
    assert any(words in x for x in r.reasons), r.reasons


TRANSFORMER = """from std.data import ddp
model {
  transformer {
    hidden = 64
    layers = 2
    heads = 4
    ffn = 256
    vocab = 128
    norm = rmsnorm
    gated_mlp
    bias = false
  }
  seq = 16
  microbatch = 2
  microbatches = 4
}
mesh {
  dp = 2
}
plan p {
  dp: ddp
"""


def test_named_groups_are_stepped_on_their_own():
    r = _realise(TRANSFORMER + "  override optimizer[matrices]: step_every_microbatch\n"
                 "  override optimizer[norms]: step_every_microbatch\n}\n", {"dp": 2})
    assert isinstance(r, Realisation) and r.step_every_microbatch and r.stepped_groups == ("matrices", "norms")
    assert "the matrices, norms groups' own optimizer" in r.implementation
    every = _realise(TRANSFORMER + "  override optimizer[norms]: step_every_microbatch\n"
                     "  override optimizer: step_every_microbatch\n}\n", {"dp": 2})
    assert every.step_every_microbatch and every.stepped_groups == ()  # every group: one optimizer
    tied = _realise(TRANSFORMER.replace("bias = false", "bias = false\n    tied_embeddings")
                    + "  override optimizer[embedding]: step_every_microbatch\n}\n", {"dp": 2})
    assert isinstance(tied, Unrealised) and "untied for embedding and head" in tied.reasons[0]
    # the fused q/k/v projection holds the attention and kv rows together: one of them is not stepped alone
    attention = _realise(TRANSFORMER + "  override optimizer[attention]: step_every_microbatch\n}\n", {"dp": 2})
    assert isinstance(attention, Unrealised) and "optimizer[attention]" in attention.reasons[0]


def test_muon_every_microbatch_stays_unrealised():
    from placement_logic.measure import optimizer_muon

    plan = load_spec(ROOT / "examples/bugs/zero3_muon_every_microbatch.place").plan("zero3_muon_per_microbatch")
    reasons = optimizer_muon.scheme(plan)
    assert isinstance(reasons, list) and any("step_every_microbatch is not realised beside Muon" in x for x in reasons)


# ---- the harness's arithmetic on one parameter (torch, no process group but the last) ----

def _sgd_param(values):
    torch = pytest.importorskip("torch")
    from placement_logic.measure.ranks.common import LR, make_optimizer

    assert LR["sgd"] == 0.05
    p = torch.nn.Parameter(torch.tensor(values, dtype=torch.float64))
    return torch, p, make_optimizer("sgd", [p])


@pytest.mark.torch
@pytest.mark.parametrize("every", [False, True])
def test_step_every_microbatch_updates_after_each_micro_step(every):
    from placement_logic.measure.ranks.training import after_microstep, clear_after_step

    torch, p, opt = _sgd_param([1.0])
    r = Realisation("p", (("dp", 1),), "x", step_every_microbatch=every)
    m = 2
    for k, a in enumerate((1.0, 3.0)):  # micro-step losses a·θ²/2 (the 1/m weight folded into a): gradient a·θ
        (a * p * p / 2).sum().backward()
        after_microstep(r, opt, k, m)
    opt.step()
    clear_after_step(r, opt)
    # one update from the accumulated gradient: 1 - 0.05·(1·1 + 3·1) = 0.8
    # an update per micro-step: 1 - 0.05·1 = 0.95, then 0.95 - 0.05·(3·0.95) = 0.95 - 0.1425 = 0.8075
    assert p.item() == pytest.approx(0.8075 if every else 0.8, abs=1e-12)
    assert p.grad is None


@pytest.mark.torch
def test_the_stepped_groups_of_the_tiny_model():
    pytest.importorskip("torch")
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.ranks.stepped import stepped
    from placement_logic.measure.shape import TinyShape

    m = tiny.build(TinyShape(hidden=16, layers=2, heads=2, kv_heads=2, ffn=64, vocab=64, seq=8, microbatch=2,
                             gated_mlp=True, norm="rmsnorm", bias=False), 0)
    named = list(m.named_parameters())
    each, rest = stepped(named, ("matrices", "norms"))
    # per block: qkv, proj, fc1, fc2 (matrices) and norm1, norm2: 2 × 6 = 12; the rest: embedding, final norm, head
    assert len(each) == 12 and len(rest) == 3
    names = {id(p): n for n, p in named}
    assert sorted(names[id(p)] for p in rest) == ["embed.weight", "head.weight", "norm.weight"]


@pytest.mark.torch
def test_split_optimizer_steps_the_named_group_after_each_micro_step():
    torch = pytest.importorskip("torch")
    from placement_logic.measure.ranks.common import make_optimizer
    from placement_logic.measure.ranks.stepped import SplitOptimizer
    from placement_logic.measure.ranks.training import after_microstep, clear_after_step

    a = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))  # a stepped group
    b = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))  # stepped once per step
    opt = SplitOptimizer(make_optimizer("sgd", [a]), make_optimizer("sgd", [b]))
    r = Realisation("p", (("dp", 1),), "x", step_every_microbatch=True, stepped_groups=("norms",))
    for k, c in enumerate((1.0, 3.0)):  # micro-step losses c·(a² + b²)/2: gradients c·a, c·b
        (c * (a * a + b * b) / 2).sum().backward()
        after_microstep(r, opt, k, 2)
    opt.step()
    clear_after_step(r, opt)
    # a: 1 - 0.05·1 = 0.95, then 0.95 - 0.05·(3·0.95) = 0.8075; b: one update, 1 - 0.05·(1 + 3) = 0.8
    assert a.item() == pytest.approx(0.8075, abs=1e-12) and b.item() == pytest.approx(0.8, abs=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("carry", [False, True])
def test_no_zero_grad_carries_the_gradient_into_the_next_step(carry):
    from placement_logic.measure.ranks.training import clear_after_step

    torch, p, opt = _sgd_param([1.0])
    r = Realisation("p", (("dp", 1),), "x", carry_gradients=carry)
    for a in (1.0, 2.0):  # step t's loss a_t·θ²/2, one micro-step each
        (a * p * p / 2).sum().backward()
        opt.step()
        clear_after_step(r, opt)
    # step 1: θ = 1 - 0.05·1 = 0.95 (gradient 1·1)
    # step 2 cleared: gradient 2·0.95 = 1.9, θ = 0.95 - 0.095 = 0.855
    # step 2 carried: the buffer 1 + 1.9 = 2.9, θ = 0.95 - 0.145 = 0.805
    assert p.item() == pytest.approx(0.805 if carry else 0.855, abs=1e-12)
    assert (p.grad is not None) is carry


@pytest.mark.torch
@pytest.mark.parametrize("keep_whole", [False, True])
def test_zero_shard_gradient_counts_the_first_micro_step_again(keep_whole, tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from placement_logic.measure.ranks.flat_zero import FlatZero

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        zero = FlatZero([p], None, 2, "sgd", 1.0, True, keep_whole=keep_whole)
        for g in ([1.0, 0.0], [0.0, 4.0]):  # linear micro-step losses g·θ: gradient g
            (p * torch.tensor(g)).sum().backward()
            zero.reduce_gradients()
        zero.step()
        got = p.detach().tolist()
    finally:
        dist.destroy_process_group()
    # cleared after each reduction: the shard's gradient [1, 0] + [0, 4] = [1, 4], θ = [1 - 0.05, 2 - 0.2] = [0.95, 1.8]
    # kept whole: the reductions of [1, 0] and [1, 0] + [0, 4]: [2, 4], θ = [1 - 0.1, 2 - 0.2] = [0.9, 1.8]
    assert got == pytest.approx([0.9, 1.8] if keep_whole else [0.95, 1.8], abs=1e-6)


# ---- the catalogue's bug specs measured against single-device training ----

@pytest.fixture(scope="module")
def reports():
    pytest.importorskip("torch")
    from placement_logic.measure.session import measure_many

    items = []
    for name, bug, safe in PAIRS:
        items += [(load_spec(ROOT / "examples/bugs" / f"{name}.place"), bug),
                  (load_spec(ROOT / "examples/safe" / f"{name}.place"), safe)]
    return {rep.plan: rep for rep in measure_many(items, steps=3, with_checker=True)}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("name, bug, safe", PAIRS)
def test_bug_diverges_where_the_checker_refutes_and_its_fix_matches(reports, name, bug, safe):
    b, s = reports[bug], reports[safe]
    assert b.outcome == "diverged" and b.checker.verdict == "refuted", (b.outcome, b.reasons)
    assert not b.equivalence.within and b.equivalence.replicas_agree  # every rank takes the same wrong update
    assert b.equivalence.param_rel > 10 * b.equivalence.tolerance
    assert s.outcome == "matched" and s.checker.verdict == "proved", (s.outcome, s.reasons)
    assert s.equivalence.within


@pytest.mark.torch
@pytest.mark.slow
def test_the_first_step_shows_which_statement_ran(reports):
    # no_zero_grad: the first step has nothing to carry, its gradient is one device's; the later
    # steps read the sum. step_every_microbatch: the step's last update reads the last micro-step's
    # gradient alone; reduce_accumulated: the first micro-step's gradient twice (m = 2). Both far off.
    assert reports["bf16_stage0_no_zero_grad"].equivalence.grad_rel <= reports["bf16_stage0_no_zero_grad"].equivalence.grad_tolerance
    for plan in ("tutorial_step_every_backward", "per_block_adamw_per_microbatch", "zero_accumulation_rereduced",
                 "zero2_tp_grads_not_cleared"):
        assert reports[plan].equivalence.grad_rel > 0.1, plan
    assert "after every microbatch" in reports["tutorial_step_every_backward"].implementation
    assert "buffer not cleared" in reports["zero_accumulation_rereduced"].implementation
