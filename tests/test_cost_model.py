"""Parameter counts, Korthikanti activation formulas, pipeline factors, ZeroPP vs Megatron TP."""

import pytest
import sympy

from placement_logic import costs, ir
from placement_logic.costs.activations import Layout, in_flight, per_layer
from placement_logic.costs.sizes import shape_of, transformer_params
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_spec
from tests.cost_corpus import LLAMA2_70B_PARAMS, c, llama70b_shape, model

s, b, h, a, t, p, v, m, U, L = (symbol(n) for n in "s b h a t p v m U L".split())


def test_llama2_70b_exact():
    assert transformer_params(llama70b_shape())[0] == LLAMA2_70B_PARAMS


def test_llama_example_derives_the_same_count():
    spec = load_spec("examples/llama70b_3d.place")
    assert costs.derive(spec.plans[0]).shape.psi == LLAMA2_70B_PARAMS


def test_mixtral_8x7b_exact():
    # Mixtral-8x7B's published total: 46,702,792,704 parameters
    shape = llama70b_shape(hidden=c(4096), layers=c(32), heads=c(32), kv_heads=c(8), ffn=c(14336),
                           vocab=c(32000), experts=c(8), top_k=c(2))
    assert transformer_params(shape)[0] == 46_702_792_704


def test_gpt2_small_exact():
    # GPT-2 small without its 1024x768 learned position table: 124,439,808 - 786,432
    shape = ir.TransformerShape(hidden=c(768), layers=c(12), heads=c(12), kv_heads=c(12), ffn=c(3072), vocab=c(50257),
                           tied_embeddings=True, norm="layernorm", bias=True)
    assert transformer_params(shape)[0] == 124_439_808 - 1024 * 768


def _shape():
    tr = ir.TransformerShape(hidden=ir.Sym("h"), layers=ir.Sym("L"), heads=ir.Sym("a"), kv_heads=ir.Sym("a"),
                        ffn=ir.Op("*", (c(4), ir.Sym("h"))), vocab=ir.Sym("V"))
    return shape_of(model(None, seq=ir.Sym("s"), mb=ir.Sym("b"), m=ir.Sym("m"), transformer=tr))


def _layout(t_, sp, rc=ir.Recompute.NONE, flash=False, sched=None, p_=1, v_=1, U_=1):
    return Layout(t=t_, c=sympy.Integer(1), p=p_, v=v_, U=U_, schedule=sched, sp=sp, recompute=rc, flash=flash)


