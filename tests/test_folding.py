"""MoE parallel folding: the expert group's own roles, against an enumeration of devices."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from placement_logic import costs, load_string
from placement_logic.ir import State

SPEC = """from std.data import zero1
from std.tensor import megatron_sp
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = {E}  top_k = 2
                 bias = false }}
  seq = 16
  group experts {{ role = {{{roles}}} }}
}}
mesh {{ d = {d}  e = {e}  t = {t} }}
plan p {{ d: zero1  e: zero1  t: megatron_sp }}
"""


def expert_bytes(E, d, e, t, etp_axes, ep_axes):
    """Enumerate devices (d, e, t); each expert's weights (2 matrices h × f) go to the
    ranks of its expert group, split over the expert tensor axes; the optimizer state (12
    bytes per parameter) is sharded over the expert-data axes. Returns the bytes of the most
    loaded device (params, optimizer)."""
    sizes = {"d": d, "e": e, "t": t}
    per_expert = 2 * 64 * 128 * 2  # MLP in and out, two layers
    edp_axes = [a for a in "det" if a not in ep_axes and a not in etp_axes]
    out = set()
    for coord in itertools.product(range(d), range(e), range(t)):
        c = dict(zip("det", coord))
        ep_rank, ep = 0, 1
        for a in ep_axes:
            ep_rank, ep = ep_rank * sizes[a] + c[a], ep * sizes[a]
        etp = 1
        for a in etp_axes:
            etp *= sizes[a]
        edp = 1
        for a in edp_axes:
            edp *= sizes[a]
        mine = [j for j in range(E) if j * ep // E == ep_rank]
        params = Fraction(len(mine) * per_expert, etp)
        out.add((params * 2, params * 12 / edp))
    assert len(out) == 1
    return out.pop()


GRID = [(E, d, e, t, roles) for E in (4, 8) for d in (1, 2) for e in (1, 2) for t in (1, 2)
        for roles in ({"t": "expert", "e": "expert"}, {"e": "expert"}, {"t": "data", "e": "expert"},
                      {"e": "expert", "d": "tensor"})]


@pytest.mark.parametrize("E,d,e,t,roles", GRID)
def test_expert_memory_equals_the_enumerated_devices(E, d, e, t, roles):
    ep_axes = [a for a in "det" if roles.get(a) == "expert"]
    etp_axes = [a for a in "det" if roles.get(a, "tensor" if a == "t" else "data") == "tensor"]
    ep = 1
    for a in ep_axes:
        ep *= {"d": d, "e": e, "t": t}[a]
    if E % ep:
        return
    spec = SPEC.format(E=E, d=d, e=e, t=t, roles=", ".join(f"{a}: {r}" for a, r in roles.items()))
    pc = costs.derive(load_string(spec).plan("p"), sized=True)
    subs = {costs.symbol(a): n for a, n in (("d", d), ("e", e), ("t", t))}
    groups = pc.memory.groups["experts"]
    got = (groups[State.PARAMS].subs(subs), groups[State.OPTIMIZER].subs(subs))
    want = expert_bytes(E, d, e, t, etp_axes, ep_axes)
    assert (Fraction(int(got[0].p), int(got[0].q)), Fraction(int(got[1].p), int(got[1].q))) == want


def test_mixtral_folding_example_memory_counted_by_hand():
    """examples/mixtral_folding.place: Mixtral-8x7B, dense tensor 2 × data 32, experts on
    expert 8 × expert-tensor 1 × expert-data 8 (a folding of the kind Megatron-LM documents,
    TP ≠ ETP). Counted from the architecture: per layer the attention (q, o: h·h; k, v: h·kv·h/a)
    is split over the tensor ranks, two RMSNorms and the router (h·E) stay whole, the 8
    SwiGLU experts (3·h·f each) are divided by ep = 8; the embedding and head (V·h each) are
    vocabulary-parallel, the final norm whole. bf16 parameters and gradients, 12 bytes of
    optimizer state per parameter sharded by the distributed optimizer over the dense data
    group (32) and over the expert-data group (8)."""
    from placement_logic import load_spec

    h, L, a, kv, f, V, E = 4096, 32, 32, 8, 14336, 32000, 8
    tp, dp, ep, edp = 2, 32, 8, 8
    split = Fraction(2 * V * h + L * (2 * h * h + 2 * h * (h * kv // a)), tp)
    whole = L * (2 * h + h * E) + h
    experts = Fraction(L * E * 3 * h * f, ep)
    pc = costs.derive(load_spec("examples/mixtral_folding.place").plan("folded"), sized=True)
    subs = {costs.symbol("d"): 8, costs.symbol("e"): 4, costs.symbol("t"): 2}
    dev = {st: pc.memory.device[st].subs(subs) for st in (State.PARAMS, State.OPTIMIZER, State.GRADS)}
    assert dev[State.PARAMS] == 2 * (split + whole + experts) == 12_881_240_064
    assert dev[State.GRADS] == dev[State.PARAMS]
    assert dev[State.OPTIMIZER] == 12 * ((split + whole) / dp + experts / edp)
    assert 8 * 4 * 2 == tp * dp == ep * 1 * edp  # both groupings cover the 64 devices


def _collectives(text):
    from placement_logic.ir import collectives as sc

    plan = load_string(text).plan("p")
    return [c for c in sc.derive(plan)]


def test_the_expert_gradients_are_reduced_over_the_expert_data_group_only():
    text = SPEC.format(E=8, d=2, e=2, t=2, roles="t: expert, e: expert")
    cs = _collectives(text)
    sync = {(c.payload.tensor, c.axes) for c in cs if c.phase.value == "grad_sync"}
    assert sync == {("dense_grads", ("d", "e")), ("expert_grads", ("d",))}
    refresh = {(c.payload.tensor, c.axes) for c in cs if c.phase.value == "refresh"}
    assert refresh == {("dense_params", ("d", "e")), ("expert_params", ("d",))}
    a2a = {c.axes for c in cs if c.kind.value == "all_to_all"}
    assert a2a == {("e", "t")}


def test_expert_tensor_and_data_of_their_own():
    # dense: data d × e, tensor t; experts: expert e, tensor d (etp ≠ tp), data t
    text = SPEC.format(E=8, d=2, e=2, t=2, roles="e: expert, d: tensor, t: data")
    sync = {(c.payload.tensor, c.axes) for c in _collectives(text) if c.phase.value == "grad_sync"}
    assert sync == {("dense_grads", ("d", "e")), ("expert_grads", ("t",))}


def test_plain_expert_parallel_shards_the_dense_optimizer_over_data_and_expert_axes():
    text = """from std.data import zero1
