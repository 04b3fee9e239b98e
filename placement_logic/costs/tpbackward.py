"""Megatron-LM's asynchronous tensor-parallel backward (``conventions { tensor_backward = overlapped }``).

Since late 2021 Megatron-LM's column-parallel linear (``LinearWithGradAccumulationAndAsyncCommunication``,
``megatron/core/tensor_parallel/layers.py``; the option ``async_tensor_model_parallel_allreduce``,
on by default) starts the collective of its input's gradient (an all-reduce over the tensor
ranks, a reduce-scatter with sequence parallelism) and then computes the weight gradient while
it runs; with sequence parallelism it starts the all-gather of its input (needed for the weight
gradient) and computes the input gradient while that runs. Each such call is on the critical path
only for what outlasts the product it runs during:

    exposed = max(0, seconds of one call − seconds of the product)

per call, the product the one of the same shape as the column-parallel forward (the weight- and
input-gradient products have its FLOPs and operand sizes): per layer, QKV and the MLP's
up-projection (one call behind each), and the vocabulary-parallel output layer. The calls of the
recomputed forward and the row-parallel gradients' all-gathers stay exposed. The 2021 code
(``tensor_backward = exposed``, the default) ran these collectives after the products.
"""

from __future__ import annotations

import sympy

from .. import ir
from . import kernels
from .extrema import extremum
from .symbolic import symbol, to_sympy

ZERO = sympy.Integer(0)


def products(pc, hwr: ir.Hardware, mode: str) -> dict[str, tuple[sympy.Expr, ...]]:
    """Seconds of the column-parallel products of one microbatch on one device that the
    asynchronous backward's calls run during: ``layer`` (QKV, the MLP's up-projection; a MoE
    layer's local experts' up-projections) and ``head`` (the output layer)."""
    plan, sh, lay = pc.plan, pc.shape, pc.layout
    t = plan.model.transformer
    h, tp = sh.h, lay.t
    T = sh.b * sh.s / lay.c
    w_in, _, _ = kernels.attention_dims(t, h, sh.a)
    up = 2 if t.gated_mlp else 1
    shapes = [(T, w_in / (h * tp), h, 1)]
    if to_sympy(t.experts) != 1:
        E, k = to_sympy(t.experts), to_sympy(t.top_k)
        ep = sympy.Mul(*(symbol(a) for a in lay.expert_axes))
        fe = to_sympy(t.expert_ffn) if t.expert_ffn is not None else sh.f
        shapes.append((T * k * ep / E, up * fe / tp, h, E / ep))
    else:
        shapes.append((T, up * sh.f / tp, h, 1))
    shapes.append((T, sh.V / tp, h, 1))
    if mode == "kernels":
        dev = kernels.Device(to_sympy(hwr.flops), to_sympy(hwr.hbm), hwr.efficiency, sh.bytes[ir.State.ACTIVATIONS])
        secs = [kernels.gemm(dev, m, n, kk, b) for m, n, kk, b in shapes]
    else:
        rate = to_sympy(hwr.flops) * to_sympy(hwr.mfu)
        secs = [2 * m * n * kk * b / rate for m, n, kk, b in shapes]
    return {"layer": (secs[0], secs[1]), "head": (secs[2],)}


def exposed(seconds: sympy.Expr, count: sympy.Expr, behind_count: sympy.Expr,
            during: tuple[sympy.Expr, ...]) -> sympy.Expr:
    """The seconds of ``count`` calls (``seconds`` in all) left on the critical path when
    ``behind_count`` of them run during each product of ``during``."""
    one = seconds / count
    hidden = len(during) * behind_count
    return seconds - hidden * one + behind_count * sum((extremum(sympy.Max, ZERO, one - g) for g in during), ZERO)
