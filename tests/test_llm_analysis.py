"""llm-analysis's training figures reproduced with its conventions stated in the spec.

Oracle: ``tests/data/llm_analysis.json``, what ``LLMAnalysis.training`` of llm-analysis 0.2.2
returned for 18 configurations (Llama-2-7B/13B/70B and GPT-1.3B/175B shapes; tensor,
pipeline and data sizes, ZeRO 0-3, sequence parallelism on and off, no, selective and full
recomputation, flash attention on and off, microbatches of 1 to 8), written by
``benchmarks/llm_analysis_reference.py`` (which needs llm-analysis; this test does not).

Set alike (docs/costs.md, "Differences from llm-analysis"): an ungated MLP of llm-analysis's
width, rmsnorm, no biases, tied embeddings, ``bytes { grads = 4  logits = 2 }``, the norms
split by the tensor ranks (``group norms``, ``group final_norm``), ``conventions {
activations = llm_analysis }``. llm-analysis computes in floats: a figure matches when the
engine's exact value is within one unit in the last place of llm-analysis's float (147 of
the 154 comparisons are equal bit for bit, the model states all of them; the others carry
llm-analysis's rounding of f/h and of latencies in seconds). Each difference
that no setting removes is asserted as the exact term the docs name."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic import costs
from placement_logic.costs.steptime import flops_per_token
from placement_logic.frontend.loader import load_string
from placement_logic.ir import State
from placement_logic.ir.collectives import Phase

DATA = json.loads((Path(__file__).parent / "data" / "llm_analysis.json").read_text())
RECORDS = DATA["records"]
AXES = ("dp", "tp", "pp")


def rid(r: dict) -> str:
    c = r["config"]
    return (f"{c['shape']}-t{c['tp']}p{c['pp']}d{c['dp']}-z{c['zero']}{'-sp' if c['sp'] else ''}-{c['recompute']}"
            f"{'-flash' if c['flash'] else ''}-b{c['b']}")


def spec_text(c: dict, sh: dict) -> str:
    """The plan llm-analysis describes, with its conventions stated."""
    data = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[c["zero"]]
    mesh = "".join(f"  {a} = {c[a]}\n" for a in AXES if c[a] > 1)
    plan = (f"  dp: {data}\n" if c["dp"] > 1 else "") + \
        (f"  tp: {'megatron_sp' if c['sp'] else 'megatron_tp'}\n" if c["tp"] > 1 else "") + \
        ("  pp: one_f_one_b\n" if c["pp"] > 1 else "") + \
        (f"  use {c['recompute']}_recompute\n" if c["recompute"] != "none" else "") + \
        ("  flash_attention\n" if c["flash"] else "")
    return f"""from std.data import ddp, zero1, zero2, zero3