from std.expert import expert_parallel
model {
  transformer { hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 4  top_k = 2  bias = false }
  seq = 16
}
mesh { dp = 2  ep = 4 }
plan p { dp: zero1  ep: expert_parallel }
"""
    pc = costs.derive(load_string(text).plan("p"))
    dp, ep = costs.symbol("dp"), costs.symbol("ep")
    for g in pc.shape.groups:
        opt = pc.memory.groups[g.name][State.OPTIMIZER]
        want = 12 * g.count / (dp * ep)  # dense over dp × ep; experts over ep (expert) and dp (their data)
        assert (opt - want).simplify() == 0, g.name


FOLDINGS = {  # roles -> the expert-data axes
    "t: expert, e: expert": ("d",),
    "e: expert": ("d",),
    "t: data, e: expert": ("d", "t"),
    "e: expert, d: tensor, t: data": ("t",),
}


@pytest.mark.parametrize("roles", FOLDINGS)
def test_the_checker_follows_the_folding(roles):
    """Proved as derived; refuted when the expert gradients are reduced over the dense data
    group (d, e) or over the expert-data group less one axis."""
    from placement_logic import check_spec
    from placement_logic.check.report import Verdict

    good = SPEC.format(E=8, d=2, e=2, t=2, roles=roles)
    assert check_spec(load_string(good)).exit_status == 0
    edp = FOLDINGS[roles]
    for axes in (("d", "e"), edp[1:]):
        over = f"override grads[experts]: reduce over ({', '.join(axes)})" if axes else \
            "override grads[experts]: reduce over ()"
        wrong = good.replace("t: megatron_sp }", f"t: megatron_sp\n  {over} }}")
        assert wrong != good
        report = check_spec(load_string(wrong))
        assert report.exit_status == 1, (roles, axes)
        refuted = {o.name for o in report.obligations if o.verdict is Verdict.REFUTED}
        assert "GI grads[experts]" in refuted, (roles, axes, refuted)
        assert not any("dense" in n for n in refuted), refuted


def test_deepseek_v3_folding_example_experts_counted_by_hand():
    """examples/deepseek_v3_folding.place: the 58 MoE layers' 256 routed experts (3·h·fe each)
    over expert 64 = e × t, their optimizer state over the expert-data axis d (32)."""
    from placement_logic import load_spec

    h, fe, E, moe_layers = 7168, 2048, 256, 58
    pc = costs.derive(load_spec("examples/deepseek_v3_folding.place").plan("folded"), sized=True)
    subs = {costs.symbol("d"): 32, costs.symbol("e"): 32, costs.symbol("t"): 2}
    g = pc.memory.groups["experts"]
    routed = Fraction(moe_layers * E * 3 * h * fe, 64)
    assert g[State.PARAMS].subs(subs) == 2 * routed
    assert g[State.OPTIMIZER].subs(subs) == 12 * routed / 32


def test_the_expert_biases_follow_the_experts_roles():
    text = SPEC.format(E=8, d=2, e=2, t=2, roles="t: expert, e: expert").replace("bias = false", "bias = true")
    pc = costs.derive(load_string(text).plan("p"))
    got = pc.memory.groups["expert_biases"][State.PARAMS]
    e, t = costs.symbol("e"), costs.symbol("t")
    assert (got - 2 * 2 * 8 * 64 / (e * t)).simplify() == 0  # L·E·h biases, bf16, over ep = e × t


def test_expert_parallel_folded_over_the_context_axis():
    """Experts on context × tensor (ep = c × t), expert data d; dense: data d, context c, tensor t."""
    from placement_logic import check_spec
    from placement_logic.ir import collectives as sc

    text = """from std.data import zero1
