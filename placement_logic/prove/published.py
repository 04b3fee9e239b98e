"""Published claims shipped with the proofs, as specs with ``claim`` statements.

Input: nothing. Output: the ZeRO paper abstract's claim ("ZeRO-3 uses 8x less memory than
data parallelism at 1.5x communication cost", Rajbhandari et al. 2020) and ZeroPP's
communication advantage over tensor parallelism (Tang et al. 2024; the setup of
``examples/zeropp.place``), each an ``ir.Spec`` whose claims ``claims.analyse`` turns
into exact conditions.
"""

from __future__ import annotations

from functools import lru_cache

from .. import ir
from ..frontend.loader import load_string

ZERO_ABSTRACT = """\
from std.data import ddp, zero3
let psi = 7.5e9
let K = 12
model {
  params = psi
  bytes {
    params = 2
    grads = 2
    optimizer = K
  }
}
mesh {
  dp = 64 @ inter_node
}
plan dp {
  dp: ddp
}
plan zero3 {
  dp: zero3
}
claim "ZeRO-3 uses 8x less memory than DP": model_state(dp) / model_state(zero3) == 8
claim "at 1.5x communication cost (ZeRO volume)": volume(zero3) / volume(dp) == 3 / 2
claim "at 1.5x communication cost (ring bytes)": comm(zero3) / comm(dp) == 3 / 2
"""

ZEROPP = """\
from std.zeropp import zeropp_dp
from std.data import ddp
from std.tensor import megatron_sp
from std.pipeline import interleaved_1f1b
let U = 4
model {
  transformer {
    hidden = 5120
    layers = 40
    heads = 40
    ffn = 20480
    vocab = 50304
  }
  seq = 2048
  microbatch = 1
  microbatches = 32
}
mesh {
  stage = 4 @ inter_node
  intra = 8 @ intra_node
  inter = 2 @ inter_node
}
plan zeropp {
  [stage, intra, inter]: zeropp_dp(v = 2, U = U)
}
plan megatron {
  stage: interleaved_1f1b(v = 2)
  intra: megatron_sp
  inter: ddp
}
claim "ZeroPP sends fewer bytes per step than Megatron-LM": comm(zeropp) < comm(megatron)
"""

SPECS = {"zero-abstract": ZERO_ABSTRACT, "zeropp-vs-tp": ZEROPP}


@lru_cache(maxsize=None)
def published_spec(name: str) -> ir.Spec:
    return load_string(SPECS[name], f"{name}.place")