from std.tensor import megatron_tp, megatron_sp
from std.pipeline import one_f_one_b
from std.recompute import selective_recompute, full_recompute
model {{
  transformer {{
    hidden = {sh['h']}
    layers = {sh['L']}
    heads = {sh['a']}
    kv_heads = {sh['kv']}
    ffn = {sh['f']}
    vocab = {sh['V']}
    norm = rmsnorm
    bias = false
    tied_embeddings = true
  }}
  bytes {{
    grads = 4
    logits = 2
  }}
  seq = {c['s']}
  microbatch = {c['b']}
  microbatches = {c['m']}
  conventions {{ activations = llm_analysis }}
  group norms {{ tensor = split }}
  group final_norm {{ tensor = split }}
}}
mesh {{
{mesh}}}
plan p {{
{plan}}}
"""


def engine(r: dict) -> dict:
    """The engine's exact figures for one record, per GPU: the last stage's model states
    (it holds the layers, the final norm and the tied head's copy, as llm-analysis's GPU
    does), the first stage's layer activations, the last stage's output layer, the
    tensor-parallel bytes of one microbatch's forward, and FLOPs per microbatch."""
    c = r["config"]
    sh = DATA["shapes"][c["shape"]]
    plan = load_string(spec_text(c, sh)).plan("p")
    pc = costs.derive(plan, sized=True)
    subs = {costs.symbol(a): c[a] for a in AXES}

    def ev(e) -> Fraction:
        v = sympy.sympify(e).subs(subs)
        assert v.is_Rational, v
        return Fraction(int(v.p), int(v.q))

    mem = pc.memory.stages[-1] if pc.memory.stages else pc.memory
    act = pc.activations
    first, last = (act.stages[0], act.stages[-1]) if act.stages else (None, None)
    layers = first.layers if first else act.total - act.embedding - act.output
    forward = [sc for sc in pc.communication.collectives
               if sc.collective.axes == ("tp",) and sc.collective.phase is Phase.FORWARD]
    per_layer = sum((sc.bytes_per_device for sc in forward if "per layer" in sc.collective.rule), sympy.Integer(0))
    embedding = sum((sc.bytes_per_device for sc in forward if "embedding" in sc.collective.rule),
                    sympy.Integer(0))
    fl = flops_per_token(plan.model.transformer, sympy.Integer(c["s"]), causal=False)
    tokens = c["s"] * c["b"]
    return {
        "psi": ev(pc.shape.psi),
        "params": ev(mem.device[State.PARAMS]), "grads": ev(mem.device[State.GRADS]),
        "optimizer": ev(mem.device[State.OPTIMIZER]),
        "layers": ev(layers), "output": ev(last.output if last else act.output),
        "tp_forward": ev(per_layer) / c["m"], "embedding_forward": ev(embedding) / c["m"],
        "flops_forward": ev(fl.forward) * tokens, "flops_layers": ev(fl.layer + fl.attention) * tokens,
        "flops_attention": ev(fl.attention) * tokens, "flops_head": ev(fl.head) * tokens,
    }


def close(exact: Fraction, x: float) -> bool:
    """llm-analysis's float x is the exact value up to its own rounding (one unit in the last place)."""
    return abs(Fraction(x) - exact) <= Fraction(math.ulp(x))


@pytest.fixture(scope="module")
def derived() -> dict:
    return {rid(r): engine(r) for r in RECORDS}


@pytest.mark.parametrize("r", RECORDS, ids=rid)
def test_model_states(r, derived):
    """Weights (2 B), fp32 gradients and 12 B of Adam state per GPU, ZeRO 0-3, exactly."""
    e, la = derived[rid(r)], r["llm_analysis"]
    assert close(e["params"], la["weight_memory_per_gpu"])
    assert close(e["grads"], la["gradient_memory_per_gpu"])
    assert close(e["optimizer"], la["optimizer_state_memory_per_gpu"])


@pytest.mark.parametrize("r", RECORDS, ids=rid)
def test_activations(r, derived):
    """Layers (the first stage's, L of them under 1F1B) plus the output layer (final norm and
    logits, the last stage's). With a microbatch of one llm-analysis counts the output layer
    twice: ``activation_memory_batch_size_1`` already holds it when it is added again."""
    e, la, c = derived[rid(r)], r["llm_analysis"], r["config"]
    assert close(e["output"], la["activation_memory_embedding_output_per_gpu"] + (
        0 if c["recompute"] == "full" else c["s"] * c["b"] * DATA["shapes"][c["shape"]]["h"] * 4 // (
            c["tp"] if c["sp"] else 1)))
    twice = 2 if c["b"] == 1 else 1
    assert close(e["layers"] + twice * e["output"], la["activation_memory_per_gpu"])


@pytest.mark.parametrize("r", RECORDS, ids=rid)
def test_parameter_count(r, derived):
    """Ψ is llm-analysis's count (tied, rmsnorm, no biases, two MLP matrices); with fewer kv heads
    than tensor ranks llm-analysis's total counts each rank's copy of a kv head."""
    e, la, c = derived[rid(r)], r["llm_analysis"], r["config"]
    sh = DATA["shapes"][c["shape"]]
    copies = max(c["tp"] - sh["kv"], 0) * 2 * sh["h"] * sh["h"] // sh["a"] * sh["L"]
    assert close(e["psi"] + copies, la["num_params_total"])


