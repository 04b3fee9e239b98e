"""Shape-aware activation memory against an enumeration of one layer's saved tensors.

Oracle: the tensors a transformer layer keeps for its backward pass, written from the
architecture (Korthikanti et al. 2022, section 4, and Megatron-LM's fused SwiGLU): each with
its shape, its bytes per element and how tensor and sequence parallelism split it; the
oracle multiplies the shapes out and divides them device by device. The cost engine's
per-layer bytes must equal the sum for every recompute mode, with and without sequence
parallelism, over a grid of shapes (GQA, gated MLPs, MoE with experts of their own width and
shared experts). Korthikanti's Table 2 is the
case MHA, ungated, ffn = 4h (tests/test_cost_model.py).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from itertools import product

import pytest

from placement_logic import costs
from placement_logic.frontend.loader import load_string


def saved_tensors(sh: dict, t: int, sp: bool, recompute: str) -> list[tuple[str, tuple[int, ...], int, str]]:
    """(name, shape, bytes per element, split) of one layer: split 'heads' = always over the
    tensor ranks, 'seq' = over them under sequence parallelism only."""
    s, b, h, a, kv, f = (sh[k] for k in ("s", "b", "h", "a", "kv", "f"))
    dh = h // a
    if recompute == "full":
        return [("layer input", (s, b, h), 2, "seq")]
    out = [
        ("norm 1 input", (s, b, h), 2, "seq"),
        ("attention input (norm 1 output)", (s, b, h), 2, "seq"),
        ("q", (s, b, a * dh), 2, "heads"),
        ("k", (s, b, kv * dh), 2, "heads"),
        ("v", (s, b, kv * dh), 2, "heads"),
        ("output projection input", (s, b, a * dh), 2, "heads"),
        ("attention dropout mask", (s, b, h), 1, "seq"),
        ("norm 2 input", (s, b, h), 2, "seq"),
        ("mlp input (norm 2 output)", (s, b, h), 2, "seq"),
        ("mlp dropout mask", (s, b, h), 1, "seq"),
    ]
    if recompute == "none":
        out += [("softmax output", (b, a, s, s), 2, "heads"), ("softmax dropout mask", (b, a, s, s), 1, "heads"),
                ("softmax dropout output", (b, a, s, s), 2, "heads")]
    visits = sh["k"] * sh["cf"] if sh["E"] > 1 else 1
    tokens = s * b * visits


    def mlp(n: int, width: int, what: str) -> list:
        if sh["gated"]:
            return [(f"{what} gate and up output (fused SwiGLU input)", (n, 2 * width), 2, "heads"),
                    (f"{what} down projection input", (n, width), 2, "heads")]
        return [(f"{what} fc1 output", (n, width), 2, "heads"), (f"{what} activation output", (n, width), 2, "heads")]

    out += mlp(tokens, sh.get("fe", f) if sh["E"] > 1 else f, "mlp")
    for i in range(sh.get("S", 0)):  # shared experts: every token, once
        out += mlp(s * b, sh.get("fs", sh.get("fe", f)), f"shared expert {i}")
    if sh["E"] > 1:
        out += [("permuted tokens", (tokens, h), 2, "heads"), ("router logits (fp32)", (s, b, sh["E"]), 4, "seq")]
    return out


def device_bytes(sh: dict, t: int, sp: bool, recompute: str) -> Fraction:
    total = Fraction(0)
    for _, shape, width, split in saved_tensors(sh, t, sp, recompute):
        n = 1
        for d in shape:
            n *= d
        divided = split == "heads" or (split == "seq" and sp)
        total += Fraction(n * width, t if divided else 1)
    return total


def spec(sh: dict, t: int, sp: bool, recompute: str) -> str:
    tensor = "megatron_sp" if sp else "megatron_tp"
    use = {"none": "", "selective": "use selective_recompute", "full": "use full_recompute"}[recompute]
    moe = f"experts = {sh['E']}\n    top_k = {sh['k']}\n    capacity_factor = {sh['cf']}" if sh["E"] > 1 else ""
    if "fe" in sh:
        moe += f"\n    expert_ffn = {sh['fe']}"
    if sh.get("S"):
        moe += f"\n    shared_experts = {sh['S']}" + (f"\n    shared_expert_ffn = {sh['fs']}" if "fs" in sh else "")
    return (f"from std.data import ddp\nfrom std.tensor import {tensor}\n"
            "from std.recompute import selective_recompute, full_recompute\n"
            f"model {{\n  transformer {{\n    hidden = {sh['h']}\n    layers = 2\n    heads = {sh['a']}\n"
            f"    kv_heads = {sh['kv']}\n    ffn = {sh['f']}\n    vocab = 64\n"
            f"    gated_mlp = {'true' if sh['gated'] else 'false'}\n    {moe}\n  }}\n"
            f"  seq = {sh['s']}\n  microbatch = {sh['b']}\n}}\n"
            f"mesh {{\n  dp = 2\n  tp = {t}\n}}\nplan p {{\n  dp: ddp\n  tp: {tensor}\n  {use}\n}}\n")


@lru_cache(maxsize=None)
def _derived(text: str):
    """The costs of the spec's plan ``p``, derived once for the tests that read them."""
    return costs.derive(load_string(text).plan("p"))


