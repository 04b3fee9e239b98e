"""Parameter groups: the one model of a plan's parameters that costs and the checker share.

Input: an ``ir.Model`` (its transformer shape and its ``group`` declarations). Output: the
``ParamGroup``s of the model, each with its exact parameter count (an IR value), where the
pipeline puts it, how a tensor axis holds it, whether an expert axis divides it, the
gradient class the checker reasons with, and the modes that replace the plan's placement
for it. Nothing here imports sympy or z3: counts are IR values the cost engine turns into
sympy and the checker never needs.

The built-in groups of a transformer (docs/costs.md, "Parameter groups"):

| group | count | stages | tensor axis | checker class |
|---|---|---|---|---|
| embedding | V·h | first | split (vocabulary-parallel) | embedding |
| attention | L·(2h·h + q bias h) | layers | split (heads) | dense |
| kv | L·2·h·d_kv (+ 2·d_kv bias) | layers | split over at most kv heads | dense (kv with one kv head) |
| mlp | L·(3 or 2)·h·f (+ column biases) | layers | split | dense |
| experts | L·E·(3 or 2)·h·f (+ column biases) | layers | split; expert axes divide it | experts |
| expert_biases | L·E·h (row-parallel biases of the experts) | layers | whole; expert axes divide it | experts |
| router | L·(h·E + E bias) | layers | whole | router |
| biases | L·(h + h) (row-parallel biases: attention output, MLP output) | layers | whole | biases |
| norms | L·2·(2h layernorm, h rmsnorm) | layers | whole | norms |
| qk_norms | L·2·d_head (two per layer: query and key, shared by the heads; with ``qk_norm``) | layers | whole, sees heads | qk_norms |
| final_norm | 2h or h | last | whole | norms |
| head | V·h (a copy, not in Ψ, when tied) | last | split (vocabulary-parallel) | dense (embedding when tied) |

Without a transformer shape the model is one group, ``dense``, holding Ψ (split by a tensor
axis), and the checker reasons about the classes a transformer has (dense, norms, biases,
embedding) without their sizes.

What a tensor axis gives a group to see (``sees``) types its gradient there: a whole weight
on whole activations computes the same gradient on every rank (invariant); a whole weight
applied to head-split activations (a norm shared by the heads, one K/V head copied on every
rank) computes on each rank the part from its own heads, summed over the axis (partial).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from ..diagnostics import NO_SPAN, Span
from .nodes import Const, GroupDecl, Mode, Model, Op, Placement, State, Sym, TransformerShape, Value, const


class Stage(StrEnum):
    """Which pipeline stages hold a group (``ParamGroup.where``, ``stage = ...``)."""

    LAYERS = "layers"  # L/p layers on every stage
    FIRST = "first"
    LAST = "last"


class Holding(StrEnum):
    """How a tensor (or sequence) axis holds a group (``ParamGroup.tensor``), and what it gives
    the group to see (``ParamGroup.sees``: WHOLE activations, or HEADS, head-split ones)."""

    SPLIT = "split"
    WHOLE = "whole"
    HEADS = "heads"  # split over at most kv heads, then copied


class GradClass(StrEnum):
    """The checker's gradient classes (``ParamGroup.checks_as``), in report order: kv with a single
    K/V head copied on every tensor rank, qk_norms (norms shared by the heads) have partial gradients
    over the tensor axes."""

    DENSE = "dense"
    KV = "kv"
    NORMS = "norms"
    QK_NORMS = "qk_norms"
    BIASES = "biases"
    EXPERTS = "experts"
    ROUTER = "router"
    EMBEDDING = "embedding"


class LayerKind(StrEnum):
    """Which of the layers a ranged group lives in (``LayerRange``)."""

    FIRST = "first"  # the first k (dense) layers
    AFTER = "after"  # the layers after them
    DENSE_OF = "dense_of"  # the dense layers of a periodic pattern (``moe_pattern``)
    MOE_OF = "moe_of"  # its MoE layers


@dataclass(frozen=True)
class LayerRange:
    """The layers a group lives in when not every layer holds it (``ParamGroup.layers``)."""

    kind: LayerKind
    k: Value | None = None  # FIRST, AFTER: the number of leading (dense) layers
    pattern: tuple[int, int, int] | None = None  # DENSE_OF, MOE_OF: (dense_layers, every, offset)

    @property
    def moe(self) -> bool:
        """Whether the range is the MoE layers (the rest are the dense ones)."""
        return self.kind in (LayerKind.AFTER, LayerKind.MOE_OF)


LAYERS, FIRST, LAST = Stage.LAYERS, Stage.FIRST, Stage.LAST
SPLIT, WHOLE, HEADS = Holding.SPLIT, Holding.WHOLE, Holding.HEADS
# the classes a user group may follow (``like``)
LIKE = (GradClass.DENSE, GradClass.NORMS, GradClass.BIASES, GradClass.EXPERTS, GradClass.ROUTER, GradClass.EMBEDDING)
CLASSES = tuple(GradClass)
BUILTIN = ("embedding", "attention", "kv", "attention_latent", "mlp", "mlp_biases", "experts", "shared_experts",
           "expert_biases", "router", "biases", "norms", "qk_norms", "final_norm", "head", "mtp", "dense")


@dataclass(frozen=True)
class ParamGroup:
    """A parameter group of the model: its size, where it lives and how the axes hold it."""

    name: str
    count: Value | None  # parameters of the group in the whole model (None: size unknown)
    where: Stage = LAYERS  # LAYERS (L/p per stage), FIRST or LAST stage
    tensor: Holding = SPLIT  # SPLIT, WHOLE or HEADS
    expert: bool = False  # an expert axis divides it
    checks_as: GradClass = GradClass.DENSE  # the checker's gradient class
    sees: Holding = WHOLE  # WHOLE or HEADS: the activations a tensor axis gives it (HEADS: partial gradients)
    copy: bool = False  # a copy outside Ψ (the tied output head on the last stage)
    modes: tuple[tuple[State, tuple[tuple[str, Mode], ...]], ...] = ()  # replace the plan's modes
    roles: tuple[tuple[str, object], ...] = ()  # folding: (axis, ir.Role) the axis plays for this group
    user: bool = False  # declared by the user
    per_layer: Value | None = None  # parameters per layer, for groups inside the layers
    restated: bool = False  # a built-in group the model block restates
    layers: LayerRange | None = None  # the layers holding it, when not every layer does
    span: Span = field(default=NO_SPAN, compare=False, repr=False)

    def own_modes(self, state: State) -> dict[str, Mode]:
        return dict(dict(self.modes).get(state, ()))


def _mul(*args: Value) -> Value:
    args = tuple(a for a in args if not (isinstance(a, Const) and a.value == 1))
    if not args:
        return const(1)
    out = args[0]
    for a in args[1:]:
        out = Op("*", (out, a))
    return out


def _add(*args: Value) -> Value:
    args = tuple(a for a in args if not (isinstance(a, Const) and a.value == 0))
    if not args:
        return const(0)
    out = args[0]
    for a in args[1:]:
        out = Op("+", (out, a))
    return out


def _div(a: Value, b: Value) -> Value:
    return Op("/", (a, b))


def _n(x: int) -> Const:
    return const(x)


def is_zero(v: Value) -> bool:
    return isinstance(v, Const) and v.value == 0


def _is_one(v: Value) -> bool:
    return isinstance(v, Const) and v.value == 1


def _sub(a: Value, b: Value) -> Value:
    return Op("-", (a, b))


def padded_vocab(t: TransformerShape) -> Value:
    """The vocabulary the embedding and the output layer hold: padded up to a multiple of
    ``vocab_multiple`` when one is given (the resolver makes both numbers then)."""
    m = t.vocab_multiple
    if m is None or not (isinstance(t.vocab, Const) and isinstance(m, Const)):
        return t.vocab
    v, k = t.vocab.value, m.value
    return const(-(-v // k) * k)


def moe_pattern(t: TransformerShape) -> tuple[int, int, int, int] | None:
    """(L, dense_layers, every, offset) when the MoE layers are periodic (``moe_every``): layer i
    (from 0) is an MoE layer when i >= dense_layers and i mod every = offset. The resolver makes
    these whole numbers; None otherwise (every layer after the dense ones is MoE)."""
    if t.moe_every is None:
        return None
    vals = (t.layers, t.dense_layers or const(0), t.moe_every, t.moe_offset or const(0))
    if not all(isinstance(v, Const) and v.value.denominator == 1 for v in vals):
        return None
    L, d, k, r = (int(v.value) for v in vals)
    return L, d, k, r


def moe_layers_below(n: int, d: int, k: int, r: int) -> int:
    """How many of the layers 0 … n−1 are MoE layers under the pattern (d, k, r)."""
    first = d + (r - d) % k  # the first MoE layer
    return max(0, -(-(n - first) // k))


def _mlp(t: TransformerShape, width: Value) -> Value:
    out = _mul(_n(3 if t.gated_mlp else 2), t.hidden, width)
    if t.bias:
        out = _add(out, _mul(_n(2), width) if t.gated_mlp else width)  # the input (column) biases
    return out


def _attention(t: TransformerShape, dh: Value, one_norm: Value) -> tuple[Value, Value | None, Value | None]:
    """A layer's attention parameters: the query and output (all of MLA's), K/V, MLA's down-projections."""
    h, a, kv = t.hidden, t.heads, t.kv_heads
    if not t.mla:
        attn, kvp = _mul(_n(2), h, a, dh), _mul(_n(2), h, kv, dh)
        if t.bias if t.qkv_bias is None else t.qkv_bias:
            attn, kvp = _add(attn, _mul(a, dh)), _add(kvp, _mul(_n(2), kv, dh))  # q bias; k and v biases
        return attn, kvp, None
    latent = None
    qk = _add(t.qk_nope_dim, t.qk_rope_dim)
    if t.q_lora_rank is not None:
        q = _mul(t.q_lora_rank, a, qk)  # the up-projection of the compressed query
        latent = _add(_mul(h, t.q_lora_rank), _mul(one_norm, t.q_lora_rank))
    else:
        q = _mul(h, a, qk)
    kv_down = _add(_mul(h, _add(t.kv_lora_rank, t.qk_rope_dim)), _mul(one_norm, t.kv_lora_rank))
    latent = kv_down if latent is None else _add(latent, kv_down)
    return _add(q, _mul(t.kv_lora_rank, a, _add(t.qk_nope_dim, t.v_head_dim)), _mul(a, t.v_head_dim, h)), None, latent


