"""The parameter-group model shared by costs and the checker (placement_logic.ir.groups).

Oracle: a brute-force enumeration of every weight tensor of a transformer with its shape
and the rule Megatron-LM / PyTorch tensor parallelism applies to it (column-parallel rows,
row-parallel columns, vocabulary-parallel rows, K/V heads, replicated norms, row-parallel
biases and router), the layers of each pipeline stage and the experts of each expert rank;
each device's share is counted by slicing index ranges, device by device. The cost engine's
per-device parameter bytes must equal the largest device's count, and every device of a
stage must hold the same. A second oracle restates Megatron-LM's theoretical-memory weight
count (megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory),
which divides every parameter by the tensor size: the spec states that convention with
``group`` restatements and must reproduce it exactly.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from placement_logic import costs
from placement_logic.check import steps
from placement_logic.cli import main
from placement_logic.frontend.loader import load_string
from placement_logic.ir import State


def _rows(n: int, t: int, r: int) -> int:
    assert n % t == 0
    return n // t


def _heads(kv: int, t: int, r: int, dh: int) -> int:
    """Rows of K (or V) on tensor rank r: kv/t heads, or one head when kv < t."""
    if kv >= t:
        return kv // t * dh
    return dh


def device_params(shape: dict, t: int, r: int, p: int, stage: int, ep: int, e_rank: int) -> int:
    """Parameters on the device (tensor rank r of t, pipeline stage of p, expert rank of ep)."""
    h, L, a, kv, f, V, E = (shape[k] for k in ("h", "L", "a", "kv", "f", "V", "E"))
    gated, ln, bias, tied = shape["gated"], shape["norm"] == "layernorm", shape["bias"], shape["tied"]
    dh = h // a
    total = 0
    tensors: list[tuple[str, int]] = []  # (rule, elements on this device) per tensor of one layer
    # attention: q (a·dh × h) column-parallel, k and v by heads, o (h × a·dh) row-parallel
    tensors.append(("q", _rows(a * dh, t, r) * h))
    tensors += [("k", _heads(kv, t, r, dh) * h), ("v", _heads(kv, t, r, dh) * h)]
    tensors.append(("o", h * _rows(a * dh, t, r)))
    if bias:
        tensors += [("q_bias", _rows(a * dh, t, r)), ("k_bias", _heads(kv, t, r, dh)),
                    ("v_bias", _heads(kv, t, r, dh)), ("o_bias", h)]
    # the MLP, or E experts of which this expert rank holds E/ep
    mats = [("up", _rows(f, t, r) * h), ("down", h * _rows(f, t, r))]
    if gated:
        mats.append(("gate", _rows(f, t, r) * h))
    if bias:
        mats += [("up_bias", _rows(f, t, r)), ("down_bias", h)]
        if gated:
            mats.append(("gate_bias", _rows(f, t, r)))
    if E == 1:
        tensors += mats
    else:
        local = E // ep
        assert local * ep == E
        tensors += [(name, n * local) for name, n in mats]
        tensors.append(("router", E * h))
        if bias:
            tensors.append(("router_bias", E))
    # two norms, whole on every tensor rank
    tensors += [("norm", h), ("norm", h)]
    if ln:
        tensors += [("norm_bias", h), ("norm_bias", h)]
    layer = sum(n for _, n in tensors)
    assert L % p == 0
    total += layer * (L // p)
    if stage == 0:
        total += _rows(V, t, r) * h  # vocabulary-parallel embedding
    if stage == p - 1:
        total += h * (2 if ln else 1)  # final norm
        if not tied or p > 1:  # untied head, or the last stage's copy of the tied one
            total += _rows(V, t, r) * h
    return total


def spec_text(shape: dict, t: int, p: int, ep: int, extra_model: str = "") -> str:
    tr = (f"hidden = {shape['h']}\n    layers = {shape['L']}\n    heads = {shape['a']}\n"
          f"    kv_heads = {shape['kv']}\n    ffn = {shape['f']}\n    vocab = {shape['V']}\n"
          f"    norm = {shape['norm']}\n    bias = {'true' if shape['bias'] else 'false'}\n"
          f"    gated_mlp = {'true' if shape['gated'] else 'false'}\n"
          f"    tied_embeddings = {'true' if shape['tied'] else 'false'}\n    experts = {shape['E']}")
    mesh = ["dp = 2"] + ([f"tp = {t}"] if t > 1 else []) + ([f"pp = {p}"] if p > 1 else []) \
        + ([f"ep = {ep}"] if ep > 1 else [])
    binds = ["dp: ddp"] + (["tp: megatron_tp"] if t > 1 else []) + (["pp: one_f_one_b"] if p > 1 else []) \
        + (["ep: expert_parallel"] if ep > 1 else [])
    nl = "\n  "
    return (
        "from std.data import ddp\nfrom std.tensor import megatron_tp\nfrom std.pipeline import one_f_one_b\n"
        "from std.expert import expert_parallel\n"
        f"model {{\n  transformer {{\n    {tr}\n  }}\n  {extra_model}\n  bytes {{ params = 1 }}\n}}\n"
        f"mesh {{\n  {nl.join(mesh)}\n}}\nplan p {{\n  {nl.join(binds)}\n}}\n"
    )


LLAMA = dict(h=64, L=4, a=8, kv=2, f=160, V=128, E=1, gated=True, norm="rmsnorm", bias=False, tied=False)
GPT = dict(h=48, L=4, a=4, kv=4, f=192, V=96, E=1, gated=False, norm="layernorm", bias=True, tied=True)
MOE = dict(h=32, L=2, a=4, kv=4, f=64, V=64, E=4, gated=True, norm="rmsnorm", bias=True, tied=False)

CASES = [(LLAMA, t, p, 1) for t in (1, 2, 4, 8) for p in (1, 2)]
CASES += [(GPT, t, p, 1) for t in (1, 2, 4) for p in (1, 2, 4)]
CASES += [(MOE, t, p, ep) for t in (1, 2) for p in (1, 2) for ep in (1, 2, 4)]


@pytest.mark.parametrize("shape,t,p,ep", CASES,
                         ids=[f"{'llama' if s is LLAMA else 'gpt' if s is GPT else 'moe'}-t{t}-p{p}-ep{ep}"
                              for s, t, p, ep in CASES])
def test_params_per_device_equal_the_enumerated_tensors(shape, t, p, ep):
    pc = costs.derive(load_string(spec_text(shape, t, p, ep)).plan("p"), sized=True)
    subs = {costs.symbol(a): n for a, n in (("dp", 2), ("tp", t), ("pp", p), ("ep", ep))}
    for k, stage_mem in enumerate(pc.memory.stages or (None,)):
        stage = 0 if stage_mem is None or stage_mem.stage == "first" else p - 1
        counts = {device_params(shape, t, r, p, stage, ep, e) for r in range(t) for e in range(ep)}
        assert len(counts) == 1, counts  # every device of a stage holds the same
        got = (stage_mem.device if stage_mem else pc.memory.device)[State.PARAMS].subs(subs)
        assert got == counts.pop(), (k, got)


def test_psi_is_the_sum_of_the_groups_and_of_the_enumerated_tensors():
    for shape in (LLAMA, GPT, MOE):
        pc = costs.derive(load_string(spec_text(shape, 1, 1, 1)).plan("p"))
        one = device_params(shape, 1, 0, 1, 0, 1, 0)  # one device holds the whole model (a tied head once)
        assert pc.shape.psi == one
        assert sum(g.count for g in pc.shape.groups if not g.group.copy) == pc.shape.psi


def megatron_most_loaded_shard(shape: dict, t: int, p: int) -> Fraction:
    """Megatron-LM's 2024 weight count on the most loaded model shard (its formula then: every
    parameter, norms included, divided by the tensor size; the final norm counted with the
    layers; every norm LayerNorm's weight and bias, 2h, whatever the normalization; no linear
    biases). The current formula is ``megatron_current_most_loaded_shard`` below."""
    h, L, a, kv, f, V = (Fraction(shape[k]) for k in ("h", "L", "a", "kv", "f", "V"))
    gated = Fraction(3, 2) if shape["gated"] else 1
    layers = 2 * L * h * h * ((1 + kv / a) * 1 + f / h * gated + 2 / h + 1 / (L * h))
    emb = h * V
    shard = (layers / p + emb) / t
    if not shape["tied"] and p == 1:
        shard += emb / t
    return shard


MEGATRON = "group norms { tensor = split }\n  group final_norm { tensor = split  stage = layers }"


@pytest.mark.parametrize("t,p", [(1, 1), (2, 1), (4, 2), (8, 4), (2, 4)])
@pytest.mark.parametrize("tied", [False, True])
def test_megatron_estimator_convention_is_statable(t, p, tied):
    shape = dict(h=64, L=8, a=8, kv=8, f=256, V=128, E=1, gated=True, norm="layernorm", bias=False, tied=tied)
    pc = costs.derive(load_string(spec_text(shape, t, p, 1, MEGATRON)).plan("p"))
    subs = {costs.symbol(a): n for a, n in (("dp", 2), ("tp", t), ("pp", p))}
    if pc.memory.stages:
        got = pc.memory.stages[0].device[State.PARAMS].subs(subs)  # the first stage is the most loaded
    else:
        got = pc.memory.device[State.PARAMS].subs(subs)
    assert Fraction(int(got.p), int(got.q)) == megatron_most_loaded_shard(shape, t, p)
    # without the restatement the norms stay whole and the count is larger (for t > 1)
    plain = costs.derive(load_string(spec_text(shape, t, p, 1)).plan("p"))
    plain_got = (plain.memory.stages[0].device if plain.memory.stages else plain.memory.device)[State.PARAMS]
    assert (plain_got.subs(subs) > got) == (t > 1 or p > 1)


def test_user_group_adds_to_psi_and_keeps_its_own_modes():
    text = spec_text(LLAMA, 2, 1, 1, "group vision { count = 1000  placement = {dp: R} }").replace(
        "dp: ddp", "dp: zero3").replace("from std.data import ddp", "from std.data import ddp, zero3")
    pc = costs.derive(load_string(text).plan("p"))
    base = costs.derive(load_string(spec_text(LLAMA, 2, 1, 1)).plan("p")).shape.psi
    assert pc.shape.psi == base + 1000
    vision = pc.memory.groups["vision"]
    subs = {costs.symbol("dp"): 2, costs.symbol("tp"): 2}
    assert vision[State.PARAMS].subs(subs) == 500  # split over tp, whole over dp (its own R)
    assert vision[State.OPTIMIZER].subs(subs) == 12 * 500
    mlp = pc.memory.groups["mlp"]
    assert mlp[State.PARAMS].subs(subs) == Fraction(LLAMA["L"] * 3 * 64 * 160, 4)


def test_fraction_group_without_shape_is_carved_out_of_psi():
    text = ("from std.data import zero3\nmodel {\n  params = 1000\n  group lm_head { fraction = 1/10  placement = {dp: R}"
            "  like = embedding }\n}\nmesh { dp = 4 }\nplan p { dp: zero3 }\n")
    pc = costs.derive(load_string(text).plan("p"))
    assert pc.shape.psi == 1000
    assert pc.memory.device[State.PARAMS].subs({costs.symbol("dp"): 4}) == 2 * (Fraction(900, 4) + 100)


def test_kv_heads_fewer_than_tensor_ranks_are_copied():
    # kv = 2 heads over t = 8 ranks: each rank keeps one whole head of K and V
    pc = costs.derive(load_string(spec_text(LLAMA, 8, 1, 1)).plan("p"), sized=True)
    kv = pc.memory.groups["kv"][State.PARAMS]
    assert kv == LLAMA["L"] * 2 * LLAMA["h"] * (LLAMA["h"] // LLAMA["a"])


def test_checker_reads_the_same_groups():
    moe = load_string(spec_text(MOE, 2, 1, 2)).plan("p")
    names = [g.group for g in steps.derive(moe).groups]
    assert "router" in names and "experts" in names and "norms" in names
    user = load_string(spec_text(LLAMA, 2, 1, 1, "group vision { count = 1000  params = {dp: S} }")).plan("p")
    assert "vision" in [g.group for g in steps.derive(user).groups]


def test_a_user_group_sharded_on_a_data_axis_is_refuted(tmp_path, capsys):
    good = spec_text(LLAMA, 2, 1, 1, "group vision { count = 1000  placement = {tp: R} }")
    bad = spec_text(LLAMA, 2, 1, 1, "group vision { count = 1000  params = {dp: S} }")
    for text, want in ((good, 0), (bad, 1)):
        f = tmp_path / "g.place"
        f.write_text(text)
        assert main(["check", str(f), "--format", "json"]) == want
        out = json.loads(capsys.readouterr().out)
        if want:
            assert "dp" in json.dumps(out)


def test_override_may_name_a_user_group(tmp_path, capsys):
    text = spec_text(LLAMA, 1, 1, 1, "group vision { count = 1000 }") + \
        "plan q extends p {\n  override grads[vision]: reduce over ()\n}\n"
    f = tmp_path / "g.place"
    f.write_text(text)
    assert main(["check", str(f), "--plan", "q"]) == 1
    assert "vision" in capsys.readouterr().out


def test_cost_groups_flag_and_json(tmp_path, capsys):
    f = tmp_path / "g.place"
    f.write_text(spec_text(MOE, 2, 2, 2))
    assert main(["cost", str(f), "--groups"]) == 0
    out = capsys.readouterr().out
    assert "parameter groups" in out and "router" in out and "whole" in out
    assert main(["cost", str(f), "--format", "json"]) == 0
    groups = json.loads(capsys.readouterr().out)["plans"][0]["memory"]["param_groups"]
    assert {g["name"] for g in groups} >= {"embedding", "attention", "kv", "experts", "router", "norms", "head"}
    own = sum(int(g["parameters"]["exact"]) for g in groups)
    assert own == device_params(MOE, 1, 0, 1, 0, 1, 0)  # untied: the groups add up to Ψ


BAD = [
    ("group vision { }", "PL118", "needs 'count'"),
    ("group vision { count = 10  fraction = 1/2 }", "PL119", "both"),
    ("group norms { count = 10 }", "PL113", "built-in"),
    ("group dense { count = 10 }", "PL113", "reserved"),
    ("group router { tensor = split }", "PL113", "no 'router'"),
    ("group vision { count = 10  placement = {zz: R} }", "PL109", "not an axis"),
    ("group vision { count = 10  params = {dp: M} }", "PL505", "persist"),
    ("group vision { fraction = 2 }", "PL107", "between 0 and 1"),
    ("group vision { count = 10  tensor = diagonal }", "PL114", "split, whole"),
    ("group all { count = 10 }", "PL113", "every parameter group"),
    ("group vision { count = 10 }\n  group vision { count = 20 }", "PL119", "twice"),
    ("group vision { count = 10  colour = 3 }", "PL113", "no property"),
]


@pytest.mark.parametrize("decl,code,words", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_group_declarations(tmp_path, capsys, decl, code, words):
    f = tmp_path / "g.place"
    f.write_text(spec_text(LLAMA, 2, 1, 1, decl))
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err and "^" in err and "Traceback" not in err


@pytest.mark.parametrize("p,k", [(2, 3), (4, 3), (4, 1), (2, 6), (8, 7)])
def test_dense_first_layers_fall_on_the_stages_that_hold_them(p, k):
    """Layers 0 … k−1 dense (MLP of width f), the rest MoE (E experts of width fe); stage s
    holds layers s·L/p … (s+1)·L/p − 1. Enumerated layer by layer."""
    h, L, a, f, fe, E, V = 32, 8, 4, 96, 48, 4, 64
    attn, norms = 4 * h * h, 2 * h
    dense_layer, moe_layer = attn + norms + 3 * h * f, attn + norms + E * 3 * h * fe + h * E
    text = ("from std.data import ddp\nfrom std.pipeline import one_f_one_b\n"
            f"model {{\n  transformer {{\n    hidden = {h}\n    layers = {L}\n    heads = {a}\n    ffn = {f}\n"
            f"    vocab = {V}\n    norm = rmsnorm\n    gated_mlp\n    bias = false\n    experts = {E}\n"
            f"    expert_ffn = {fe}\n    dense_layers = {k}\n  }}\n  bytes {{ params = 1 }}\n}}\n"
            f"mesh {{\n  dp = 2\n  pp = {p}\n}}\nplan x {{\n  dp: ddp\n  pp: one_f_one_b\n}}\n")
    pc = costs.derive(load_string(text).plan("x"))
    per = L // p
    for stage_mem, s in zip(pc.memory.stages, (0, p - 1)):
        layers = range(s * per, (s + 1) * per)
        want = sum(dense_layer if i < k else moe_layer for i in layers)
        want += V * h if s == 0 else V * h + h  # embedding on the first; head and final norm on the last
        got = stage_mem.device[State.PARAMS].subs({costs.symbol("pp"): p, costs.symbol("dp"): 2})
        assert got == want, (s, got, want)


def _periodic_layer_tensors(i: int, h: int, a: int, f: int, fe: int, E: int, moe: bool, bias: bool) -> list[tuple]:
    """The weight tensors of layer i, written from the architecture: layernorms (weight, bias),
    q, k, v, o (with biases), and either a dense MLP (up, down with biases) or E experts of
    the same form plus a router (h -> E, with a bias)."""
    out = [(h,), (h,), (h,), (h,)] if bias else [(h,), (h,)]  # two norms
    for _ in range(4):
        out.append((h, h))
        if bias:
            out.append((h,))
    if moe:
        for _ in range(E):
            out += [(fe, h), (h, fe)] + ([(fe,), (h,)] if bias else [])
        out += [(E, h)] + ([(E,)] if bias else [])
    else:
        out += [(f, h), (h, f)] + ([(f,), (h,)] if bias else [])
    return out


def _size(shape: tuple) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("p,d,every,offset", [(1, 0, 2, 0), (2, 0, 2, 1), (4, 1, 2, 0), (2, 3, 3, 2), (4, 0, 4, 3),
                                              (8, 2, 3, 0), (2, 0, 1, 0)])
def test_moe_every_kth_layer_falls_on_the_stages_that_hold_it(p, d, every, offset, bias):
    """Layer i (from 0) is an MoE layer when i >= dense_layers and i mod moe_every = moe_offset;
    the others have a dense MLP. Ψ and every pipeline stage's parameters against the tensors of
    each layer, enumerated layer by layer (stage s holds layers s·L/p … (s+1)·L/p − 1)."""
    h, L, a, f, fe, E, V = 16, 8, 2, 40, 24, 4, 32
    moe = [i >= d and i % every == offset for i in range(L)]
    layer = [sum(_size(x) for x in _periodic_layer_tensors(i, h, a, f, fe, E, moe[i], bias)) for i in range(L)]
    final_norm = 2 * h if bias else h
    norm = "layernorm" if bias else "rmsnorm"
    dense = f"    dense_layers = {d}\n" if d else ""
    text = ("from std.data import ddp\nfrom std.pipeline import one_f_one_b\n"
            f"model {{\n  transformer {{\n    hidden = {h}\n    layers = {L}\n    heads = {a}\n    ffn = {f}\n"
            f"    vocab = {V}\n    norm = {norm}\n    bias = {str(bias).lower()}\n    tied_embeddings = false\n"
            f"    experts = {E}\n    expert_ffn = {fe}\n{dense}    moe_every = {every}\n    moe_offset = {offset}\n"
            f"  }}\n  bytes {{ params = 1 }}\n}}\n"
            f"mesh {{\n  dp = 2\n  pp = {p}\n}}\nplan x {{\n  dp: ddp\n  pp: one_f_one_b\n}}\n")
    pc = costs.derive(load_string(text).plan("x"))
    assert pc.shape.psi == sum(layer) + 2 * V * h + final_norm
    per = L // p
    for stage_mem, s in zip(pc.memory.stages, (0, p - 1)):
        want = sum(layer[s * per:(s + 1) * per])
        want += (V * h if s == 0 else 0) + (V * h + final_norm if s == p - 1 else 0)
        got = stage_mem.device[State.PARAMS].subs({costs.symbol("pp"): p, costs.symbol("dp"): 2})
        assert got == want, (s, got, want)


@pytest.mark.parametrize("fields,words", [
    ("moe_offset = 1", "give moe_every too"),
    ("moe_every = 2\n    moe_offset = 2", "moe_offset below it"),
    ("moe_every = 0", "at least 1"),
    ("moe_every = 1/2", "must be whole numbers"),
    ("moe_every = 4\n    moe_offset = 3\n    dense_layers = 8", "no layer is an MoE layer"),
])
def test_bad_moe_patterns(tmp_path, capsys, fields, words):
    f = tmp_path / "m.place"
    f.write_text("from std.data import ddp\nmodel {\n  transformer {\n    hidden = 16\n    layers = 8\n    heads = 2\n"
                 f"    vocab = 32\n    experts = 4\n    {fields}\n  }}\n}}\nmesh {{ dp = 2 }}\nplan x {{ dp: ddp }}\n")
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert words in err and "m.place:3:" in err and "Traceback" not in err


def megatron_current_most_loaded_shard(shape: dict, t: int, p: int) -> Fraction:
    """Megatron-LM's current ``compute_weight_and_optimizer_memory`` (theoretical_memory_usage.py,
    NVIDIA/Megatron-LM 00caa53), restated for a dense model without MTP or MLA: per layer
    2h·(f·swiglu + norm_size) + 2h²·(1 + kv/a), norm_size 1 for RMSNorm and 2 for LayerNorm; the
    block adds the final norm (norm_size·h); the most loaded shard is (block/pp + embedding)/tp,
    plus the untied output layer /tp when pp is 1."""
    h, L, a, kv, f, V = (Fraction(shape[k]) for k in ("h", "L", "a", "kv", "f", "V"))
    swiglu = Fraction(3, 2) if shape["gated"] else 1
    norm_size = 1 if shape["norm"] == "rmsnorm" else 2
    layer = 2 * h * (f * swiglu + norm_size) + 2 * h * h * (1 + kv / a)
    block = layer * L + norm_size * h
    embedding = h * V
    shard = (block / p + embedding) / t
    if not shape["tied"] and p == 1:
        shard += embedding / t
    return shard


CURRENT = [(t, p, tied, norm, kv) for t in (1, 2, 4, 8) for p in (1, 2, 4) for tied in (False, True)
           for norm in ("rmsnorm", "layernorm") for kv in (8, 2) if kv % t == 0]  # Megatron: groups divisible by tp


@pytest.mark.parametrize("t,p,tied,norm,kv", CURRENT)
def test_megatron_current_estimator_convention(t, p, tied, norm, kv):
    """The documented statement reproduces the current formula on every configuration Megatron-LM
    accepts (query groups divisible by the tensor size), RMSNorm and LayerNorm alike."""
    shape = dict(h=64, L=8, a=8, kv=kv, f=256, V=128, E=1, gated=norm == "rmsnorm", norm=norm, bias=False,
                 tied=tied)
    pc = costs.derive(load_string(spec_text(shape, t, p, 1, MEGATRON)).plan("p"))
    subs = {costs.symbol(a): n for a, n in (("dp", 2), ("tp", t), ("pp", p))}
    got = (pc.memory.stages[0].device if pc.memory.stages else pc.memory.device)[State.PARAMS].subs(subs)
    assert Fraction(int(got.p), int(got.q)) == megatron_current_most_loaded_shard(shape, t, p)
    if norm == "rmsnorm":  # the 2024 formula counted every norm as LayerNorm's 2h: more than the current one
        legacy = megatron_most_loaded_shard(shape, t, p)
        assert legacy > megatron_current_most_loaded_shard(shape, t, p)


def test_params_beside_a_shape_is_a_group_of_its_own():
    """Ψ given beside a shape: the persistent shard grows by (P − Ψ_shape)/dp, the gathered layer of
    ZeRO-3 and the gradient bucket do not grow at all (hand-derived: one layer of this shape)."""
    h, f, V, L = 64, 256, 128, 4
    layer = 4 * h * h + 2 * h * f + 2 * 2 * h  # attention, ungated MLP, two layernorms (no biases)
    shape_psi = L * layer + 2 * V * h + 2 * h
    extra = 10**6

    def spec(params: str) -> str:
        return ("from std.data import zero3\nmodel {\n" + params + f"  transformer {{ hidden = {h}  layers = {L}  "
                f"heads = 4  ffn = {f}  vocab = {V}  bias = false }}\n  seq = 16\n  microbatch = 1\n}}\n"
                "mesh { dp = 8 }\nplan p { dp: zero3 }\n")

    plain = costs.derive(load_string(spec("")).plan("p"), sized=True).memory
    more = costs.derive(load_string(spec(f"  params = {shape_psi + extra}\n")).plan("p"), sized=True).memory
    dp = {costs.symbol("dp"): 8}
    assert more.device[State.PARAMS].subs(dp) - plain.device[State.PARAMS].subs(dp) == 2 * Fraction(extra, 8)
    gathered = [k for k in plain.transient if k.startswith("gathered params")]
    assert gathered and all(more.transient[k].subs(dp) == plain.transient[k].subs(dp) == 2 * layer for k in gathered)
    bucket = "gradient bucket (one layer, before reduce-scatter)"
    assert more.transient[bucket].subs(dp) == plain.transient[bucket].subs(dp)


def test_params_below_the_shape_is_located(tmp_path):
    from placement_logic.cli import main

    f = tmp_path / "p.place"
    f.write_text("from std.data import zero3\nmodel {\n  params = 1000\n  transformer { hidden = 64  layers = 2  "
                 "heads = 4  vocab = 100 }\n}\nmesh { dp = 8 }\nplan p { dp: zero3 }\n")
    import io

    err = io.StringIO()
    assert main(["cost", str(f)], io.StringIO(), err) == 2
    assert f"{f}:3:12: error: params = 1000 is below the" in err.getvalue() and "[PL163]" in err.getvalue()
