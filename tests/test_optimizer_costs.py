"""Optimizer costs (costs/optimizer.py) against an independent enumeration of the tensors each
rank holds, the collectives it joins and the multiply-adds of Newton–Schulz, counted by hand."""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy

from placement_logic.costs import derive
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string
from placement_logic.ir import State
from placement_logic.ir.collectives import Phase

H, L, A, F, V = 64, 2, 4, 128, 100

HEAD = f"""from std.data import zero1, ddp
from std.tensor import megatron_tp
from std.pipeline import gpipe

model {{
  seq = 16
  microbatch = 1
  microbatches = 2
  transformer {{
    hidden = {H}
    layers = {L}
    heads = {A}
    ffn = {F}
    vocab = {V}
    norm = rmsnorm
    gated_mlp
    bias = false
  }}
}}

mesh {{
  dp = 2
  tp = 2
  pp = 2
}}
"""


def tensors():
    """(name, group, rows, cols, tensor-parallel split dim or None) of the model, by hand."""
    out = []
    for i in range(L):
        out += [(f"q{i}", "attention", H, H, 0), (f"o{i}", "attention", H, H, 1),
                (f"k{i}", "kv", H, H, 0), (f"v{i}", "kv", H, H, 0),
                (f"gate{i}", "mlp", F, H, 0), (f"up{i}", "mlp", F, H, 0), (f"down{i}", "mlp", H, F, 1),
                (f"n1_{i}", "norms", 1, H, None), (f"n2_{i}", "norms", 1, H, None)]
    out += [("emb", "embedding", V, H, 0), ("final", "final_norm", 1, H, None), ("head", "head", V, H, 0)]
    return out


MATRIX = {"attention", "kv", "mlp"}


def spec_of(plan_body: str):
    return load_string(HEAD + "\nplan p {\n" + plan_body + "\n}\n")


def value(expr, dp=2, tp=2, pp=2, ep=2) -> Fraction:
    v = sympy.nsimplify(expr.subs({symbol("dp"): dp, symbol("tp"): tp, symbol("pp"): pp, symbol("ep"): ep}))
    return Fraction(int(v.p), int(v.q))


BODY = """  dp: {dp}
  tp: megatron_tp
  pp: gpipe
  optimizer {{
    matrices = muon(ns_steps = 5)
  }}
{extra}"""


def test_optimizer_state_per_rank_by_enumeration():
    """ZeRO-1 over dp, TP over tp, 2 stages: the last stage (layer 1, final norm, head) of rank
    (dp=0, tp=0) holds, of each tensor, its tensor-parallel piece, 1/dp of it in the optimizer:
    8 bytes per element under Muon, 12 under AdamW."""
    spec = spec_of(BODY.format(dp="zero1", extra="  override optimizer[matrices]: gather over (dp, tp)"))
    pc = derive(spec.plans[0])
    stage_first = [t for t in tensors() if t[0].endswith("0") or t[0] == "emb"]  # layer 0, embedding
    stage_last = [t for t in tensors() if t[0].endswith("1") or t[0] in ("final", "head")]  # layer 1, head

    def on(stage):
        total = Fraction(0)
        for _name, group, r, c, split in stage:
            n = r * c
            if split is not None:
                n = Fraction(n, 2)
            per = 8 if group in MATRIX else 12
            total += Fraction(n, 2) * per
        return total
    want = max(on(stage_first), on(stage_last))
    assert value(pc.memory.device[State.OPTIMIZER]) == want


def _optimizer_phase(pc):
    return [c for c in pc.communication.collectives if c.collective.phase is Phase.OPTIMIZER]


