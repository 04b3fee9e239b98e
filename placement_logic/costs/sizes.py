"""Model sizes as exact sympy expressions: Ψ, per-layer counts, byte widths.

Input: an ``ir.Model`` (and the plan's mesh for axis-size symbols). Output: a ``Shape``
holding sympy expressions for Ψ (given, or counted exactly from an ``ir.TransformerShape``),
the parameters of one layer, those outside the layers (embedding, output projection, final
norm: which pipeline stage holds them), the byte widths of the four states, and the activation
dimensions (s, b, h, a, kv_heads, L, V, experts, top_k, capacity factor). Quantities the
spec does not give stay free symbols (``h``, ``L``, ...) and are listed in ``missing``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from .. import ir
from .symbolic import symbol, to_sympy

FIRST, LAST = "first", "last"  # the pipeline stages the engine accounts for


@dataclass(frozen=True)
class Shape:
    psi: sympy.Expr
    layer_params: sympy.Expr | None  # parameters of one transformer layer (None: no shape)
    expert_params: sympy.Expr  # parameters inside MoE experts (0 for a dense model)
    bytes: dict  # state name -> bytes per element
    s: sympy.Expr
    b: sympy.Expr
    h: sympy.Expr
    a: sympy.Expr
    kv: sympy.Expr
    L: sympy.Expr
    V: sympy.Expr
    m: sympy.Expr
    experts: sympy.Expr
    top_k: sympy.Expr
    capacity: sympy.Expr
    has_shape: bool
    has_sequence: bool
    missing: tuple[str, ...] = field(default=())
    embedding_params: sympy.Expr = sympy.Integer(0)  # token embedding V·h (first stage)
    head_params: sympy.Expr = sympy.Integer(0)  # output projection V·h (last stage; a copy when tied)
    final_norm_params: sympy.Expr = sympy.Integer(0)  # final norm (last stage)
    tied: bool = False  # the output projection shares the embedding weight

    @property
    def layers_params(self) -> sympy.Expr:
        """Parameters inside the transformer layers: Ψ less the embedding, untied head and final norm."""
        head = 0 if self.tied else self.head_params
        return self.psi - self.embedding_params - head - self.final_norm_params


def transformer_params(t: ir.TransformerShape) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """(Ψ, parameters per layer, expert parameters) counted exactly from a transformer shape.

    Per layer: attention q and o projections h·h each, k and v h·(kv·h/a) each; MLP 3·h·f
    (gated) or 2·h·f, times the expert count, plus an h·E router for MoE; two norms
    (2h each for layernorm, h for rmsnorm); biases when ``bias``. Outside the layers: token
    embedding V·h, an untied output projection V·h, and a final norm. No learned position
    embeddings (rotary or ALiBi are parameter-free).
    """
    h, L, a, kv, f, V = (to_sympy(x) for x in (t.hidden, t.layers, t.heads, t.kv_heads, t.ffn, t.vocab))
    E = to_sympy(t.experts)
    d_kv = kv * h / a
    attn = 2 * h * h + 2 * h * d_kv
    mlp = (3 if t.gated_mlp else 2) * h * f
    norm = (2 * h) if t.norm == "layernorm" else h
    if t.bias:
        attn += 2 * h + 2 * d_kv
        mlp += (2 * f + h) if t.gated_mlp else (f + h)
    moe = sympy.Integer(0)
    experts = sympy.Integer(0)
    if E != 1:
        moe = h * E + (E if t.bias else 0)
        mlp = mlp * E
        experts = sympy.expand(L * mlp)
    layer = sympy.expand(attn + mlp + moe + 2 * norm)
    outside = V * h * (1 if t.tied_embeddings else 2) + norm
    return sympy.expand(L * layer + outside), layer, experts


def shape_of(model: ir.Model) -> Shape:
    missing: list[str] = []

    def get(v: ir.Value | None, name: str) -> sympy.Expr:
        if v is None:
            missing.append(name)
            return symbol(name)
        return to_sympy(v)

    t = model.transformer
    zero = sympy.Integer(0)
    emb = head = fnorm = zero
    if t is not None:
        psi_t, layer, experts = transformer_params(t)
        emb = head = to_sympy(t.vocab) * to_sympy(t.hidden)
        fnorm = to_sympy(t.hidden) * (2 if t.norm == "layernorm" else 1)
        psi = to_sympy(model.params) if model.params is not None else psi_t
        h, a, kv, L, V = (to_sympy(x) for x in (t.hidden, t.heads, t.kv_heads, t.layers, t.vocab))
        E, k, cf = to_sympy(t.experts), to_sympy(t.top_k), to_sympy(t.capacity_factor)
    else:
        psi = get(model.params, "psi")
        layer = None
        experts = sympy.Integer(0)
        h, a, kv, L, V = (symbol(n) for n in ("h", "a", "a", "L", "V"))
        E = k = cf = sympy.Integer(1)
    s = get(model.seq, "s")
    b = get(model.microbatch, "b")
    return Shape(
        psi=psi,
        layer_params=layer,
        expert_params=experts,
        bytes={
            ir.State.PARAMS: to_sympy(model.bytes_params),
            ir.State.GRADS: to_sympy(model.bytes_grads),
            ir.State.OPTIMIZER: to_sympy(model.bytes_optimizer),
            ir.State.ACTIVATIONS: to_sympy(model.bytes_activations),
        },
        s=s, b=b, h=h, a=a, kv=kv, L=L, V=V, m=to_sympy(model.microbatches),
        experts=E, top_k=k, capacity=cf,
        has_shape=t is not None,
        has_sequence=model.seq is not None and model.microbatch is not None,
        missing=tuple(missing),
        embedding_params=emb, head_params=head, final_norm_params=fnorm,
        tied=bool(t is not None and t.tied_embeddings),
    )


def divided(sh: Shape, axes, expert_axes=()) -> sympy.Expr:
    """Parameters per device once divided over ``axes``: an expert axis divides only the experts."""
    return _divide(sh.psi - sh.expert_params, sh.expert_params, axes, expert_axes)


def stage_divided(sh: Shape, stage: str, p: sympy.Expr, axes, expert_axes=()) -> sympy.Expr:
    """Parameters per device of one pipeline stage (of p), then divided over ``axes``.

    Every stage holds L/p layers; the first adds the token embedding, the last the final
    norm and the output projection (a copy of the embedding when tied, as Megatron-LM keeps).
    """
    experts = sh.expert_params / p
    dense = sh.layers_params / p - experts
    if stage == FIRST:
        dense += sh.embedding_params
    if stage == LAST:
        dense += sh.head_params + sh.final_norm_params
    return _divide(dense, experts, axes, expert_axes)


def _divide(dense: sympy.Expr, experts: sympy.Expr, axes, expert_axes) -> sympy.Expr:
    """Dense and expert parameters divided over ``axes``; an expert axis divides only the experts."""
    for a in axes:
        n = symbol(a)
        if a in expert_axes:
            experts = experts / n
        else:
            dense, experts = dense / n, experts / n
    return dense + experts
