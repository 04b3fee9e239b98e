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
    ("ddp", ("optimizer[matrices]: step_every_microbatch",), "realised only for every group"),
    ("ddp", ("grads[dense]: no_zero_grad",), "grads[dense]: no_zero_grad is not realised by the harness"),
    ("ddp", ("grads: no_zero_grad", "optimizer: step_every_microbatch"), "together are not realised")])
def test_what_the_harness_cannot_run_keeps_its_reason(data, overrides, words):
    r = _realise(_plan(data, *overrides), {"dp": 2})
    assert isinstance(r, Unrealised)
    assert any(words in x for x in r.reasons), r.reasons


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
    for plan in ("tutorial_step_every_backward", "zero_accumulation_rereduced", "zero2_tp_grads_not_cleared"):
        assert reports[plan].equivalence.grad_rel > 0.1, plan
    assert "after every microbatch" in reports["tutorial_step_every_backward"].implementation
    assert "buffer not cleared" in reports["zero_accumulation_rereduced"].implementation