def test_gather_is_an_all_gather_of_the_stage_matrices():
    """gather over (dp, tp): the device all-gathers every whole matrix of its stage (2-byte
    gradient elements) over the 4 devices of dp×tp: 3/4 of the buffer sent."""
    spec = spec_of(BODY.format(dp="zero1", extra="  override optimizer[matrices]: gather over (dp, tp)"))
    pc = derive(spec.plans[0])
    layer = [t for t in tensors() if t[1] in MATRIX and t[0].endswith("0")]  # one layer per stage
    buffer = sum(2 * r * c for _, _, r, c, _ in layer)
    got = sum(value(c.bytes_per_device) for c in _optimizer_phase(pc))
    assert got == Fraction(3, 4) * buffer
    assert {c.collective.kind.value for c in _optimizer_phase(pc)} == {"all_gather"}


@pytest.mark.parametrize("dp", ["ddp", "zero1"])
def test_round_robin_owners(dp):
    """round_robin over dp, matrices gathered over tp first. Replicated state (DDP): each of the
    2 owners updates half the matrices and all-gathers them: 1/2 of the buffer sent. Sharded
    state (ZeRO-1): the shards are whole matrices, so ZeRO-1's own re-gather carries the
    updates and nothing is added over dp."""
    extra = ("  override optimizer[matrices]: gather over (tp)\n"
             "  override optimizer[matrices]: round_robin over (dp)")
    pc = derive(spec_of(BODY.format(dp=dp, extra=extra)).plans[0])
    layer = [t for t in tensors() if t[1] in MATRIX and t[0].endswith("0")]
    full = sum(2 * r * c for _, _, r, c, _ in layer)  # whole over tp, the stage's layer
    owners = [c for c in _optimizer_phase(pc) if c.collective.axes == ("dp",)]
    if dp == "ddp":
        assert [c.collective.kind.value for c in owners] == ["all_gather"] * 3  # attention, kv, mlp
        assert sum(value(c.bytes_per_device) for c in owners) == Fraction(1, 2) * full
    else:
        assert owners == []
    per_dp = full if dp == "ddp" else Fraction(full, 2)  # the tp gather moves the device's dp share
    tp_bytes = sum(value(c.bytes_per_device) for c in _optimizer_phase(pc) if c.collective.axes == ("tp",))
    assert tp_bytes == Fraction(1, 2) * per_dp


def test_round_robin_over_the_tensor_axis_moves_pieces_to_owners():
    """DDP over dp, round_robin over tp: each matrix's two column pieces meet on its owner and
    the updated pieces go back: two all-to-alls of the device's half pieces, each sending 1/2 of
    the buffer (the matrices whole over tp, /2 per device)."""
    extra = "  override optimizer[matrices]: round_robin over (tp)"
    pc = derive(spec_of(BODY.format(dp="ddp", extra=extra)).plans[0])
    layer = [t for t in tensors() if t[1] in MATRIX and t[0].endswith("0")]
    full = sum(2 * r * c for _, _, r, c, _ in layer)
    moves = _optimizer_phase(pc)
    assert [c.collective.kind.value for c in moves] == ["all_to_all"] * 6  # two per group
    assert sum(value(c.bytes_per_device) for c in moves) == 2 * Fraction(1, 2) * Fraction(full, 2)


def counted_newton_schulz_flops(m: int, n: int, steps: int) -> int:
    """Multiply-adds of Muon's quintic iteration on an m×n matrix, counted by running the loops."""
    p, q = min(m, n), max(m, n)
    flops = 0
    for _ in range(steps):
        flops += 2 * p * p * q  # A = X Xᵀ: p×q times q×p
        flops += 2 * p * p * p  # A @ A
        flops += 2 * p * p * q  # (bA + cA²) @ X
    return flops


def test_newton_schulz_flops_by_enumeration():
    """Under gather over (dp, tp) every device orthogonalises every whole matrix of its stage;
    under round_robin over dp, half of them."""
    from placement_logic.costs.optimizer import update_flops

    for extra, share in (("  override optimizer[matrices]: gather over (dp, tp)", 1),
                         ("  override optimizer[matrices]: gather over (tp)\n"
                          "  override optimizer[matrices]: round_robin over (dp)", Fraction(1, 2))):
        pc = derive(spec_of(BODY.format(dp="zero1", extra=extra)).plans[0])
        layer = [t for t in tensors() if t[1] in MATRIX and t[0].endswith("0")]
        want = share * sum(counted_newton_schulz_flops(r, c, 5) for _, _, r, c, _ in layer)
        assert value(update_flops(pc.plan, pc.shape, pc.layout.split)) == want


