"""Scale a spec's model down to a transformer small enough to train on a few CPU processes.

Input: an ``ir.Plan`` (its model, whose values may name ``let`` symbols) and the mesh
axis sizes chosen for the run. Output: a ``TinyShape`` — exact integers for every
dimension of the tiny transformer — and its exact parameter count. The rules are
documented in docs/validation.md ("How the model is scaled down"); this module knows
nothing of torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import lcm
from typing import Mapping

from .. import ir
from ..ir.walker import ARITHMETIC, Target, evaluate

# The tiny transformer's fixed dimensions (before divisibility adjustments).
TINY_HIDDEN_PER_HEAD = 8
TINY_LAYERS = 2
TINY_SEQ = 8
TINY_MICROBATCH = 2
TINY_VOCAB_BASE = 64


class ShapeError(Exception):
    """A model value that cannot be read as a number (a free symbol, a query)."""


def _shape_div(node: ir.Op, args: list[Fraction]) -> Fraction:
    if args[1] == 0:
        raise ShapeError("division by zero")
    return args[0] / args[1]


def _shape_pow(node: ir.Op, args: list[Fraction]) -> Fraction:
    if args[1].denominator != 1:
        raise ShapeError("non-integer exponent")
    return args[0] ** int(args[1])


SHAPE_OPS = {**ARITHMETIC, "/": _shape_div, "^": _shape_pow}


def _shape_unknown(node: ir.Op) -> Fraction:
    raise ShapeError(f"unknown operator {node.op}")


def _shape_query(node) -> Fraction:
    raise ShapeError("a cost query cannot size the model")


def value_of(value: ir.Value, bindings: Mapping[str, ir.Value]) -> Fraction:
    """Exact value of an IR expression, resolving symbols through ``bindings`` (the IR walker
    with exact arithmetic; a symbol's own binding is read without it, so cycles stop)."""

    def sym(name: str) -> Fraction:
        if name not in bindings:
            raise ShapeError(f"'{name}' has no numeric value")
        return value_of(bindings[name], {k: v for k, v in bindings.items() if k != name})

    return evaluate(value, Target(const=Fraction, sym=sym, ops=SHAPE_OPS, query=_shape_query,
                                  unknown=_shape_unknown, other=_shape_query))


@dataclass(frozen=True)
class TinyShape:
    """Every dimension of the tiny transformer, as exact integers.

    ``groups`` is the number of contiguous column groups the fused projections are laid
    out in (the tensor-parallel size, 1 without one): the fused q/k/v projection holds
    whole key/value groups per column block and a gated MLP interleaves gate and up by
    block, so a contiguous column shard of either is a self-contained slice.
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    microbatch: int
    tied_embeddings: bool = False
    gated_mlp: bool = False
    norm: str = "layernorm"
    bias: bool = True
    qkv_bias: bool | None = None  # biases on q, k, v only (Qwen2); None: the same as ``bias``
    groups: int = 1
    microbatches: int = 1  # per step (a pipeline splits its batch into these)
    # mixture of experts (experts > 1): every block's MLP is E routed experts of width expert_ffn,
    # top_k of them per token, each taking at most capacity_factor·tokens·top_k/E tokens of a
    # microbatch; optional always-active shared experts (with a sigmoid gate) and a router bias
    experts: int = 1
    top_k: int = 1
    capacity_factor: Fraction = Fraction(1)
    expert_ffn: int = 0
    shared_experts: int = 0
    shared_expert_ffn: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False

    @property
    def moe(self) -> bool:
        return self.experts > 1

    def expert_params(self) -> int:
        """One routed expert: its MLP of width expert_ffn with column biases, and its row bias."""
        return self._mlp(self.expert_ffn) + (self.hidden if self.bias else 0)

    def _mlp(self, width: int) -> int:
        mats = 3 if self.gated_mlp else 2
        return mats * self.hidden * width + ((2 * width if self.gated_mlp else width) if self.bias else 0)

    def moe_params(self) -> int:
        """A block's MoE part: routed experts, shared experts, the router (and the shared experts' gate)."""
        h, E = self.hidden, self.experts
        router = h * E + (E if self.bias or self.router_bias else 0) + (h if self.shared_expert_gate else 0)
        return E * self.expert_params() + self.shared_experts * self._mlp(self.shared_expert_ffn) + router

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def block_params(self) -> int:
        """Parameters of one transformer block (see ``measure.model``)."""
        h, f = self.hidden, self.ffn
        norm = 2 * h if self.norm == "layernorm" else h
        b = 1 if self.bias else 0
        mlp_in = 2 * f if self.gated_mlp else f
        attention = 2 * norm + h * self.qkv_out + (self.qkv_out if self.has_qkv_bias else 0) + h * h + b * h
        if self.moe:
            return attention + self.moe_params()
        return attention + h * mlp_in + b * mlp_in + f * h + b * h

    def final_params(self) -> int:
        """The final norm and the untied output head."""
        norm = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        return norm + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def param_count(self) -> int:
        """Exact number of parameters of the tiny model (see ``measure.model``)."""
        return self.vocab * self.hidden + self.layers * self.block_params() + self.final_params()

    def stage_param_count(self, rank: int, stages: int, chunks: int = 1) -> int:
        """Parameters held by pipeline rank ``rank``: its ``chunks`` model chunks (virtual stages
        rank, rank + stages, ...), each L/(stages·chunks) blocks, the embedding with virtual
        stage 0 and the final norm and head with the last one (with tied embeddings and more than one
        stage, the last one's head is its own copy of the embedding, as in Megatron-LM)."""
        virtual = stages * chunks
        per = self.layers // virtual
        total = 0
        for c in range(chunks):
            v = rank + c * stages
            total += per * self.block_params()
            total += self.vocab * self.hidden if v == 0 else 0
            total += self.final_params() if v == virtual - 1 else 0
            # tied embeddings across stages: the last stage holds its own copy as the output layer
            total += self.vocab * self.hidden if self.tied_embeddings and virtual > 1 and v == virtual - 1 else 0
        return total

    def as_dict(self) -> dict:
        """Every dimension (the mixture-of-experts ones only for a mixture of experts)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if self.moe or k not in MOE_FIELDS}
        if "capacity_factor" in out:
            out["capacity_factor"] = str(out["capacity_factor"])
        return out


MOE_FIELDS = ("experts", "top_k", "capacity_factor", "expert_ffn", "shared_experts", "shared_expert_ffn",
              "shared_expert_gate", "router_bias")


def _ratio(model_t: ir.TransformerShape | None, bindings, a: str, b: str, default: Fraction) -> Fraction:
    if model_t is None:
        return default
    try:
        return value_of(getattr(model_t, a), bindings) / value_of(getattr(model_t, b), bindings)
    except (ShapeError, ZeroDivisionError):
        return default


def scale_down(plan: ir.Plan, bindings: Mapping[str, ir.Value], sizes: Mapping[str, int], tensor_axis: str | None,
               stages: int = 1, chunks: int = 1, expert_axis: str | None = None) -> TinyShape:
    """The tiny shape for ``plan`` run with mesh axis ``sizes``.

    Structure (gated MLP, norm kind, biases, q/k/v-only biases, tied embeddings, the kv-heads/heads and
    ffn/hidden ratios) is kept; sizes are replaced: 2 layers, 8 values per head, a
    sequence of 8, a microbatch of 2, 64-token vocabulary; every dimension that a
    sharded state splits along is rounded up to a multiple of the device count. A
    pipeline of ``stages`` ranks with ``chunks`` model chunks each gets one layer per
    chunk (at least 2 layers) and 2 microbatches per stage.
    """
    world = 1
    for n in sizes.values():
        world *= n
    t = sizes.get(tensor_axis, 1) if tensor_axis else 1
    tf = plan.model.transformer
    kv_ratio = _ratio(tf, bindings, "kv_heads", "heads", Fraction(1))
    ffn_ratio = _ratio(tf, bindings, "ffn", "hidden", Fraction(4))
    # kv heads: a multiple of t; heads = kv * (heads/kv) rounded to keep the group size.
    group = max(1, round(1 / kv_ratio)) if kv_ratio > 0 else 1
    kv = max(t, 2 if group == 1 else 1)
    kv = lcm(kv, t)
    heads = kv * group
    # hidden must split evenly over every device (dim-0 shards of norms and biases).
    hidden = heads * TINY_HIDDEN_PER_HEAD
    hidden = lcm(hidden, world)
    head_dim = hidden // heads
    hidden = heads * head_dim
    ffn = max(1, round(hidden * ffn_ratio))
    ffn = -(-ffn // lcm(world, t)) * lcm(world, t)
    vocab = lcm(TINY_VOCAB_BASE, world)
    moe: dict = {}
    try:
        experts = int(value_of(tf.experts, bindings)) if tf else 1
    except ShapeError:
        experts = 1
    if experts > 1:
        # top_k kept; E = top_k times the expert-parallel size (whole experts per rank), at least
        # 2·top_k so that routing chooses; widths keep their ratio to the hidden size
        top_k = int(value_of(tf.top_k, bindings))
        ep = sizes.get(expert_axis, 1) if expert_axis else 1
        e_tiny = top_k * lcm(ep, 2)

        def width(v, default: int) -> int:
            if v is None:
                return default
            w = max(1, round(hidden * value_of(v, bindings) / value_of(tf.hidden, bindings)))
            return -(-w // world) * world

        fe = width(tf.expert_ffn, ffn)
        shared = int(value_of(tf.shared_experts, bindings)) if tf.shared_experts is not None else 0
        moe = dict(experts=e_tiny, top_k=top_k, capacity_factor=value_of(tf.capacity_factor, bindings),
                   expert_ffn=fe, shared_experts=shared, shared_expert_ffn=width(tf.shared_expert_ffn, fe),
                   shared_expert_gate=bool(tf.shared_expert_gate), router_bias=bool(tf.router_bias))
    return TinyShape(
        hidden=hidden,
        layers=max(TINY_LAYERS, stages * chunks),
        heads=heads,
        kv_heads=kv,
        ffn=ffn,
        vocab=vocab,
        seq=lcm(TINY_SEQ, t),
        microbatch=TINY_MICROBATCH,
        tied_embeddings=bool(tf.tied_embeddings) if tf else False,
        gated_mlp=bool(tf.gated_mlp) if tf else False,
        norm=tf.norm if tf else "layernorm",
        bias=bool(tf.bias) if tf else True,
        qkv_bias=tf.qkv_bias if tf else None,
        groups=t,
        microbatches=2 * stages if stages > 1 else 2,
        **moe,
    )
