"""The ``pytorch_eager`` activation convention: what eager PyTorch's autograd keeps.

Input: a ``Shape`` and the plan's ``Layout``. Output: the named terms of one layer's and of
the output layer's saved activations for one microbatch (bytes), each derived from the ops
eager PyTorch runs for a pre-norm transformer block (docs/costs.md, "Conventions"), with
dropout off (no masks), attention by ``scaled_dot_product_attention`` and the loss by
``cross_entropy`` on fp32 logits. Tokens of one microbatch T = (s/c)·b; the norms' region
holds T/t of them under sequence parallelism (Tw), w = ``bytes.activations``:

  norm inputs             LayerNorm 2·Tw·h·w; RMSNorm (a composite: the input upcast to fp32)
                          2·Tw·h·4
  norm statistics         LayerNorm its mean and reciprocal deviation, 2·2·Tw·w; RMSNorm its
                          fp32 reciprocal root mean square, 2·Tw·4
  normalised norm inputs  RMSNorm only: x·rstd in fp32, 2·Tw·h·4
  norm outputs            the attention's and the MLP's inputs, 2·Tw·h·w
  query, keys and values  T·h·w/t and 2·T·h·(kv/a)·w/t (SDPA saves q, k, v)
  projection input        SDPA's output, T·h·w/t (saved by SDPA and by the projection)
  attention log-sum-exp   SDPA's fp32 statistic, 4·(a/t)·T; not under selective recomputation
                          (the core is checkpointed) nor a context axis (ring attention as the
                          measure harness runs it recomputes the softmax in backward)
  mlp                     ungated: the first projection's output (GELU's input) and GELU's
                          output, 2·f·w/t; gated: the fused gate/up output 2f, SiLU(gate) f and
                          the product f, 4·f·w/t
  gathered inputs         sequence parallelism: the all-gathered inputs the column-parallel
                          linears save (DTensor), 2·T·h·w·(t-1)/t
  router, experts         mixture of experts (capacity-padded slots, T·capacity·top_k): the
                          router's softmax, top-k gates and their sum T·(E + k + 1)·w; each
                          slot's permuted input and MLP terms, its output, gate-weighted product
                          and gate weight; the shared experts' terms and gate
  layer input             full recomputation: the block input alone, T·h·w (÷t under SP)

Outside the layers (one microbatch, the last stage): the final norm's input and statistics as
above, the head's input T·h·w (÷t under SP; all-gathered under SP: + T·h·w·(t-1)/t), the fp32
logits ``bytes.logits``·T·V/t (log-softmax's output) and cross entropy's 0-d fp32 total weight
(4 bytes). No embedding dropout mask.
"""

from __future__ import annotations

import sympy

from .. import ir
from .sizes import Shape

EAGER = "pytorch_eager"
# the same count for eager PyTorch's CUDA kernels (measured on an H100 with PyTorch 2.11, docs/costs.md,
# "Conventions"): RMSNorm fused (its input and fp32 statistic), and fp32 grouped-query attention by
# SDPA's math path (the softmax probabilities, Q and the K and V expanded to every query head)
EAGER_CUDA = "pytorch_eager_cuda"
EAGER_COUNTS = (EAGER, EAGER_CUDA)


def _cuda(sh: Shape) -> bool:
    return sh.activation_count == EAGER_CUDA


def _common(sh: Shape, lay) -> tuple:
    T = sh.s / lay.c * sh.b
    Tw = T / lay.t if lay.sp else T
    return T, Tw, sh.bytes[ir.State.ACTIVATIONS]


def _norm_terms(sh: Shape, Tw, w, n) -> list[tuple[str, sympy.Expr]]:
    """``n`` norms of ``Tw`` tokens: their inputs, statistics and (RMSNorm) normalised inputs."""
    h = sh.h
    if sh.norm == "rmsnorm" and _cuda(sh):  # the fused kernel keeps its input and the fp32 statistic
        return [("norm inputs", n * Tw * h * w), ("norm statistics", n * Tw * 4)]
    if sh.norm == "rmsnorm":
        return [("norm inputs", n * Tw * h * 4), ("norm statistics", n * Tw * 4), ("normalised norm inputs", n * Tw * h * 4)]
    if _cuda(sh):  # CUDA's LayerNorm keeps its mean and reciprocal deviation in fp32
        return [("norm inputs", n * Tw * h * w), ("norm statistics", 2 * n * Tw * 4)]
    return [("norm inputs", n * Tw * h * w), ("norm statistics", 2 * n * Tw * w)]


