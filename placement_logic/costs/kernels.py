"""Compute time per operation (``conventions { compute_time = kernels }``, the default where the
device has HBM bandwidth and efficiency tables): exact closed forms, like the FLOPs.

Every matrix product of a layer is timed from its shape on one device (m tokens × k inputs ×
n outputs after the tensor, sequence and context splits): its roofline time, the larger of
FLOPs / peak and bytes moved / HBM bandwidth (bytes = its two operands and its result),
divided by the fraction of the roofline the device reaches at that size (the device's
``Efficiency.gemm`` table, by the product's FLOPs). The memory-bound kernels (norms, the
dropouts and residual adds, the activation function, the eager softmax, the loss, the
optimizer step) take bytes moved / (HBM bandwidth × ``Efficiency.memory`` at that many
bytes). A fused attention kernel (``flash_attention``) takes its FLOPs (halved with causal
masking) / (peak × ``Efficiency.flash``); eager attention is two batched products over the
whole s × s scores plus the softmax and its dropout over them.

Per layer and microbatch, forward (T = b·s/c tokens on the device, t the tensor size, X =
T·h/t with sequence parallelism else T·h, e the bytes of an activation):
  products    Q, K, V projections (T × h × W_in/(h·t)), the output projection (T × a·d_v/t × h),
              the MLP (T × h × (1 or 2)·f/t and T × f/t × h; MoE: each local expert's tokens,
              the shared experts, the router T × h × E), the core (b·a/t batches of
              s/c × d × s and s/c × s × d) when eager
  memory      two norms 4·X·e, two bias-dropout-adds 2·(3e + 1)·X, the activation function
              (2e, gated 3e) per MLP element, the eager softmax and its dropout (4e + 1) per score
Backward is twice the forward (each product's two gradient products have its shape's FLOPs;
the memory-bound kernels read and write twice as much). Recompute adds a forward of the
layer (full) or of the attention core (selective). The last stage adds the output layer
(T × h × V/t) and its cross entropy ((2e + 8)·T·V/t bytes forward, fp32 logits). The
optimizer step moves its states, the parameters and the gradients in and out once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy

from .. import ir
from . import eager
from .extrema import extremum
from .symbolic import at_least, to_sympy
from .window import causal_share

ZERO = sympy.Integer(0)


@dataclass(frozen=True)
class Device:
    peak: sympy.Expr  # FLOP/s
    hbm: sympy.Expr  # bytes per second
    eff: object  # hardware.Efficiency
    e: sympy.Expr  # bytes per activation element


@lru_cache(maxsize=4096)
def _tabulated(x: sympy.Expr, table) -> sympy.Expr:
    """The fraction of the first (bound, fraction) row whose bound ``x`` reaches. Kept per
    (size, table) in the process: sympy's piecewise construction (it puts each condition in
    canonical form) is most of a kernel's time, and the same sizes come back in every
    configuration of a structure and in structures alike."""
    rows = [(sympy.Rational(f), at_least(x, sympy.Rational(b))) for b, f in table[:-1]]
    rows.append((sympy.Rational(table[-1][1]), True))
    return sympy.Piecewise(*rows)


@lru_cache(maxsize=8192)
def gemm(dev: Device, m, n, k, batch=1) -> sympy.Expr:
    """Seconds of a (batched) matrix product: its roofline time over the tabulated efficiency.
    Kept per (device, sizes) in the process: the structures of a search share most products."""
    flops = 2 * m * n * k * batch
    moved = dev.e * (m * k + k * n + m * n) * batch
    # sympy's maximum, without its search for an order where the two are ordered both ways
    return extremum(sympy.Max, flops / dev.peak, moved / dev.hbm) / _tabulated(flops, dev.eff.gemm)


@lru_cache(maxsize=8192)
def memory_bound(dev: Device, moved) -> sympy.Expr:
    """Seconds of a kernel that moves ``moved`` bytes through HBM (kept per (device, bytes), as ``gemm``)."""
    return moved / (dev.hbm * _tabulated(moved, dev.eff.memory))


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer on one microbatch, forward, split into what recompute repeats."""

    core: sympy.Expr  # the attention core (selective recompute repeats it)
    rest: sympy.Expr  # everything else in the layer

    @property
    def forward(self) -> sympy.Expr:
        return self.core + self.rest


