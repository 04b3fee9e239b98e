"""llm-analysis's training figures for a grid of configurations, written to
``tests/data/llm_analysis.json`` (read by ``tests/test_llm_analysis.py``, which does not need
llm-analysis installed).

Run with an environment that has llm-analysis (it is not a dependency of this package)::

    python3 -m venv /tmp/llmvenv && /tmp/llmvenv/bin/pip install llm-analysis==0.2.2
    /tmp/llmvenv/bin/python benchmarks/llm_analysis_reference.py

Each record holds the configuration and what ``LLMAnalysis.training`` returns for it (bytes
per GPU of weights, gradients, optimizer state and activations with their breakdown, FLOPs
per microbatch, the forward tensor-parallel all-reduce latency) plus the input embedding's
tensor-parallel all-reduce (``get_latency_fwd_per_layer_tp_comm`` at the embedding's
width, the call its forward latency makes). The GPU is made up so that latencies read as
bytes: 1 GB/s within a node and no minimum message latency (a latency of x s is x·10⁹ bytes),
and memory large enough for every batch size. Values are llm-analysis's floats, stored with
``repr`` so they read back bit for bit.
"""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import version
from pathlib import Path

from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
from llm_analysis.config import DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "llm_analysis.json"

SHAPES = {  # hidden, layers, heads, kv heads, MLP width, vocabulary
    "llama2-7b": dict(h=4096, L=32, a=32, kv=32, f=11008, V=32000),
    "llama2-13b": dict(h=5120, L=40, a=40, kv=40, f=13824, V=32000),
    "llama2-70b": dict(h=8192, L=80, a=64, kv=8, f=28672, V=32000),
    "gpt-1.3b": dict(h=2048, L=24, a=16, kv=16, f=8192, V=51200),
    "gpt-175b": dict(h=12288, L=96, a=96, kv=96, f=49152, V=51200),
}

# shape, tp, pp, dp, ZeRO stage, sequence parallel, recomputation, flash attention,
# microbatch, sequence, microbatches (gradient accumulation steps)
GRID = [
    ("llama2-7b", 1, 1, 8, 0, False, "none", True, 1, 4096, 1),
    ("llama2-7b", 2, 1, 4, 1, True, "none", True, 2, 4096, 1),
    ("llama2-7b", 4, 1, 2, 2, False, "selective", False, 1, 2048, 2),
    ("llama2-7b", 8, 1, 1, 0, True, "full", True, 4, 4096, 1),
    ("llama2-7b", 1, 1, 64, 3, False, "none", False, 1, 1024, 1),
    ("llama2-7b", 4, 1, 8, 3, False, "full", False, 2, 4096, 1),
    ("llama2-13b", 4, 2, 8, 1, True, "selective", True, 1, 4096, 8),
    ("llama2-13b", 8, 1, 16, 3, True, "none", True, 2, 4096, 1),
    ("llama2-13b", 2, 4, 4, 2, False, "full", False, 1, 2048, 8),
    ("llama2-70b", 8, 4, 8, 1, True, "selective", True, 1, 4096, 16),
    ("llama2-70b", 8, 8, 4, 1, False, "full", True, 1, 4096, 32),
    ("llama2-70b", 16, 2, 4, 3, True, "none", True, 1, 4096, 4),
    ("llama2-70b", 4, 1, 32, 3, True, "none", False, 1, 1024, 1),
    ("gpt-1.3b", 1, 1, 8, 0, False, "none", False, 8, 2048, 1),
    ("gpt-1.3b", 2, 2, 2, 2, True, "none", True, 4, 2048, 4),
    ("gpt-1.3b", 4, 1, 4, 1, False, "selective", False, 2, 2048, 4),
    ("gpt-175b", 8, 8, 16, 1, True, "selective", True, 1, 2048, 64),
    ("gpt-175b", 8, 16, 8, 1, False, "full", False, 1, 2048, 64),
]

FIELDS = (
    "num_params_total", "weight_memory_per_gpu", "weight_memory_embedding_per_gpu", "gradient_memory_per_gpu",
    "optimizer_state_memory_per_gpu", "activation_memory_per_gpu", "activation_memory_attn_per_gpu",
    "activation_memory_mlp_per_gpu", "activation_memory_layernorm_per_gpu",
    "activation_memory_embedding_output_per_gpu", "num_flops_total_per_micro_batch", "latency_fwd_tp_comm",
)

RECOMPUTE = {"none": ActivationRecomputation.NONE, "selective": ActivationRecomputation.SELECTIVE,
             "full": ActivationRecomputation.FULL}

GPU = GPUConfig(name="bytes-per-second", mem_per_GPU_in_GB=10 ** 6, hbm_bandwidth_in_GB_per_sec=1,
                intra_node_bandwidth_in_GB_per_sec=1, intra_node_min_message_latency=0, peak_fp16_TFLOPS=1)


def run(shape: str, tp: int, pp: int, dp: int, zero: int, sp: bool, recompute: str, flash: bool,
        b: int, s: int, m: int) -> dict:
    sh = SHAPES[shape]
    model = ModelConfig(name=shape, num_layers=sh["L"], n_head=sh["a"], hidden_dim=sh["h"], vocab_size=sh["V"],
                        max_seq_len=s, num_key_value_heads=sh["kv"], ffn_embed_dim=sh["f"],
                        expansion_ratio=sh["f"] / sh["h"])
    par = ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp, sp_size=tp if sp else 1)
    la = LLMAnalysis(model, GPU, DtypeConfig(), par)
    out = la.training(batch_size_per_gpu=b, gradient_accumulation_steps=m, seq_len=s,
                      activation_recomputation=RECOMPUTE[recompute], ds_zero=DSZeRO(zero), flash_attn=flash)
    result = {k: out[k] for k in FIELDS}
    result["embedding_tp_comm"] = la.get_latency_fwd_per_layer_tp_comm(
        b, s, la.dtype_config.embedding_bits / 8)
    return result


def main() -> None:
    logging.getLogger("llm_analysis").setLevel(logging.ERROR)
    keys = ("shape", "tp", "pp", "dp", "zero", "sp", "recompute", "flash", "b", "s", "m")
    records = [{"config": dict(zip(keys, row)), "llm_analysis": run(*row)} for row in GRID]
    doc = {"llm_analysis_version": version("llm-analysis"), "python": sys.version.split()[0],
           "defaults": "DtypeConfig() = w16a16e16; training(): layernorm_dtype_bytes = 4, master_weights_dtype_bytes"
                       " = 4, Adam (12 bytes of optimizer state), softmax_dropout = False",
           "shapes": SHAPES, "records": records}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(records)} records to {OUT}")


if __name__ == "__main__":
    main()