def layer_terms(sh: Shape, lay, recompute: ir.Recompute, moe: bool | None = None) -> tuple[tuple[str, sympy.Expr], ...]:
    T, Tw, w = _common(sh, lay)
    h, a, kv, t, f = sh.h, sh.a, sh.kv, lay.t, sh.f
    if recompute is ir.Recompute.FULL:
        return (("layer input", Tw * h * w),)
    terms = _norm_terms(sh, Tw, w, 2) + [("norm outputs", 2 * Tw * h * w)]
    if _math_attention(sh, lay, recompute):
        # SDPA's math path: the probabilities (b·(a/t)·s² in fp32), the query and the keys and values
        # expanded to all a/t query heads of the rank
        terms += [("attention probabilities", T * sh.s * a / t * w), ("query", T * h * w / t),
                  ("expanded keys and values", 2 * T * h * w / t), ("projection input", T * h * w / t)]
    else:
        terms += [("query", T * h * w / t), ("keys and values", 2 * T * h * kv / a * w / t),
                  ("projection input", T * h * w / t)]
    if recompute is not ir.Recompute.SELECTIVE and lay.c == 1 and not _math_attention(sh, lay, recompute):
        terms.append(("attention log-sum-exp", 4 * a / t * T))
    if (sh.experts != 1) if moe is None else moe:
        terms += _moe_terms(sh, T, w)
    else:
        terms.append(("mlp", (4 if sh.gated else 2) * f * w / t * T))
    if lay.sp:
        terms.append(("gathered inputs", 2 * T * h * w * (t - 1) / t))
    return tuple((name, sympy.expand(x)) for name, x in terms if x != 0)


def _math_attention(sh: Shape, lay, recompute: ir.Recompute) -> bool:
    """Whether SDPA runs its math path on CUDA: fp32 activations with fewer K/V heads than query
    heads (no fused kernel takes fp32 grouped-query attention), the core not recomputed, one
    context rank."""
    return (_cuda(sh) and recompute is not ir.Recompute.SELECTIVE and lay.c == 1
            and sympy.simplify(sh.bytes[ir.State.ACTIVATIONS] - 4) == 0 and bool(sympy.simplify(sh.kv - sh.a) != 0))


def fused_attention(sh: Shape, lay) -> bool:
    """Whether eager PyTorch on CUDA runs the attention core in one fused kernel (cuDNN, flash or
    memory-efficient SDPA): every case but SDPA's math path (fp32 grouped-query attention on one
    context rank), whether or not the plan states ``flash_attention``."""
    return _cuda(sh) and not (lay.c == 1 and sympy.simplify(sh.bytes[ir.State.ACTIVATIONS] - 4) == 0
                              and bool(sympy.simplify(sh.kv - sh.a) != 0))


# fp32 accesses per updated element of torch.optim's default (foreach, not fused) step: Adam's lerp,
# mul, addcmul, sqrt, div, add and addcdiv (3 + 2 + 3 + 2 + 2 + 2 + 4), SGD with momentum's mul and two
# adds (2 + 3 + 3); by the fp32 state per parameter of each (docs/time.md, "Eager PyTorch")
FOREACH_ACCESSES = {8: 18, 4: 8}


def optimizer_bytes(sh: Shape, device: dict) -> sympy.Expr | None:
    """HBM bytes of eager PyTorch's optimizer step on one device (``device``: its bytes per state): the
    foreach passes over each updated element, and under an fp32 master copy (16-bit parameters, or 12
    optimizer bytes) the gradient cast to fp32 and the update copied back. None where the widths name no
    torch.optim algorithm (the fused model then prices the step)."""
    wp, wg, k = (sh.bytes[s] for s in (ir.State.PARAMS, ir.State.GRADS, ir.State.OPTIMIZER))
    if not all(isinstance(x, (sympy.Integer, sympy.Rational)) for x in (wp, wg, k)) or k == 0:
        return None
    master = wp == 2 or k == 12
    state = int(k) - (4 if master else 0)
    if state not in FOREACH_ACCESSES or (not master and wp != 4):
        return None
    n = device.get(ir.State.OPTIMIZER, sympy.Integer(0)) / k  # the elements this device updates
    total = FOREACH_ACCESSES[state] * 4 * n
    if master:
        total += n * (wg + 4) + n * (4 + wp)
    return total


def _moe_terms(sh: Shape, T, w) -> list[tuple[str, sympy.Expr]]:
    """A mixture-of-experts layer (no tensor axis): the router, and per capacity slot the permuted
    input (h), the expert's MLP terms, its output, the gate-weighted product (h each) and the gate
    weight (1); the shared experts' MLP terms and their sigmoid gate (its output and the output it
    scales)."""
    h, E, k = sh.h, sh.experts, sh.top_k
    fe = sh.fe if sh.fe is not None else sh.f
    per_width = 4 if sh.gated else 2
    slots = T * sh.capacity * k
    experts = slots * ((per_width * fe + h) + 2 * h + 1) * w + T * per_width * sh.f_shared * w
    if sh.shared_gate:
        experts += T * (h + 1) * w
    return [("router", T * (E + k + 1) * w), ("experts", experts)]


def outside_terms(sh: Shape, lay) -> tuple[tuple[str, sympy.Expr], ...]:
    T, Tw, w = _common(sh, lay)
    h, t = sh.h, lay.t
    norm = dict(_norm_terms(sh, Tw, w, 1))
    stats = norm["norm statistics"] + norm.get("normalised norm inputs", 0)
    terms = [("output-layer inputs", norm["norm inputs"] + Tw * h * w), ("final norm statistics", stats),
             ("logits", sh.logits_bytes * T * sh.V / t), ("loss total weight", sympy.Integer(4))]
    if lay.sp:
        terms.append(("gathered head input", T * h * w * (t - 1) / t))
    return tuple((name, sympy.expand(x)) for name, x in terms if x != 0)