def _moe_ranged(t: TransformerShape, n_moe: Value, n_dense: Value, mixed: bool) -> list:
    """(group, count, which layers: None for all) of the experts, their router, and a mixed model's dense MLPs."""
    h, L, E, f = t.hidden, t.layers, t.experts, t.ffn
    ranged: list[tuple[ParamGroup, Value, LayerKind | None]] = []
    fe = t.expert_ffn if t.expert_ffn is not None else f
    where_moe = LayerKind.AFTER if mixed else None
    ranged.append((ParamGroup("experts", None, expert=True, checks_as=GradClass.EXPERTS), _mul(n_moe, E, _mlp(t, fe)),
                   where_moe))
    if t.shared_experts is not None and not (isinstance(t.shared_experts, Const) and t.shared_experts.value == 0):
        fs = t.shared_expert_ffn if t.shared_expert_ffn is not None else fe
        ranged.append((ParamGroup("shared_experts", None), _mul(n_moe, t.shared_experts, _mlp(t, fs)), where_moe))
    if t.bias:
        ranged.append((ParamGroup("expert_biases", None, tensor=WHOLE, expert=True, checks_as=GradClass.EXPERTS),
                       _mul(n_moe, E, h), where_moe))
    router = _mul(h, E)
    if t.bias or t.router_bias:
        router = _add(router, E)
    if t.shared_expert_gate:
        router = _add(router, h)  # the shared experts' gate: one more output row of the router's kind
    ranged.append((ParamGroup("router", None, tensor=WHOLE, checks_as=GradClass.ROUTER), _mul(n_moe, router),
                   where_moe))
    if mixed:
        ranged.append((ParamGroup("mlp", None), _mul(n_dense, _mlp(t, f)), LayerKind.FIRST))
        if t.bias:
            ranged.append((ParamGroup("biases", None, tensor=WHOLE, checks_as=GradClass.BIASES), _mul(L, h), None))
            ranged.append((ParamGroup("mlp_biases", None, tensor=WHOLE, checks_as=GradClass.BIASES), _mul(n_dense, h),
                           LayerKind.FIRST))
    return ranged


