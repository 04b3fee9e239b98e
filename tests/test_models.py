"""Parameter counts of public architectures (examples/models/), exact.

Oracle: each checkpoint's tensors written out by name and shape from the architecture (the
Hugging Face module layout of the model family), multiplied out and summed, independently
of the cost engine's groups; and the counts the model authors publish. Every example's own
asserts hold (its published count)."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement_logic import costs
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


def _n(*shape: int) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def llama_like(h, L, a, kv, f, V, qkv_bias=False, tied=False) -> int:
    dh = h // a
    layer = {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (a * dh, h), "self_attn.k_proj.weight": (kv * dh, h),
        "self_attn.v_proj.weight": (kv * dh, h), "self_attn.o_proj.weight": (h, a * dh),
        "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f),
    }
    if qkv_bias:
        layer.update({"self_attn.q_proj.bias": (a * dh,), "self_attn.k_proj.bias": (kv * dh,),
                      "self_attn.v_proj.bias": (kv * dh,)})
    total = L * sum(_n(*s) for s in layer.values())
    total += _n(V, h) + _n(h)  # embed_tokens, norm
    return total + (0 if tied else _n(V, h))  # lm_head


def mixtral(h, L, a, kv, f, V, E) -> int:
    dense = llama_like(h, L, a, kv, 0, V)
    experts = L * E * (_n(f, h) * 3)  # block_sparse_moe.experts.{w1,w2,w3}
    return dense + experts + L * _n(E, h)  # block_sparse_moe.gate


def qwen_moe(h, L, a, V, E, fe, fs) -> int:
    base = llama_like(h, L, a, a, 0, V, qkv_bias=True)
    per = E * 3 * _n(fe, h) + _n(E, h) + 3 * _n(fs, h) + _n(1, h)  # experts, gate, shared_expert, shared_expert_gate
    return base + L * per


def deepseek_v3(h=7168, L=61, a=128, V=129280, f=18432, fe=2048, E=256, k_dense=3, q_rank=1536, kv_rank=512,
                rope=64, nope=128, v=128, mtp=0) -> int:
    attn = {
        "q_a_proj": (q_rank, h), "q_a_layernorm": (q_rank,), "q_b_proj": (a * (nope + rope), q_rank),
        "kv_a_proj_with_mqa": (kv_rank + rope, h), "kv_a_layernorm": (kv_rank,),
        "kv_b_proj": (a * (nope + v), kv_rank), "o_proj": (h, a * v),
    }
    attn_n = sum(_n(*s) for s in attn.values())
    norms = 2 * h
    dense_mlp = 3 * _n(f, h)
    moe = E * 3 * _n(fe, h) + 3 * _n(fe, h) + _n(E, h) + E  # experts, shared_experts, gate.weight, e_score_correction_bias
    moe_layer = attn_n + norms + moe
    total = k_dense * (attn_n + norms + dense_mlp) + (L - k_dense) * moe_layer
    total += 2 * _n(V, h) + h
    total += mtp * (2 * h + _n(h, 2 * h) + moe_layer)  # enorm, hnorm, eh_proj, one MoE layer
    return total


def gpt3(h=12288, L=96, V=50304, P=2048) -> int:
    layer = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    return L * layer + _n(V, h) + _n(P, h) + 2 * h


ORACLE = {
    "llama3_8b": (llama_like(4096, 32, 32, 8, 14336, 128256), 8_030_261_248),
    "llama3_70b": (llama_like(8192, 80, 64, 8, 28672, 128256), 70_553_706_496),
    "mistral_7b": (llama_like(4096, 32, 32, 8, 14336, 32000), 7_241_732_096),
    "mixtral_8x7b": (mixtral(4096, 32, 32, 8, 14336, 32000, 8), 46_702_792_704),
    "qwen25_7b": (llama_like(3584, 28, 28, 4, 18944, 152064, qkv_bias=True), 7_615_616_512),
    "qwen15_moe_a27b": (qwen_moe(2048, 24, 16, 151936, 60, 1408, 5632), 14_315_784_192),
    "deepseek_v3": (deepseek_v3(), None),
    "gpt3_175b": (gpt3(), None),
}


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_psi_equals_the_enumerated_checkpoint_and_the_published_count(name):
    spec = load_spec(str(MODELS / f"{name}.place"))
    psi = costs.derive(spec.plans[0]).shape.psi
    enumerated, published = ORACLE[name]
    assert psi == enumerated
    if published is not None:
        assert psi == published


def test_every_model_example_has_a_spec_and_its_asserts_hold(capsys):
    names = {p.stem for p in MODELS.glob("*.place")}
    assert names == set(ORACLE)
    for name in sorted(names):
        assert main(["cost", str(MODELS / f"{name}.place"), "--no-cache"]) == 0, name
    capsys.readouterr()


def test_deepseek_v3_published_totals():
    """671B in the main model, within 0.01%; the multi-token-prediction module on top."""
    main_model = deepseek_v3()
    assert abs(main_model - 671e9) / 671e9 < 1e-4
    text = (MODELS / "deepseek_v3.place").read_text().replace("    router_bias\n", "    router_bias\n    mtp_layers = 1\n")
    from placement_logic.frontend.loader import load_string

    psi = costs.derive(load_string(text).plans[0]).shape.psi
    assert psi == deepseek_v3(mtp=1)


def test_active_parameters_of_mixtral():
    spec = load_spec(str(MODELS / "mixtral_8x7b.place"))
    sh = costs.derive(spec.plans[0]).shape
    idle = 32 * 6 * 3 * 4096 * 14336  # six of eight experts per layer idle for a token
    assert costs.active_params(sh) == 46_702_792_704 - idle
