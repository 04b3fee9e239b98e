"""Model sizes as exact sympy expressions: Ψ, per-layer counts, byte widths.

Input: an ``ir.Model`` (and the plan's mesh for axis-size symbols). Output: a ``Shape``
holding sympy expressions for Ψ (given, or counted exactly from an ``ir.TransformerShape``),
the parameters of one layer, the parameter groups with the stages that hold them (embedding,
output projection, final norm, ...), the byte widths of the states, and the activation
dimensions (s, b, h, a, kv_heads, L, V, experts, top_k, capacity factor). Quantities the
spec does not give stay free symbols (``h``, ``L``, ...) and are listed in ``missing``.

Parameters are counted per group (``ir.groups``: embedding, attention, kv, mlp or experts,
router, biases, norms, final norm, head, and the user's own), and every division over
mesh axes is done group by group (``Split``): a tensor axis splits what is split by heads or
columns, keeps norms, row-parallel biases and the MoE router whole on every rank, and splits
K/V over at most kv_heads ranks; an expert axis divides only the experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import sympy

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import groups as pg
from .extrema import extremum
from .symbolic import peak, symbol, to_sympy

FIRST, LAST = "first", "last"  # the pipeline stages the engine accounts for (report words, not groups.Stage)


@dataclass(frozen=True)
class SizedGroup:
    """One parameter group with its exact count (sympy) and its division rules."""

    group: pg.ParamGroup
    count: sympy.Expr  # parameters in the whole model (a copy's count for the tied head)
    per_layer: sympy.Expr | None  # parameters in one layer, for groups inside the layers

    @property
    def name(self) -> str:
        return self.group.name


@dataclass(frozen=True)
class Split:
    """What a mesh axis does to each group: the expert and tensor axes of the plan, the sizes
    known as numbers (to decide how K/V heads split), and the group's own modes."""

    expert_axes: tuple[str, ...] = ()
    tensor_axes: tuple[str, ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()
    # the axes given to ``share`` are those a state is divided over: an expert axis then divides
    # the other groups too (their data-parallel replicas there, e.g. the distributed optimizer)
    dense_data: bool = False

    def share(self, g: SizedGroup, axes, kv: sympy.Expr) -> sympy.Expr:
        """The fraction of group ``g`` one device holds once divided over ``axes``."""
        return _share(self, g, tuple(axes), kv)

    def _share(self, g: SizedGroup, axes: tuple[str, ...], kv: sympy.Expr) -> sympy.Expr:
        f = sympy.Integer(1)
        tensor = []
        own = {a: r.value for a, r in g.group.roles}  # parallel folding: the group's own roles
        for a in axes:
            n = symbol(a)
            if a in own:
                if own[a] == "tensor":
                    tensor.append(a)
                else:
                    f = f / n
            elif a in self.expert_axes:
                if g.group.expert or self.dense_data:
                    f = f / n
            elif a in self.tensor_axes:
                tensor.append(a)
            else:
                f = f / n
        if tensor and g.group.tensor != pg.WHOLE:
            t = sympy.Mul(*(symbol(a) for a in tensor))
            if g.group.tensor == pg.HEADS:
                known = dict(self.sizes)
                if all(a in known for a in tensor) and kv.is_number:
                    size = 1
                    for a in tensor:
                        size *= known[a]
                    t = t if kv >= size else kv  # fewer kv heads than ranks: each rank keeps one head
                elif not kv.is_number or kv != 1:
                    t = extremum(sympy.Min, t, kv)  # sympy's minimum, without its search for an order
                else:
                    t = sympy.Integer(1)
            f = f / t
        return f


@lru_cache(maxsize=4096)
def _share(split: Split, g: SizedGroup, axes: tuple[str, ...], kv: sympy.Expr) -> sympy.Expr:
    """``Split.share``, kept per (split, group, axes, kv heads) in the process: a search's
    structures ask for a few dozen distinct shares thousands of times."""
    return split._share(g, axes, kv)


@dataclass(frozen=True)
class Shape:
    """The model's sizes as sympy expressions: parameters, bytes per element and the transformer shape."""

    psi: sympy.Expr
    layer_params: sympy.Expr | None  # parameters of one transformer layer (None: no shape)
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
    tied: bool = False  # the output projection shares the embedding weight
    groups: tuple[SizedGroup, ...] = ()  # the parameter groups (ir.groups), counted
    f: sympy.Expr = sympy.Integer(0)  # MLP width
    fe: sympy.Expr | None = None  # one routed expert's width (None: f)
    f_shared: sympy.Expr = sympy.Integer(0)  # the shared experts' widths together (count × width)
    gated: bool = False  # gated (SwiGLU-style) MLP
    logits_bytes: sympy.Expr = sympy.Integer(4)  # bytes per element of the logits kept for the loss
    activation_count: str = "shape"  # the per-layer activation count: shape | korthikanti | megatron | llm_analysis | pytorch_eager | pytorch_eager_cuda
    norm: str = "layernorm"  # the norms' kind (the pytorch_eager count keeps what each saves)
    shared_gate: bool = False  # a sigmoid gate on the shared experts' output
    allowance: sympy.Expr = sympy.Integer(1)  # activations multiplied by this (an estimator's allowance)



def transformer_params(t: ir.TransformerShape) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """(Ψ, parameters per layer, expert parameters) counted exactly from a transformer shape:
    the sums of its parameter groups (``ir.groups.transformer_groups``; docs/costs.md)."""
    groups = pg.transformer_groups(t)
    psi = sympy.expand(sum((to_sympy(g.count) for g in groups if not g.copy), sympy.Integer(0)))
    layer = sympy.expand(sum((to_sympy(g.per_layer) for g in groups if g.per_layer is not None), sympy.Integer(0)))
    experts = sympy.expand(sum((to_sympy(g.count) for g in groups if g.expert), sympy.Integer(0)))
    return psi, layer, experts


@lru_cache(maxsize=256)
def shape_of(model: ir.Model) -> Shape:
    """The sizes a model's derivation reads (pure; kept per model in the process: a search's
    structures each load the same model block, equal models)."""
    missing: list[str] = []

    def get(v: ir.Value | None, name: str) -> sympy.Expr:
        if v is None:
            missing.append(name)
            return symbol(name)
        return to_sympy(v)

    t = model.transformer
    zero = sympy.Integer(0)
    if t is not None:
        psi_t, layer, _ = transformer_params(t)
        user = [g for g in pg.param_groups(model) if g.user and g.count is not None]
        psi_t = psi_t + sum((to_sympy(g.count) for g in user), sympy.Integer(0))
        psi = to_sympy(model.params) if model.params is not None else psi_t
        h, a, kv, L, V = (to_sympy(x) for x in (t.hidden, t.heads, t.kv_heads, t.layers, pg.padded_vocab(t)))
        E, k, cf = to_sympy(t.experts), to_sympy(t.top_k), to_sympy(t.capacity_factor)
    else:
        psi = get(model.params, "psi")
        layer = None
        h, a, kv, L, V = (symbol(n) for n in ("h", "a", "a", "L", "V"))
        E = k = cf = sympy.Integer(1)
    s = get(model.seq, "s")
    b = get(model.microbatch, "b")
    sized = [SizedGroup(g, to_sympy(g.count), to_sympy(g.per_layer) if g.per_layer is not None else None)
             for g in pg.param_groups(model) if g.count is not None]
    if t is not None:
        rest = sympy.expand(psi - psi_t)
        if rest.is_number and rest < 0:
            where = getattr(model.params, "span", None) or model.span
            raise DiagnosticError([Diagnostic(
                Code.PARAMS_BELOW_SHAPE, f"params = {psi} is below the {psi_t} parameters the transformer shape counts: give at "
                "least that (the rest is what the shape does not describe) or leave params out", where)])
        if rest != 0:
            # Ψ given beside the shape: what the shape does not count is a group of its own (``rest``),
            # placed as the plan places the parameters and spread evenly over the pipeline stages, but
            # part of no layer: a gathered layer, a bucket or a recomputed layer does not hold it
            sized.append(SizedGroup(pg.ParamGroup("rest", None), rest, None))
        layer = sympy.expand(sum((g.per_layer for g in sized if g.per_layer is not None), zero))
    return Shape(
        psi=psi,
        layer_params=layer,
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
        tied=bool(t is not None and t.tied_embeddings),
        groups=tuple(sized),
        f=to_sympy(t.ffn) if t is not None else 4 * h,
        fe=to_sympy(t.expert_ffn) if t is not None and t.expert_ffn is not None else None,
        f_shared=_shared_width(t),
        gated=bool(t is not None and t.gated_mlp),
        activation_count=model.activation_count,
        norm=t.norm if t is not None else "layernorm",
        shared_gate=bool(t is not None and t.shared_expert_gate and t.shared_experts is not None
                         and not pg.is_zero(t.shared_experts)),
        logits_bytes=to_sympy(model.bytes_logits),
        allowance=to_sympy(model.activation_allowance),
    )


def _shared_width(t: ir.TransformerShape | None) -> sympy.Expr:
    """The shared experts' widths together: count × (shared_expert_ffn, else expert_ffn, else ffn)."""
    if t is None or t.shared_experts is None or pg.is_zero(t.shared_experts):
        return sympy.Integer(0)
    width = next(w for w in (t.shared_expert_ffn, t.expert_ffn, t.ffn) if w is not None)
    return to_sympy(t.shared_experts) * to_sympy(width)


def divided(sh: Shape, axes, split: Split | None = None, axes_of=None, experts_only=None) -> sympy.Expr:
    """Parameters per device once divided over ``axes`` (or, per group, ``axes_of(group)``),
    group by group; copies outside Ψ are not counted. ``experts_only`` keeps only the expert
    groups (True) or only the others (False)."""
    return sum(per_group(sh, axes, split, axes_of=axes_of, experts_only=experts_only).values(), sympy.Integer(0))


def per_group(sh: Shape, axes, split: Split | None = None, stage: str | None = None, p: sympy.Expr | None = None,
              axes_of=None, experts_only=None) -> dict[str, sympy.Expr]:
    """Group name -> parameters per device of that group. With ``stage`` (FIRST or LAST of p
    stages) the group's layers are divided by p and the first stage adds the groups placed
    there (the token embedding), the last its own (final norm, output head, a copy when
    tied); one stage (p the number 1) holds both ends and no copy. Without, the whole model
    is divided over ``axes`` (copies left out)."""
    split = split or Split()
    p = sympy.Integer(1) if p is None else p
    out: dict[str, sympy.Expr] = {}
    for g in sh.groups:
        if experts_only is not None and g.group.expert != experts_only:
            continue
        where = g.group.where
        if stage is None or (g.group.copy and p == 1):  # one stage holds no copy of its own embedding
            if g.group.copy:
                continue
            n = g.count
        elif where == pg.LAYERS and g.group.layers is not None and g.per_layer is not None:
            n = g.per_layer * layers_on(sh, g.group.layers, stage, p)
        elif where == pg.LAYERS:
            n = g.count / p
        elif where == stage:
            n = g.count
        elif where in (FIRST, LAST) and not g.group.copy and p == 1:
            n = g.count  # one stage is both the first and the last
        else:
            continue
        a = axes_of(g) if axes_of is not None else axes
        out[g.name] = n * split.share(g, a, sh.kv)
    return out


def stage_divided(sh: Shape, stage: str, p: sympy.Expr, axes, split: Split | None = None, axes_of=None) -> sympy.Expr:
    """Parameters per device of one pipeline stage (of p), then divided over ``axes``.

    Every stage holds L/p layers; the first adds the token embedding, the last the final
    norm and the output projection (a copy of the embedding when tied, as Megatron-LM keeps).
    """
    return sum(per_group(sh, axes, split, stage=stage, p=p, axes_of=axes_of).values(), sympy.Integer(0))


def layers_on(sh: Shape, rng: pg.LayerRange, stage: str, p: sympy.Expr) -> sympy.Expr:
    """How many of the layers a ranged group lives in (the first k, or the rest; or the dense or
    the MoE layers of a periodic pattern) the first or the last of p stages holds (each holds
    L/p consecutive layers)."""
    per = sh.L / p
    if rng.pattern is not None:  # a periodic pattern: count the MoE layers below a bound
        d, every, offset = rng.pattern
        first = d + (offset - d) % every  # the first MoE layer

        def moe_below(n: sympy.Expr) -> sympy.Expr:
            return sympy.Max(0, sympy.ceiling((n - first) / every))

        moe = moe_below(per) if stage == FIRST else moe_below(sh.L) - moe_below(sh.L - per)
        return moe if rng.moe else per - moe
    k = to_sympy(rng.k)
    first_k = sympy.Min(k, per) if stage == FIRST else sympy.Max(0, k - (sh.L - per))
    return per - first_k if rng.moe else first_k


def layer_divided(sh: Shape, axes, split: Split | None = None) -> sympy.Expr | None:
    """Parameters of one transformer layer per device once divided over ``axes`` (None: no
    shape); with dense first layers and MoE layers, the larger of the two kinds."""
    if sh.layer_params is None:
        return None
    split = split or Split()
    if any(g.group.layers is not None for g in sh.groups):
        kinds = []
        for moe in (False, True):  # the dense layers, the MoE layers
            kinds.append(sum((g.per_layer * split.share(g, axes, sh.kv) for g in sh.groups
                              if g.per_layer is not None and (g.group.layers is None or g.group.layers.moe == moe)),
                             sympy.Integer(0)))
        return peak(*kinds)
    return sum((g.per_layer * split.share(g, axes, sh.kv) for g in sh.groups if g.per_layer is not None),
               sympy.Integer(0))