def _placed(t: TransformerShape, ranged: list, pattern, n_moe: Value, n_dense: Value) -> list[ParamGroup]:
    """The ranged groups with their per-layer counts and their layers (all, the dense or the MoE ones)."""
    L, k = t.layers, t.dense_layers
    groups = []
    for g, count, which in ranged:
        if which is None:
            groups.append(replace(g, count=count, per_layer=_div(count, L)))
        elif pattern is not None:  # the dense or the MoE layers of the pattern (dense_layers, every, offset)
            n = n_dense if which is LayerKind.FIRST else n_moe
            rng = LayerRange(LayerKind.DENSE_OF if which is LayerKind.FIRST else LayerKind.MOE_OF, pattern=pattern[1:])
            groups.append(replace(g, count=count, per_layer=_div(count, n), layers=rng))
        else:
            n = k if which is LayerKind.FIRST else _sub(L, k)
            groups.append(replace(g, count=count, per_layer=_div(count, n), layers=LayerRange(which, k)))
    return groups


def transformer_groups(t: TransformerShape) -> tuple[ParamGroup, ...]:
    """The built-in groups of a transformer shape, counted exactly (they add up to Ψ)."""
    h, L, a, kv, f, E = t.hidden, t.layers, t.heads, t.kv_heads, t.ffn, t.experts
    V = padded_vocab(t)
    dh = t.head_dim if t.head_dim is not None else _div(h, a)
    norm = _mul(_n(2), h) if t.norm == "layernorm" else h
    one_norm = _n(2) if t.norm == "layernorm" else _n(1)  # elements of a norm per normalised feature
    moe = not _is_one(E)
    groups: list[ParamGroup] = []
    attn, kvp, latent = _attention(t, dh, one_norm)
    per_layer: list[ParamGroup] = [ParamGroup("attention", None, per_layer=attn)]
    if kvp is not None:  # one K/V head is copied on every tensor rank: each copy sees its rank's query heads
        single = isinstance(kv, Const) and kv.value == 1
        per_layer.append(ParamGroup("kv", None, tensor=HEADS, per_layer=kvp,
                                    checks_as=GradClass.KV if single else GradClass.DENSE,
                                    sees=HEADS if single else WHOLE))
    if latent is not None:  # MLA's down-projections and their norms: whole on every tensor rank
        per_layer.append(ParamGroup("attention_latent", None, tensor=WHOLE, checks_as=GradClass.NORMS, per_layer=latent))
    pattern = moe_pattern(t) if moe else None
    n_moe = n_dense = None
    if pattern is not None:  # MoE on every k-th layer: counts of each kind are whole numbers
        n_moe_int = moe_layers_below(*pattern)
        n_moe, n_dense = _n(n_moe_int), _n(pattern[0] - n_moe_int)
    # some layers dense, some MoE
    mixed = moe and (pattern[0] > n_moe_int if pattern is not None else t.dense_layers is not None)
    ranged = []
    if moe:
        if pattern is None:
            n_moe, n_dense = (L if t.dense_layers is None else _sub(L, t.dense_layers)), t.dense_layers
        ranged = _moe_ranged(t, n_moe, n_dense, mixed)
    else:
        per_layer.append(ParamGroup("mlp", None, per_layer=_mlp(t, f)))
    if t.bias and not mixed:
        per_layer.append(ParamGroup("biases", None, tensor=WHOLE, checks_as=GradClass.BIASES,
                                    per_layer=h if moe else _mul(_n(2), h)))
    norms = _mul(t.norms_per_layer if t.norms_per_layer is not None else _n(2), norm)
    per_layer.append(ParamGroup("norms", None, tensor=WHOLE, checks_as=GradClass.NORMS, per_layer=norms))
    if t.qk_norm:  # one norm of head_dim for the queries and one for the keys, shared by the heads
        per_layer.append(ParamGroup("qk_norms", None, tensor=WHOLE, checks_as=GradClass.QK_NORMS, sees=HEADS,
                                    per_layer=_mul(_n(2), one_norm, dh)))
    emb = _mul(V, h)
    if t.position_embeddings is not None:
        emb = _add(emb, _mul(t.position_embeddings, h))
    groups.append(ParamGroup("embedding", emb, where=FIRST, checks_as=GradClass.EMBEDDING))
    groups += [replace(g, count=_mul(L, g.per_layer)) for g in per_layer[:2]]
    rest = per_layer[2:]
    groups += [replace(g, count=_mul(L, g.per_layer)) for g in rest if g.name == "attention_latent"]
    groups += _placed(t, ranged, pattern, n_moe, n_dense)
    groups += [replace(g, count=_mul(L, g.per_layer)) for g in rest if g.name != "attention_latent"]
    groups.append(ParamGroup("final_norm", norm, where=LAST, tensor=WHOLE, checks_as=GradClass.NORMS))
    tied = bool(t.tied_embeddings)
    groups.append(ParamGroup("head", _mul(V, h), where=LAST, copy=tied,
                             checks_as=GradClass.EMBEDDING if tied else GradClass.DENSE))
    if t.mtp_layers is not None and not (isinstance(t.mtp_layers, Const) and t.mtp_layers.value == 0):
        # each module: two norms, a 2h -> h projection and one more layer (of the model's last kind),
        # sharing the embedding and the output head
        layer_params = _add(*(g.per_layer for g in groups if g.per_layer is not None and
                              (g.layers is None or g.layers.moe or not moe)))
        module = _add(_mul(_n(2), norm), _mul(_n(2), h, h), layer_params)
        groups.append(ParamGroup("mtp", _mul(t.mtp_layers, module), where=LAST))
    return tuple(groups)