@pytest.mark.parametrize("r", RECORDS, ids=rid)
def test_tensor_parallel_forward(r, derived):
    """Two all-reduces of s·b·h per layer in forward (all-gather + reduce-scatter with sequence
    parallelism: the same ring bytes), over L/p layers, per microbatch; the GPU of 1 GB/s makes
    llm-analysis's latency read as bytes. Its input embedding's all-reduce is the engine's on
    the first stage without sequence parallelism; with it the engine reduce-scatters (half)."""
    e, la, c = derived[rid(r)], r["llm_analysis"], r["config"]
    assert close(e["tp_forward"], la["latency_fwd_tp_comm"] * 10 ** 9)
    if c["pp"] == 1:
        assert close(e["embedding_forward"] * (2 if c["sp"] else 1), la["embedding_tp_comm"] * 10 ** 9)


@pytest.mark.parametrize("r", RECORDS, ids=rid)
def test_flops_per_microbatch(r, derived):
    """Forward + backward (2×) + recompute, attention core counted whole. llm-analysis prices the
    MLP at 16·h² FLOPs per token (f = 4h, whatever the width) and recomputes the output layer
    too under full recomputation."""
    e, la, c = derived[rid(r)], r["llm_analysis"], r["config"]
    sh = DATA["shapes"][c["shape"]]
    tokens = c["s"] * c["b"]
    mlp = sh["L"] * tokens * (16 * sh["h"] ** 2 - 4 * sh["h"] * sh["f"])  # llm-analysis's MLP less the engine's
    recompute = {"none": 0, "selective": e["flops_attention"], "full": e["flops_layers"] + e["flops_head"] + mlp}
    total = 3 * (e["flops_forward"] + mlp) + recompute[c["recompute"]]
    assert close(total, la["num_flops_total_per_micro_batch"])


def test_the_grid_covers_what_it_claims():
    cs = [r["config"] for r in RECORDS]
    assert len(cs) == 18 and DATA["llm_analysis_version"] == "0.2.2"
    assert {c["zero"] for c in cs} == {0, 1, 2, 3} and {c["recompute"] for c in cs} == {"none", "selective", "full"}
    assert {c["sp"] for c in cs} == {True, False} and {c["flash"] for c in cs} == {True, False}
    assert {c["pp"] for c in cs} > {1, 2} and any(c["tp"] > DATA["shapes"][c["shape"]]["kv"] for c in cs)


def test_model_states_are_bit_exact(derived):
    """llm-analysis's model-state floats are integers below 2**53, computed without rounding: the
    engine's exact values are those floats bit for bit."""
    exact = [float(derived[rid(r)][k]) == r["llm_analysis"][f]
             for r in RECORDS for k, f in (("params", "weight_memory_per_gpu"), ("grads", "gradient_memory_per_gpu"),
                                           ("optimizer", "optimizer_state_memory_per_gpu"))]
    assert len(exact) == 54 and all(exact)


def test_the_default_count_is_not_llm_analysis():
    """The convention is opt-in: without it the engine keeps its own count (two dropout masks,
    16-bit norm inputs, no flash-attention statistics, the output projection's input)."""
    r = RECORDS[1]
    text = spec_text(r["config"], DATA["shapes"][r["config"]["shape"]]).replace(
        "  conventions { activations = llm_analysis }\n", "")
    pc = costs.derive(load_string(text).plan("p"), sized=True)
    subs = {costs.symbol(a): r["config"][a] for a in AXES}
    assert pc.activations.total.subs(subs) != r["llm_analysis"]["activation_memory_per_gpu"]


def test_a_misspelt_convention_names_the_counts(tmp_path, capsys):
    from placement_logic.cli import main

    f = tmp_path / "c.place"
    f.write_text("model {\n  params = 10\n  conventions { activations = llm_analysys }\n}\nmesh { dp = 2 }\n"
                 "from std.data import ddp\nplan p { dp: ddp }\n")
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert "'activations' must be one of shape, korthikanti, megatron, llm_analysis" in err
    assert "did you mean 'llm_analysis'?" in err and "c.place:3:31:" in err and "[PL114]" in err