from std.tensor import megatron_sp
from std.context import context_parallel
model {
  transformer { hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 8  top_k = 2  bias = false }
  seq = 16
  group experts { role = {c: expert, t: expert} }
}
mesh { d = 2  c = 2  t = 2 }
plan p { d: zero1  c: context_parallel  t: megatron_sp }
"""
    plan = load_string(text).plan("p")
    sync = {(c.payload.tensor, c.axes) for c in sc.derive(plan) if c.phase.value == "grad_sync"}
    # dense: reduce-scatter to the ZeRO-1 shards over d, all-reduce over c; experts: over d only
    assert sync == {("dense_grads", ("d",)), ("dense_grads", ("c",)), ("expert_grads", ("d",))}
    assert check_spec(load_string(text)).exit_status == 0
    wrong = text.replace("t: megatron_sp }", "t: megatron_sp\n  override grads[experts]: reduce over (d, c) }")
    assert check_spec(load_string(wrong)).exit_status == 1


def test_the_checker_refutes_dense_gradients_left_unreduced_over_a_folded_axis():
    """Under folding the dense parameters are still reduced over the whole dense data group d × e."""
    from placement_logic import check_spec
    from placement_logic.check.report import Verdict

    good = SPEC.format(E=8, d=2, e=2, t=2, roles="t: expert, e: expert")
    wrong = good.replace("t: megatron_sp }", "t: megatron_sp\n  override grads[dense]: reduce over (d) }")
    report = check_spec(load_string(wrong))
    assert report.exit_status == 1
    refuted = {o.name for o in report.obligations if o.verdict is Verdict.REFUTED}
    assert "GI grads[dense]" in refuted and "CR07 expert-reduction-groups" in refuted, refuted
    assert not any("experts" in n for n in refuted), refuted


def device_model_state(E, d, e, t, roles):
    """Enumerate the devices (d, e, t) and place every tensor by the layout: the attention
    (q, k, v, o: h × h each) and the vocabulary-parallel embedding and head (V × h each) split
    over the dense tensor axis t; the layer norms (weight and bias, two per layer and a final
    one) and the router (h × E per layer) whole; expert j (two h × f matrices per layer) on the
    ranks of its expert group, split over the experts' tensor axes. bf16 parameters and
    gradients; 12 bytes of optimizer state per parameter, the dense share over the dense data
    axes d × e, the expert share over the expert-data axes. Returns the bytes of the most
    loaded device, after checking every device holds the same."""
    h, L, V, f = 64, 2, 128, 128
    sizes = {"d": d, "e": e, "t": t}
    role = {a: roles.get(a, "tensor" if a == "t" else "data") for a in "det"}
    ep_axes = [a for a in "det" if role[a] == "expert"]
    size = {r: 1 for r in ("expert", "tensor", "data")}
    for a in "det":
        size[role[a]] *= sizes[a]
    out = set()
    for coord in itertools.product(range(d), range(e), range(t)):
        c = dict(zip("det", coord))
        ep_rank = 0
        for a in ep_axes:
            ep_rank = ep_rank * sizes[a] + c[a]
        dense = Fraction(L * 4 * h * h + 2 * V * h, t) + L * (2 * 2 * h + h * E) + 2 * h
        mine = [j for j in range(E) if j * size["expert"] // E == ep_rank]
        experts = Fraction(len(mine) * L * 2 * h * f, size["tensor"])
        out.add(2 * (dense + experts) * 2 + 12 * (dense / (d * e) + experts / size["data"]))
    assert len(out) == 1
    return out.pop()


@pytest.mark.parametrize("E,d,e,t,roles", GRID)
def test_model_state_per_device_equals_the_enumerated_devices(E, d, e, t, roles):
    ep = 1
    for a, r in roles.items():
        ep *= {"d": d, "e": e, "t": t}[a] if r == "expert" else 1
    if E % ep:
        return
    spec = SPEC.format(E=E, d=d, e=e, t=t, roles=", ".join(f"{a}: {r}" for a, r in roles.items()))
    pc = costs.derive(load_string(spec).plan("p"), sized=True)
    subs = {costs.symbol(a): n for a, n in (("d", d), ("e", e), ("t", t))}
    got = pc.memory.model_state.subs(subs)
    assert Fraction(int(got.p), int(got.q)) == device_model_state(E, d, e, t, roles)


@pytest.mark.parametrize("d,e,t", [(2, 2, 2), (4, 2, 2), (2, 4, 1)])
def test_gradient_reduce_scatters_carry_their_own_buffers(d, e, t):
    """Ring bytes per device: the dense buffer (its tensor shard, bf16) reduce-scattered over
    d × e, the experts' (their expert-group shard) over d: (n − 1)/n of each buffer."""
    E, h, L, V, f = 8, 64, 2, 128, 128
    text = SPEC.format(E=E, d=d, e=e, t=t, roles="t: expert, e: expert")
    pc = costs.derive(load_string(text).plan("p"), sized=True)
    subs = {costs.symbol(a): n for a, n in (("d", d), ("e", e), ("t", t))}
    got = {(x.collective.payload.tensor, x.collective.axes): x.bytes_per_device.subs(subs)
           for x in pc.communication.collectives if x.collective.phase.value == "grad_sync"}
    dense = 2 * (Fraction(L * 4 * h * h + 2 * V * h, t) + L * (2 * 2 * h + h * E) + 2 * h)
    experts = 2 * Fraction(E * L * 2 * h * f, e * t)
    assert got[("dense_grads", ("d", "e"))] == dense * Fraction(d * e - 1, d * e)
    assert got[("expert_grads", ("d",))] == experts * Fraction(d - 1, d)