_RECENT: list = []  # (model, its groups) for the last models asked about, by identity


def param_groups(model: Model) -> tuple[ParamGroup, ...]:
    """The model's groups: the built-in ones (restated where the model block says so), then
    the user's own. With a transformer shape a user group adds its parameters to Ψ; with
    ``params`` given, user groups are carved out of Ψ and ``dense`` holds the rest.

    The checker asks this of one model object many times: the answer is kept for the last few
    model objects, by identity (an equal model from another file has other source locations)."""
    for m, groups in _RECENT:
        if m is model:
            return groups
    groups = _param_groups(model)
    _RECENT.insert(0, (model, groups))
    del _RECENT[8:]
    return groups


def _param_groups(model: Model) -> tuple[ParamGroup, ...]:
    t = model.transformer
    psi: Value = model.params if model.params is not None else Sym("psi")
    if t is not None:
        groups = list(transformer_groups(t))
        base = psi if model.params is not None else _add(*(g.count for g in groups if not g.copy))
    else:
        groups = [ParamGroup("dense", psi)]
        base = psi
    decls = {d.name: d for d in model.groups}
    out: list[ParamGroup] = []
    fold = decls["experts"].roles if "experts" in decls else ()  # parallel folding: every expert group
    for g in groups:
        d = decls.get(g.name)
        g = g if d is None else _restate(g, d, t)
        out.append(replace(g, roles=fold) if g.expert and fold and not g.roles else g)
    own: list[ParamGroup] = []
    for d in model.groups:
        if d.name in {g.name for g in groups}:
            continue
        count = d.count if d.count is not None else _mul(d.fraction, base) if d.fraction is not None else None
        own.append(ParamGroup(
            d.name, count, where=d.stage or LAYERS, tensor=d.tensor or SPLIT, expert=bool(d.experts),
            checks_as=d.like or GradClass.DENSE, sees=d.sees or WHOLE, modes=d.modes, roles=d.roles, user=True, span=d.span,
            per_layer=_div(count, t.layers) if (t is not None and count is not None and (d.stage or LAYERS) == LAYERS)
            else None))
    if t is None and own:
        rest = _add(psi, *(Op("neg", (g.count,)) for g in own if g.count is not None))
        out = [replace(out[0], count=rest)] + out[1:]
    return tuple(out + own)


