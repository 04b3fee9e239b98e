"""The library plans the derivation theorems are about, with symbolic Ψ, N and K.

Input: nothing (a spec text importing the shipped strategies). Output: an ``ir.Spec``
whose plans bind each data-parallel library strategy to a mesh axis ``N`` (and
``hybrid_shard``, in a second spec, to ``(R, N)``), with Ψ = ``psi`` and the optimizer width ``K`` left as
symbols: the cost engine's formulas for these plans are exact in Ψ, N, K.
"""

from __future__ import annotations

from functools import lru_cache

from .. import ir
from ..frontend.loader import load_string

DATA_SPEC = """\
from std.data import ddp, zero1, zero2, zero3, fsdp_full_shard, fsdp_shard_grad_op, hybrid_shard
let psi = 1
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
  N = 1
}
plan dp { N: ddp }
plan zero1 { N: zero1 }
plan zero2 { N: zero2 }
plan zero3 { N: zero3 }
plan fsdp_full_shard { N: fsdp_full_shard }
plan fsdp_shard_grad_op { N: fsdp_shard_grad_op }
"""

HYBRID_SPEC = DATA_SPEC.split("mesh {")[0] + """mesh {
  R = 1
  N = 1
}
plan hybrid_shard { [R, N]: hybrid_shard }
"""


@lru_cache(maxsize=1)
def data_spec() -> ir.Spec:
    return load_string(DATA_SPEC, "<library: data-parallel plans>")


@lru_cache(maxsize=1)
def hybrid_spec() -> ir.Spec:
    return load_string(HYBRID_SPEC, "<library: hybrid sharding>")