SHAPES = [
    dict(s=16, b=2, h=64, a=8, kv=8, f=256, gated=False, E=1, k=1, cf=1),  # Korthikanti's case
    dict(s=16, b=1, h=64, a=8, kv=2, f=224, gated=True, E=1, k=1, cf=1),  # Llama-like GQA, SwiGLU
    dict(s=8, b=3, h=96, a=12, kv=4, f=160, gated=True, E=1, k=1, cf=1),
    dict(s=8, b=2, h=64, a=8, kv=8, f=128, gated=True, E=4, k=2, cf=Fraction(5, 4)),  # Mixtral-like MoE
    dict(s=32, b=1, h=32, a=4, kv=1, f=96, gated=False, E=1, k=1, cf=1),  # MQA
    dict(s=8, b=2, h=64, a=8, kv=4, f=256, gated=True, E=8, k=2, cf=1, fe=32, S=2),  # DeepSeek-like: narrow experts
    dict(s=8, b=1, h=64, a=8, kv=8, f=128, gated=False, E=4, k=1, cf=1, fe=64, S=1, fs=96),  # Qwen-MoE-like
]


@pytest.mark.parametrize("shape,t,sp,recompute",
                         [(sh, t, sp, rc) for sh, (t, sp), rc in product(SHAPES, [(1, False), (2, False), (2, True),
                                                                                 (4, True)],
                                                                        ["none", "selective", "full"])])
def test_per_layer_bytes_equal_the_saved_tensors(shape, t, sp, recompute):
    pc = _derived(spec(shape, t, sp, recompute))
    got = pc.activations.per_layer.subs({costs.symbol("tp"): t})
    want = device_bytes(shape, t, sp, recompute)
    assert Fraction(int(got.p), int(got.q)) == want


TERM_OF = {"norm 1 input": "norm inputs", "norm 2 input": "norm inputs", "layer input": "layer input",
           "attention input (norm 1 output)": "norm outputs", "mlp input (norm 2 output)": "norm outputs",
           "attention dropout mask": "dropout masks", "mlp dropout mask": "dropout masks", "q": "query",
           "k": "keys and values", "v": "keys and values", "output projection input": "projection input",
           "softmax output": "attention core", "softmax dropout mask": "attention core",
           "softmax dropout output": "attention core", "router logits (fp32)": "router logits"}


@pytest.mark.parametrize("shape,t,sp,recompute",
                         [(sh, t, sp, rc) for sh, (t, sp), rc in product(SHAPES, [(1, False), (2, False), (2, True)],
                                                                        ["none", "selective", "full"])])
def test_named_terms_are_the_saved_tensors_grouped(shape, t, sp, recompute):
    """``named_terms``: each named layer term is the oracle's tensors of that name (the MLP's, the
    permuted tokens' and the shared experts' under ``mlp``), and they add up to ``per_layer``."""
    from placement_logic.costs.activations import named_terms

    pc = _derived(spec(shape, t, sp, recompute))
    act = pc.activations
    sub = {costs.symbol("tp"): t}
    got = {name: Fraction(str(x.subs(sub))) for name, x in named_terms(pc.shape, pc.layout)[0]}
    want: dict[str, Fraction] = {}
    for name, dims, width, split in saved_tensors(shape, t, sp, recompute):
        n = 1
        for d in dims:
            n *= d
        divided = split == "heads" or (split == "seq" and sp)
        key = TERM_OF.get(name, "mlp")
        want[key] = want.get(key, Fraction(0)) + Fraction(n * width, t if divided else 1)
    assert got == {k: v for k, v in want.items() if v}
    assert sum(got.values()) == Fraction(str(act.per_layer.subs(sub)))


def test_megatron_convention_is_eighteen_plus_four_ffn_over_h():
    """Megatron-LM's estimator: s·b·h·(18 + 4·ffn/h)/t per layer with sequence parallelism and
    selective recomputation, whatever the gate or the kv heads."""
    sh = SHAPES[1]
    text = spec(sh, 4, True, "selective").replace("model {\n", "model {\n  conventions { activations = megatron }\n")
    pc = costs.derive(load_string(text).plan("p"))
    got = pc.activations.per_layer.subs({costs.symbol("tp"): 4})
    s, b, h, f = sh["s"], sh["b"], sh["h"], sh["f"]
    assert Fraction(int(got.p), int(got.q)) == Fraction(s * b * h, 4) * (18 + Fraction(4 * f, h))


def test_allowance_multiplies_every_activation_term():
    sh = SHAPES[0]
    plain = costs.derive(load_string(spec(sh, 2, True, "none")).plan("p")).activations
    text = spec(sh, 2, True, "none").replace("model {\n", "model {\n  conventions { activation_allowance = 21/20 }\n")
    scaled = costs.derive(load_string(text).plan("p")).activations
    assert scaled.total == plain.total * Fraction(21, 20)
    assert scaled.per_layer == plain.per_layer * Fraction(21, 20)