def test_expert_tensor_collectives_over_their_own_axis_counted_by_hand():
    """Dense: data d × e, tensor t (sequence parallel); experts: expert e, expert tensor d (≠ t),
    expert data t. Per MoE layer and microbatch, Megatron-LM's dispatcher: in forward an
    all-to-all over e to the expert ranks, an all-gather of the routed tokens over the expert
    tensor group d, the experts, a reduce-scatter of their partial outputs over d, an
    all-to-all back over e; backward the same four. The layer's own sequence-parallel
    all-gathers and reduce-scatters stay on the dense tensor axis t (2 + 2 per layer and phase)."""
    d, e, t, L, s, h, k = 2, 2, 2, 2, 16, 64, 2
    text = SPEC.format(E=8, d=d, e=e, t=t, roles="e: expert, d: tensor, t: data")
    pc = costs.derive(load_string(text).plan("p"), sized=True)
    subs = {costs.symbol(a): n for a, n in (("d", d), ("e", e), ("t", t))}
    got: dict = {}
    for x in pc.communication.collectives:
        c = x.collective
        if c.state is State.ACTIVATIONS and c.payload.tensor in ("tokens", "expert_tokens", "activation"):
            key = (c.kind.value, c.axes, c.phase.value, c.payload.tensor)
            got[key] = got.get(key, 0) + x.count.subs(subs)
    assert got == {
        ("all_to_all", ("e",), "forward", "tokens"): 2 * L, ("all_to_all", ("e",), "backward", "tokens"): 2 * L,
        ("all_gather", ("d",), "forward", "expert_tokens"): L, ("reduce_scatter", ("d",), "forward", "expert_tokens"): L,
        ("all_gather", ("d",), "backward", "expert_tokens"): L,
        ("reduce_scatter", ("d",), "backward", "expert_tokens"): L,
        # and one more of each per phase: the embedding's and the head's sequence-parallel ends;
        # in backward the column-parallel inputs (2 per layer and the head's) gathered again
        ("all_gather", ("t",), "forward", "activation"): 2 * L + 1,
        ("reduce_scatter", ("t",), "forward", "activation"): 2 * L + 1,
        ("all_gather", ("t",), "backward", "activation"): 2 * L + 1 + 2 * L + 1,
        ("reduce_scatter", ("t",), "backward", "activation"): 2 * L + 1,
    }
    # the gathered buffer: each d rank's routed tokens (its sequence shard over t, top_k copies, bf16) × d
    gather = next(x for x in pc.communication.collectives if x.collective.payload.tensor == "expert_tokens")
    subs[next(x for x in gather.buffer.free_symbols if x.name == "b")] = 1  # microbatch 1
    assert gather.buffer.subs(subs) == Fraction(s * h * k * 2, t) * d
    assert gather.bytes_per_device.subs(subs) == Fraction(d - 1, d) * Fraction(s * h * k * 2, t) * d * L


def test_no_expert_tensor_collectives_when_the_experts_split_over_the_dense_tensor_axis():
    text = SPEC.format(E=8, d=2, e=2, t=2, roles="e: expert")
    kinds = {(c.kind.value, c.axes) for c in _collectives(text) if c.payload.tensor in ("tokens", "expert_tokens")}
    assert kinds == {("all_to_all", ("e",))}