def attention_dims(t: ir.TransformerShape, h, a):
    """(W_in: the weights of the input projections, d_qk, d_v)."""
    if t.mla:
        nope, rope, vd = (to_sympy(x) for x in (t.qk_nope_dim, t.qk_rope_dim, t.v_head_dim))
        kvr = to_sympy(t.kv_lora_rank)
        qk = nope + rope
        if t.q_lora_rank is not None:
            r = to_sympy(t.q_lora_rank)
            q = h * r + r * a * qk
        else:
            q = h * a * qk
        return q + h * (kvr + rope) + kvr * a * (nope + vd), qk, vd
    dh = to_sympy(t.head_dim) if t.head_dim is not None else h / a
    kv = to_sympy(t.kv_heads)
    return h * a * dh + 2 * h * kv * dh, dh, dh


def layer_time(dev: Device, t: ir.TransformerShape, sh, lay, causal: bool, moe: bool, ep, window=None) -> LayerTime:
    """One layer (a MoE layer when ``moe``), one microbatch, forward, on one device; a fused kernel's causal share
    of the scores under the model's sliding window ``window`` (costs.window)."""
    h, a = sh.h, sh.a
    tp, c, e = lay.t, lay.c, dev.e
    T = sh.b * sh.s / c
    w_in, d_qk, d_v = attention_dims(t, h, a)
    proj = gemm(dev, T, w_in / (h * tp), h) + gemm(dev, T, h, a * d_v / tp)
    heads = sh.b * a / tp
    if lay.flash or eager.fused_attention(sh, lay):
        core_flops = heads * (sh.s / c) * sh.s * 2 * (d_qk + d_v)
        core = (core_flops * causal_share(sh.s, window) if causal else core_flops) / (dev.peak * dev.eff.flash)
    else:
        scores = heads * (sh.s / c) * sh.s
        core = gemm(dev, sh.s / c, sh.s, d_qk, heads) + gemm(dev, sh.s / c, d_v, sh.s, heads) \
            + memory_bound(dev, (4 * e + 1) * scores)
    up = 2 if t.gated_mlp else 1
    act = 3 * e if t.gated_mlp else 2 * e
    if moe:
        E, k = to_sympy(t.experts), to_sympy(t.top_k)
        fe = to_sympy(t.expert_ffn) if t.expert_ffn is not None else sh.f
        local = E / ep
        tokens = T * k * ep / E  # each local expert's tokens, the routing balanced
        mlp = gemm(dev, tokens, up * fe / tp, h, local) + gemm(dev, tokens, h, fe / tp, local) \
            + gemm(dev, T, E, h) + memory_bound(dev, act * T * k * fe / tp)
        if t.shared_experts is not None and to_sympy(t.shared_experts) != 0:
            fs = to_sympy(t.shared_experts) * (to_sympy(t.shared_expert_ffn) if t.shared_expert_ffn is not None
                                               else fe)
            mlp += gemm(dev, T, up * fs / tp, h) + gemm(dev, T, h, fs / tp) + memory_bound(dev, act * T * fs / tp)
    else:
        mlp = gemm(dev, T, up * sh.f / tp, h) + gemm(dev, T, h, sh.f / tp) + memory_bound(dev, act * T * sh.f / tp)
    X = T * h / tp if lay.sp else T * h
    elementwise = 2 * memory_bound(dev, 2 * X * e) + 2 * memory_bound(dev, (3 * e + 1) * X)
    return LayerTime(core, proj + mlp + elementwise)


def head_time(dev: Device, sh, lay) -> sympy.Expr:
    """The output layer and the loss on one microbatch, forward."""
    T = sh.b * sh.s / lay.c
    return gemm(dev, T, sh.V / lay.t, sh.h) + memory_bound(dev, (2 * dev.e + 8) * T * sh.V / lay.t)


def optimizer_time(dev: Device, state_bytes, eager_bytes=None) -> sympy.Expr:
    """The optimizer step: its states, the parameters and the gradients read and written once (a fused
    step), or under an eager count the bytes eager PyTorch's foreach step moves (``eager.optimizer_bytes``)."""
    return memory_bound(dev, eager_bytes if eager_bytes is not None else 2 * state_bytes)