def test_runtime_reserve_and_allocator_allowance_are_stated_terms():
    """conventions { reserve, reserve_fraction }: a fixed reserve and a fraction of everything
    else on the device, as two named transient terms of the peak; nothing without them."""
    base = ("from std.data import zero1\nmodel {{\n  params = 1000\n  {conv}\n}}\nmesh {{ dp = 4 }}\n"
            "plan p {{ dp: zero1 }}\n")
    plain = costs.derive(load_string(base.format(conv="")).plan("p"))
    assert not [k for k in plain.memory.transient if "reserve" in k or "allowance" in k]
    stated = costs.derive(load_string(base.format(conv="conventions { reserve = 1 GiB  reserve_fraction = 1/20 }"))
                          .plan("p"))
    rest = plain.memory.device_total.subs({costs.symbol("dp"): 4})
    total = stated.memory.device_total.subs({costs.symbol("dp"): 4})
    assert total == rest + Fraction(rest, 20) + 2 ** 30


def test_logits_width_and_a_padded_vocabulary():
    """GPT-2's 50257 tokens padded to a multiple of 1024 (Megatron-LM's 128·8) hold 51200 rows in
    the embedding; fp16 logits (bytes { logits = 2 }) halve the output layer's logits term."""
    text = ("from std.data import ddp\nmodel {{\n  transformer {{ hidden = 768  layers = 12  heads = 12  vocab = 50257"
            "  {pad}  position_embeddings = 1024  tied_embeddings }}\n  {logits}\n  seq = 8\n  microbatch = 1\n}}\n"
            "mesh {{ dp = 2 }}\nplan p {{ dp: ddp }}\n")
    plain = costs.derive(load_string(text.format(pad="", logits="")).plan("p"))
    padded = costs.derive(load_string(text.format(pad="vocab_multiple = 1024", logits="bytes { logits = 2 }"))
                          .plan("p"))
    assert plain.shape.psi == 124_439_808
    assert padded.shape.psi == 124_439_808 + (51200 - 50257) * 768
    s, b, h = 8, 1, 768
    assert plain.activations.output == 4 * s * b * h + 4 * s * b * 50257
    assert padded.activations.output == 4 * s * b * h + 2 * s * b * 51200


@pytest.mark.parametrize("p,schedule,dense,every", [(1, None, 2, None), (2, "one_f_one_b", 1, None),
                                                     (2, "one_f_one_b", 0, 2), (4, "gpipe", 1, 3),
                                                     (2, "gpipe", 3, None)])
def test_dense_and_moe_layers_keep_their_own_activations(p, schedule, dense, every):
    """A model with dense and MoE layers: each stage keeps, per microbatch in flight, the saved
    tensors of the layers it holds, a dense layer's (MLP of width ffn) or an MoE layer's
    (routed experts of expert_ffn, the router): enumerated layer by layer."""
    sh = dict(s=8, b=1, h=64, a=8, kv=8, f=256, gated=True, E=8, k=2, cf=1, fe=32)
    L, m, t = 8, 4, 2
    is_moe = [i >= dense and (every is None or i % every == 0) for i in range(L)]
    moe_layer = device_bytes(sh, t, True, "selective")
    dense_layer = device_bytes(dict(sh, E=1), t, True, "selective")
    fields = (f"    dense_layers = {dense}\n" if dense else "") + (f"    moe_every = {every}\n" if every else "")
    pipe = f"  pp: {schedule}\n" if schedule else ""
    text = (f"from std.data import ddp\nfrom std.tensor import megatron_sp\nfrom std.pipeline import gpipe, one_f_one_b\n"
            f"model {{\n  transformer {{\n    hidden = 64\n    layers = {L}\n    heads = 8\n    ffn = 256\n    vocab = 64\n"
            f"    gated_mlp\n    experts = 8\n    top_k = 2\n    expert_ffn = 32\n{fields}  }}\n"
            f"  seq = 8\n  microbatch = 1\n  microbatches = {m}\n}}\n"
            f"mesh {{\n  dp = 2\n  tp = {t}\n" + (f"  pp = {p}\n" if schedule else "") + "}\n"
            f"plan x {{\n  dp: ddp\n  tp: megatron_sp\n{pipe}  recompute = selective\n}}\n")
    act = costs.derive(load_string(text).plan("x")).activations
    subs = {costs.symbol("tp"): t, costs.symbol("pp"): p}
    per = L // p
    stages = act.stages or ()
    in_flight = {"gpipe": (m, m), "one_f_one_b": (min(m, p), 1)}.get(schedule, (1, 1))
    if not stages:
        want = sum(moe_layer if x else dense_layer for x in is_moe)
        got = act.total.subs(subs) - act.embedding.subs(subs) - act.output.subs(subs)
        assert got == want
        return
    for st, s, mb in zip(stages, (0, p - 1), in_flight):
        want = mb * sum(moe_layer if x else dense_layer for x in is_moe[s * per:(s + 1) * per])
        assert st.layers.subs(subs) == want, (st.stage, st.layers.subs(subs), want)