KORTHIKANTI = {  # Table 2 of Korthikanti et al. 2022, bytes per layer per microbatch
    "no parallelism": (1, False, ir.Recompute.NONE, s * b * h * (34 + 5 * a * s / h)),
    "tensor parallel": (t, False, ir.Recompute.NONE, s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    "tensor + sequence parallel": (t, True, ir.Recompute.NONE, s * b * h * (34 / t + 5 * a * s / (h * t))),
    "tensor parallel + selective": (t, False, ir.Recompute.SELECTIVE, s * b * h * (10 + 24 / t)),
    "tensor + sequence + selective": (t, True, ir.Recompute.SELECTIVE, s * b * h * 34 / t),
    "full recompute": (t, False, ir.Recompute.FULL, 2 * s * b * h),
    "full recompute + sequence parallel": (t, True, ir.Recompute.FULL, 2 * s * b * h / t),
}


@pytest.mark.parametrize("case", sorted(KORTHIKANTI))
def test_korthikanti_per_layer(case):
    t_, sp, rc, expected = KORTHIKANTI[case]
    sh = _shape()
    got = per_layer(sh, _layout(sympy.Integer(1) if t_ == 1 else t_, sp, rc), rc, False)
    assert sympy.simplify(got - expected) == 0


def test_flash_attention_drops_the_score_term():
    sh = _shape()
    got = per_layer(sh, _layout(t, True), ir.Recompute.NONE, True)
    assert sympy.simplify(got - s * b * h * 34 / t) == 0


def test_pipeline_in_flight():
    """First-stage layer-microbatches once the schedule reaches its steady state (m = 2p + k)."""
    sh = _shape()
    k = symbol("k")
    steady = {m: 2 * p + k}

    def first(sched, v_=1, U_=1):
        lay = _layout(t, True, sched=sched, p_=p, v_=sympy.Integer(v_), U_=U_)
        return in_flight(sh, lay)["first"].layer_microbatches.subs(steady)

    assert first(ir.ScheduleKind.ONE_F_ONE_B) == L  # p microbatches of L/p layers
    assert sympy.simplify(first(ir.ScheduleKind.GPIPE) - L / p * (2 * p + k)) == 0
    for v_ in (2, 3):
        assert sympy.simplify(first(ir.ScheduleKind.INTERLEAVED, v_) - L * (1 + (p - 1) / (p * v_))) == 0
        # ZeroPP keeps interleaved's chunks in flight whatever its scheduling unit
        assert first(ir.ScheduleKind.ZEROPP, v_, U) == first(ir.ScheduleKind.INTERLEAVED, v_)


def test_zeropp_moves_less_than_megatron_tp_when_u_is_large():
    spec = load_spec("examples/zeropp.place")
    sizes = {symbol("intra"): 8, symbol("stage"): 4}
    zpp = costs.derive(spec.plan("zeropp")).communication.on_axis("intra")[0].subs(sizes)
    meg = costs.derive(spec.plan("megatron")).communication.on_axis("intra")[0].subs(sizes)
    assert symbol("U") in zpp.free_symbols and not meg.free_symbols
    n, pp, mb = 8, 4, 32  # intra, stage, microbatches of the example
    psi = costs.derive(spec.plan("zeropp")).shape.psi
    sbh, layers = 2048 * 1 * 5120, 40
    ring = sympy.Rational(n - 1, n)
    # per step on the node: gather each chunk for forward and backward and reduce-scatter its
    # gradients, once per U microbatches, for the stage's Ψ/p parameters of 2 bytes
    zeropp_hand = 3 * ring * 2 * psi / pp * mb / U
    # Megatron SP: 2 all-gathers + 2 reduce-scatters of s·b·h 2-byte activations per layer,
    # forward and backward, and the 2 column-parallel inputs gathered again in backward for the
    # weight gradient, for the stage's L/p layers and every microbatch; on the last stage the
    # head's input all-gathered (forward, and again in backward) and its gradient
    # reduce-scattered (backward), and the vocabulary-parallel cross entropy's 3 all-reduces of
    # one fp32 value per token
    sb = 2048 * 1
    megatron_hand = (10 * ring * 2 * sbh * sympy.Rational(layers, pp) * mb + 3 * ring * 2 * sbh * mb
                     + 3 * 2 * ring * 4 * sb * mb)
    assert sympy.simplify(zpp - zeropp_hand) == 0
    assert sympy.simplify(meg - megatron_hand) == 0
    threshold = sympy.solve(sympy.Eq(zpp, meg), U)[0]
    assert threshold == 3 * ring * 2 * psi / pp * mb / megatron_hand
    assert zpp.subs(U, threshold + 1) < meg < zpp.subs(U, threshold - 1 if threshold > 1 else threshold / 2)


def _tp_spec(sp: bool, pp: int, tied: bool = False) -> str:
    strategy = "megatron_sp" if sp else "megatron_tp"
    return f"""\
from std.tensor import {strategy}
from std.pipeline import one_f_one_b
model {{
  transformer {{ hidden = 1024  layers = 8  heads = 16  ffn = 4096  vocab = 32000{'  tied_embeddings' if tied else ''} }}
  seq = 512
  microbatch = 2
  microbatches = 4
  bytes {{ params = 2  grads = 2  optimizer = 12  activations = 2 }}
}}
mesh {{ pp = {pp}  tp = 4 }}
plan p {{ pp: one_f_one_b  tp: {strategy} }}
"""


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("pp", [1, 4])
def test_tensor_axis_traffic_per_microbatch_by_hand(sp, pp):
    """Megatron-LM's tensor-axis traffic of one microbatch, written out call by call: each layer
    2 forward + 2 backward s·b·h exchanges (all-reduce, or all-gather + reduce-scatter under SP);
    the vocabulary-parallel embedding's output (first stage) and head's input gradient (last
    stage), one exchange each way under SP; the cross entropy's 3 all-reduces of s·b fp32; under SP
    the column-parallel inputs (QKV, MLP up, head) gathered again in backward; without SP and
    with a pipeline, the boundary's 1/t chunks gathered after each receive (scatter/gather)."""
    from placement_logic.frontend.loader import load_string

    plan = load_string(_tp_spec(sp, pp), "tp.place").plans[0]
    comm = costs.derive(plan, sized=True).communication
    tpn, mb, layers_here = 4, 4, 8 // pp
    sbh = 512 * 2 * 1024 * 2  # bytes, 16-bit
    tokens = 512 * 2 * 4  # one fp32 per token
    ar, half = sympy.Rational(2 * (tpn - 1), tpn), sympy.Rational(tpn - 1, tpn)
    calls = []  # (ring factor, bytes) of every call one device of the last stage makes per microbatch
    for _layer in range(layers_here):  # under SP the QKV and MLP-up inputs are gathered again in backward
        calls += [(half, sbh)] * (8 + 2) if sp else [(ar, sbh)] * 4
    ends = ["head"] + (["embedding"] if pp == 1 else [])
    for end in ends:
        calls += [(half, sbh)] * (2 + (end == "head")) if sp else [(ar, sbh)]
    calls += [(ar, tokens)] * 3
    if pp > 1 and not sp:  # the pipeline's scatter/gather: the received chunks gathered, both directions
        calls += [(half, sbh)] * 2
    want = mb * sum(f * n for f, n in calls)
    assert comm.on_axis("tp")[0].subs(symbol("tp"), tpn).subs(symbol("pp"), pp) == want
