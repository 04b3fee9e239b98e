"""Whole weights that see head-split activations: the query/key norms shared by the heads, a
K/V head copied on several tensor ranks, a user's group with ``sees = heads``.

Their gradient on a tensor rank is the part from that rank's heads only, so the correct
system sums it over the axis (or over each K/V copy group). The checker's verdicts are
compared with the concrete simulator (tests/simulator.py), which enumerates every device and
gives each rank's own query heads a gradient contribution of their own; the collective
sizes with hand-derived byte counts."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
import sympy

from placement_logic import costs, ir
from placement_logic.check.run import check_spec
from placement_logic.costs.symbolic import symbol
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict

H, L, HEADS_, DH = 256, 2, 8, 32  # hidden, layers, query heads, head dim


def spec_text(kv: int, tp: int, plans: dict[str, str], qk_norm: bool = True, group: str = "") -> str:
    body = "\n".join(f"plan {name} {{\n  dp: ddp\n  tp: megatron_tp\n{extra}}}\n" for name, extra in plans.items())
    return f"""from std.data import ddp
from std.tensor import megatron_tp

model {{
  transformer {{
    hidden = {H}
    layers = {L}
    heads = {HEADS_}
    kv_heads = {kv}
    ffn = 1024
    vocab = 512
{"    qk_norm" if qk_norm else ""}
  }}
{group}
  seq = 64
  microbatch = 1
  microbatches = 2
}}

mesh {{
  dp = 2
  tp = {tp}
}}

{body}"""


PLANS = {
    "derived": "",
    "kv_dp_only": "  override grads[kv]: reduce over (dp)\n",
    "kv_with_tp": "  override grads[kv]: reduce over (dp, tp)\n",
    "qk_dp_only": "  override grads[qk_norms]: reduce over (dp)\n",
    "qk_with_tp": "  override grads[qk_norms]: reduce over (dp, tp)\n",
}


def verdicts(spec: ir.Spec, plan: str) -> dict[str, Verdict]:
    report = check_spec(spec, [plan], timeout=20).plans[0]
    return {o.name: o.verdict for o in report.obligations}


def simulated(p: ir.Plan, group: str, bindings: dict, tps: tuple[int, ...]) -> bool:
    """Whether some small mesh (dp 1-2, the given tp sizes, 1-2 microbatches) breaks the group's gradient."""
    rng = random.Random(7)
    for dp, tp, m in product((1, 2), tps, (1, 2)):
        for _ in range(2):
            if not simulator.gi_ok(p, group, {"dp": dp, "tp": tp, "microbatches": m}, rng, bindings):
                return True
    return False


@pytest.mark.parametrize("tp", [2, 4])
def test_one_kv_head_and_the_qk_norms_agree_with_the_simulator(tp):
    spec = load_string(spec_text(1, tp, PLANS), "heads.place")
    bindings = dict(spec.bindings)
    expected_bad = {"kv_dp_only": {"kv"}, "qk_dp_only": {"qk_norms"}}
    for name in PLANS:
        got = verdicts(spec, name)
        p = spec.plan(name)
        for group in ("kv", "qk_norms", "dense", "norms"):
            broken = simulated(p, group, bindings, (1, 2, 3, 4))
            assert broken == (group in expected_bad.get(name, set())), (name, group)  # by hand
            assert got[f"GI grads[{group}]"] is (Verdict.REFUTED if broken else Verdict.PROVED), (name, group)
        if name in expected_bad:
            group = next(iter(expected_bad[name]))
            assert got[f"GI grads[{group}] over tp"] is Verdict.REFUTED


def test_the_refutation_says_why():
    spec = load_string(spec_text(1, 2, PLANS), "heads.place")
    report = check_spec(spec, ["qk_dp_only"], timeout=20).plans[0]
    over = next(o for o in report.obligations if o.name == "GI grads[qk_norms] over tp")
    text = " ".join(over.counterexample.diagnosis)
    assert "see only its heads" in text and "whole sequence" not in text


def test_copied_kv_heads_agree_with_the_simulator():
    """K = 2 kv heads declared on tp = 4 ranks: each head copied on 2 ranks. The simulator (each
    rank's query heads a source of their own, a flat all-reduce adding whatever heads the ranks
    hold) breaks the dp-only plan and the plan that all-reduces over the whole tp axis (different
    heads added), not the derived copy-group sum; the checker, whose tp dimension is a head part
    and a copy part for tp a multiple of 2, agrees. The derived grad norm counts each copied head
    once (tests/test_kv_norm.py compares it with the simulator): proved whatever the gradients' reduction."""
    spec = load_string(spec_text(2, 4, PLANS, qk_norm=False), "heads.place")
    bindings = dict(spec.bindings)
    expected = {"derived": Verdict.PROVED, "kv_dp_only": Verdict.REFUTED, "kv_with_tp": Verdict.REFUTED}
    for name, verdict in expected.items():
        broken = simulated(spec.plan(name), "kv", bindings, (2, 4))
        assert broken == (verdict is Verdict.REFUTED), name
        got = verdicts(spec, name)
        assert got["GI grads[kv]"] is verdict, (name, got)
        assert got["SC clip_norm"] is Verdict.PROVED and got["GI grads[dense]"] is Verdict.PROVED
    assert verdicts(spec, "kv_dp_only")["GI grads[kv] over tp copy groups"] is Verdict.REFUTED
    assert verdicts(spec, "kv_with_tp")["GI grads[kv] over tp"] is Verdict.REFUTED  # heads added together