def test_adamw_plans_cost_as_before():
    """An optimizer section that names AdamW everywhere changes no cost."""
    base = derive(spec_of("  dp: zero1\n  tp: megatron_tp\n  pp: gpipe").plans[0])
    same = derive(spec_of("  dp: zero1\n  tp: megatron_tp\n  pp: gpipe\n  optimizer {\n    all = adamw\n  }").plans[0])
    assert base.memory.device == same.memory.device
    assert [c.bytes_per_device for c in base.communication.collectives] == \
        [c.bytes_per_device for c in same.communication.collectives]


@pytest.mark.parametrize("gathered,largest", [
    ("dp, tp", F * H),  # the MLP's gate, up and down matrices, whole: 128 × 64
    ("dp", F * H // 2),  # the tensor split left in place: each matrix's piece on a tp rank
])
def test_the_largest_matrix_is_a_transient_working_copy(gathered, largest):
    spec = spec_of(BODY.format(dp="zero1", extra=f"  override optimizer[matrices]: gather over ({gathered})"))
    pc = derive(spec.plans[0])
    assert value(pc.memory.transient["Newton–Schulz working copy (the largest matrix, one at a time)"]) == 2 * largest


MOE = """from std.data import ddp
from std.expert import expert_parallel

model {
  transformer {
    hidden = 64
    layers = 2
    heads = 4
    ffn = 128
    vocab = 100
    experts = 4
    top_k = 2
    norm = rmsnorm
    gated_mlp
    bias = false
  }
}

mesh {
  dp = 2
  ep = 2
}

plan p {
  dp: ddp
  ep: expert_parallel
  optimizer {
    matrices = muon(ns_steps = 5)
  }
  override optimizer[matrices]: round_robin over (dp, ep)
}
"""


def test_owners_over_an_expert_axis_leave_the_experts_where_they_are():
    """DDP over dp, experts split over ep, owners over (dp, ep): a dense matrix (replicated on all 4
    devices) has one owner of the 4, which all-gathers its update over dp×ep; an expert's matrices
    already live on one ep rank, so their owner is one of the 2 dp ranks and the all-gather runs
    over dp only; each device orthogonalises its 1/4 of the dense matrices and 1/2 of its own
    experts'."""
    from placement_logic.costs.optimizer import update_flops

    pc = derive(load_string(MOE).plans[0])
    h, f, E, L = 64, 128, 4, 2
    gathers = {(c.collective.axes, c.collective.payload.tensor): c for c in _optimizer_phase(pc)}
    attention = gathers[(("dp", "ep"), "grads:attention")]
    assert value(attention.bytes_per_device, dp=2) == Fraction(3, 4) * 2 * L * 2 * h * h
    experts = gathers[(("dp",), "grads:experts")]
    assert value(experts.bytes_per_device, dp=2) == Fraction(1, 2) * 2 * L * (E // 2) * 3 * h * f
    assert not any(k[1] == "grads:experts" and "ep" in k[0] for k in gathers)
    want = (Fraction(1, 4) * L * (4 * counted_newton_schulz_flops(h, h, 5))  # q, o, k, v
            + Fraction(1, 4) * L * counted_newton_schulz_flops(E, h, 5)  # the router
            + Fraction(1, 2) * L * (E // 2) * 3 * counted_newton_schulz_flops(f, h, 5))
    got = update_flops(pc.plan, pc.shape, pc.layout.split).subs({symbol("dp"): 2, symbol("ep"): 2})
    assert Fraction(str(sympy.nsimplify(got))) == want