def _restate(g: ParamGroup, d: GroupDecl, t: TransformerShape | None) -> ParamGroup:
    """A built-in group with what the declaration restates: its tensor rule, its stage (a
    group moved into the layers is spread evenly over them) and its own modes."""
    where = d.stage or g.where
    per_layer = g.per_layer
    if where == LAYERS and per_layer is None and t is not None and g.count is not None:
        per_layer = _div(g.count, t.layers)
    elif where != LAYERS:
        per_layer = None
    return replace(g, tensor=d.tensor or g.tensor, sees=d.sees or g.sees, where=where, per_layer=per_layer, modes=d.modes or g.modes,
                   roles=d.roles or g.roles, restated=True, span=d.span)


def check_groups(model: Model, has_expert_axis: bool) -> tuple[str, ...]:
    """The gradient groups the checker reasons about, in report order: the built-in classes
    present in the model, then every user group under its own name."""
    t = model.transformer
    if t is None:
        classes = [GradClass.DENSE, GradClass.NORMS, GradClass.BIASES]
        if has_expert_axis:
            classes.append(GradClass.EXPERTS)
        classes.append(GradClass.EMBEDDING)
    else:
        groups = param_groups(model)
        present = {g.checks_as for g in groups if not g.user}
        if has_expert_axis:
            present.add(GradClass.EXPERTS)
        classes = [c for c in CLASSES if c in present]
    return tuple(classes) + tuple(g.name for g in param_groups(model) if g.user)


def class_of(model: Model, name: str) -> ParamGroup:
    """The group the checker's gradient group ``name`` reasons with: a user group itself, or a
    representative of a built-in class (its tensor rule and modes)."""
    for g in param_groups(model):
        if g.user and g.name == name:
            return g
    tensor = WHOLE if name in (GradClass.NORMS, GradClass.BIASES, GradClass.ROUTER) else SPLIT
    for g in param_groups(model):
        if not g.user and g.checks_as == name and (g.restated or name in (GradClass.KV, GradClass.QK_NORMS)):
            return replace(g, name=name)
    if name == GradClass.KV:  # several K/V heads, copied at the plan's sizes (``ir.heads``)
        return next(replace(g, checks_as=GradClass.KV) for g in param_groups(model) if g.name == "kv")
    return ParamGroup(name, None, tensor=tensor, expert=name == GradClass.EXPERTS, checks_as=GradClass(name) if name in CLASSES else name)


def effective(pl: Placement, group: ParamGroup) -> Placement:
    """The plan's placement of a state with the group's own modes in place."""
    own = group.own_modes(pl.state)
    if not own:
        return pl
    return replace(pl, modes=tuple((a, own.get(a, m)) for a, m in pl.modes))