def test_a_pinned_size_that_is_no_multiple_of_the_kv_heads_is_an_input_error():
    """tp = 3 over 2 kv heads (and 8 heads) is no shape at all: the pinned size meets the written size's
    check (PL130), so the copies' obligations never see it."""
    spec = load_string(spec_text(2, 4, {"derived": ""}, qk_norm=False), "heads.place")
    with pytest.raises(DiagnosticError) as exc:
        check_spec(spec, ["derived"], pinned={"tp": 3}, timeout=20)
    assert any(d.code == "PL130" and "the kv heads (2)" in d.message for d in exc.value.diagnostics)


def test_kv_heads_dividing_tp_stay_sharded():
    spec = load_string(spec_text(4, 4, {"derived": ""}, qk_norm=False), "heads.place")
    got = verdicts(spec, "derived")
    assert not any("grads[kv]" in k for k in got) and got["GI grads[dense]"] is Verdict.PROVED


def _sum_collectives(p: ir.Plan) -> list:
    return [c for c in collectives.derive(p) if c.payload.tensor.startswith("grads:")]


def test_the_copy_group_all_reduce_is_scheduled_and_priced():
    """K = 2, tp = 4: one all-reduce of the kv gradient over each copy group (2 ranks). Each rank
    holds one kv head: L·(2·h·dh + 2·dh) parameters (the model has biases); a ring all-reduce over 2 ranks sends
    2·(2−1)/2 of the buffer."""
    spec = load_string(spec_text(2, 4, {"derived": ""}, qk_norm=False), "heads.place")
    p = spec.plan("derived")
    (c,) = _sum_collectives(p)
    assert c.axes == ("tp",) and c.payload.tensor == "grads:kv"
    cost = costs.derive(p)
    (s,) = [x for x in cost.communication.collectives if x.collective.payload.tensor == "grads:kv"]
    tp = symbol("tp")
    width = cost.shape.bytes[ir.State.GRADS]
    buffer = L * (2 * H * DH + 2 * DH) * width  # bytes: one head's K and V projections and biases per layer
    assert sympy.simplify(s.group - tp / 2) == 0
    assert sympy.simplify(s.buffer.subs(tp, 4) - buffer) == 0
    assert sympy.simplify(s.bytes_per_device.subs(tp, 4) - buffer) == 0  # 2·(2−1)/2 of the buffer


def test_qk_norms_all_reduce_over_tp():
    """The query and key norms (2·dh parameters per layer, whole on every rank) all-reduced over tp."""
    spec = load_string(spec_text(8, 2, {"derived": ""}), "heads.place")
    p = spec.plan("derived")
    (c,) = _sum_collectives(p)
    assert c.axes == ("tp",) and c.size is None and c.payload.tensor == "grads:qk_norms"


USER = "  group qkn {\n    count = 1000000\n    tensor = whole\n    sees = heads\n  }"


def test_a_user_group_that_sees_heads():
    plans = {"derived": "", "dp_only": "  override grads[qkn]: reduce over (dp)\n",
             "with_tp": "  override grads[qkn]: reduce over (dp, tp)\n"}
    spec = load_string(spec_text(8, 2, plans, qk_norm=False, group=USER), "heads.place")
    assert verdicts(spec, "derived")["GI grads[qkn]"] is Verdict.PROVED
    assert verdicts(spec, "dp_only")["GI grads[qkn] over tp"] is Verdict.REFUTED
    assert verdicts(spec, "with_tp")["GI grads[qkn]"] is Verdict.PROVED
    # the same group seeing whole activations: invariant over tp, a dp-only reduction is right
    whole = load_string(spec_text(8, 2, plans, qk_norm=False, group=USER.replace("heads", "whole")), "heads.place")
    assert verdicts(whole, "dp_only")["GI grads[qkn]"] is Verdict.PROVED
    assert verdicts(whole, "with_tp")["GI grads[qkn] over tp"] is Verdict.REFUTED


def test_sees_takes_whole_or_heads():
    with pytest.raises(DiagnosticError) as e:
        load_string(spec_text(8, 2, {"derived": ""}, group=USER.replace("sees = heads", "sees = rows")), "x.place")
    assert "PL114" in str(e.value) and "'sees' must be one of whole, heads" in str(e.value)


def test_a_split_group_cannot_see_heads():
    split = USER.replace("    tensor = whole\n", "")
    with pytest.raises(DiagnosticError) as e:
        load_string(spec_text(8, 2, {"derived": ""}, group=split), "x.place")
    assert "PL142" in str(e.value) and "x.place:14:3:" in str(e.value)  # the group block
