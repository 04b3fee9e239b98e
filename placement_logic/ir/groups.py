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
| kv | L·2·h·d_kv (+ 2·d_kv bias) | layers | split over at most kv heads | dense |
| mlp | L·(3 or 2)·h·f (+ column biases) | layers | split | dense |
| experts | L·E·(3 or 2)·h·f (+ column biases) | layers | split; expert axes divide it | experts |
| expert_biases | L·E·h (row-parallel biases of the experts) | layers | whole; expert axes divide it | experts |
| router | L·(h·E + E bias) | layers | whole | router |
| biases | L·(h + h) (row-parallel biases: attention output, MLP output) | layers | whole | biases |
| norms | L·2·(2h layernorm, h rmsnorm) | layers | whole | norms |
| final_norm | 2h or h | last | whole | norms |
| head | V·h (a copy, not in Ψ, when tied) | last | split (vocabulary-parallel) | dense (embedding when tied) |

Without a transformer shape the model is one group, ``dense``, holding Ψ (split by a tensor
axis), and the checker reasons about the classes a transformer has (dense, norms, biases,
embedding) without their sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..diagnostics import NO_SPAN, Span
from .nodes import Const, GroupDecl, Mode, Model, Op, Placement, State, Sym, TransformerShape, Value, const

# pipeline stages
LAYERS, FIRST, LAST = "layers", "first", "last"
# how a tensor (or sequence) axis holds a group
SPLIT, WHOLE, HEADS = "split", "whole", "heads"  # HEADS: split over at most kv heads, then copied
# the checker's gradient classes, in report order
CLASSES = ("dense", "norms", "biases", "experts", "router", "embedding")
BUILTIN = ("embedding", "attention", "kv", "mlp", "experts", "expert_biases", "router", "biases", "norms",
           "final_norm", "head", "dense")


@dataclass(frozen=True)
class ParamGroup:
    name: str
    count: Value | None  # parameters of the group in the whole model (None: size unknown)
    where: str = LAYERS  # LAYERS (L/p per stage), FIRST or LAST stage
    tensor: str = SPLIT  # SPLIT, WHOLE or HEADS
    expert: bool = False  # an expert axis divides it
    checks_as: str = "dense"  # the checker's gradient class
    copy: bool = False  # a copy outside Ψ (the tied output head on the last stage)
    modes: tuple[tuple[State, tuple[tuple[str, Mode], ...]], ...] = ()  # replace the plan's modes
    user: bool = False  # declared by the user
    per_layer: Value | None = None  # parameters per layer, for groups inside the layers
    restated: bool = False  # a built-in group the model block restates
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


def _is_one(v: Value) -> bool:
    return isinstance(v, Const) and v.value == 1


def transformer_groups(t: TransformerShape) -> tuple[ParamGroup, ...]:
    """The built-in groups of a transformer shape, counted exactly (they add up to Ψ)."""
    h, L, a, kv, f, V, E = t.hidden, t.layers, t.heads, t.kv_heads, t.ffn, t.vocab, t.experts
    d_kv = _div(_mul(kv, h), a)  # kv heads × head dim (h / heads)
    norm = _mul(_n(2), h) if t.norm == "layernorm" else h
    moe = not _is_one(E)
    mats = _n(3 if t.gated_mlp else 2)
    col_bias = _mul(_n(2), f) if t.gated_mlp else f  # the MLP's input (column-parallel) biases
    attn = _mul(_n(2), h, h)
    kvp = _mul(_n(2), h, d_kv)
    mlp = _mul(mats, h, f)
    if t.bias:
        attn = _add(attn, h)  # q bias (the output projection's bias is row-parallel: `biases`)
        kvp = _add(kvp, _mul(_n(2), d_kv))
        mlp = _add(mlp, col_bias)
    per_layer: list[ParamGroup] = [
        ParamGroup("attention", None, per_layer=attn),
        ParamGroup("kv", None, tensor=HEADS, per_layer=kvp),
    ]
    if moe:
        per_layer.append(ParamGroup("experts", None, expert=True, checks_as="experts", per_layer=_mul(E, mlp)))
        if t.bias:
            per_layer.append(ParamGroup("expert_biases", None, tensor=WHOLE, expert=True, checks_as="experts",
                                        per_layer=_mul(E, h)))
        router = _mul(h, E)
        if t.bias:
            router = _add(router, E)
        per_layer.append(ParamGroup("router", None, tensor=WHOLE, checks_as="router", per_layer=router))
    else:
        per_layer.append(ParamGroup("mlp", None, per_layer=mlp))
    if t.bias:
        per_layer.append(ParamGroup("biases", None, tensor=WHOLE, checks_as="biases",
                                    per_layer=h if moe else _mul(_n(2), h)))
    per_layer.append(ParamGroup("norms", None, tensor=WHOLE, checks_as="norms", per_layer=_mul(_n(2), norm)))
    groups = [ParamGroup("embedding", _mul(V, h), where=FIRST, checks_as="embedding")]
    groups += [replace(g, count=_mul(L, g.per_layer)) for g in per_layer]
    groups.append(ParamGroup("final_norm", norm, where=LAST, tensor=WHOLE, checks_as="norms"))
    tied = bool(t.tied_embeddings)
    groups.append(ParamGroup("head", _mul(V, h), where=LAST, copy=tied,
                             checks_as="embedding" if tied else "dense"))
    return tuple(groups)


def param_groups(model: Model) -> tuple[ParamGroup, ...]:
    """The model's groups: the built-in ones (restated where the model block says so), then
    the user's own. With a transformer shape a user group adds its parameters to Ψ; with
    ``params`` given, user groups are carved out of Ψ and ``dense`` holds the rest."""
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
    for g in groups:
        d = decls.get(g.name)
        out.append(g if d is None else _restate(g, d, t))
    own: list[ParamGroup] = []
    for d in model.groups:
        if d.name in {g.name for g in groups}:
            continue
        count = d.count if d.count is not None else _mul(d.fraction, base) if d.fraction is not None else None
        own.append(ParamGroup(
            d.name, count, where=d.stage or LAYERS, tensor=d.tensor or SPLIT, expert=bool(d.experts),
            checks_as=d.like or "dense", modes=d.modes, user=True, span=d.span,
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
    return replace(g, tensor=d.tensor or g.tensor, where=where, per_layer=per_layer, modes=d.modes or g.modes,
                   restated=True, span=d.span)


def check_groups(model: Model, has_expert_axis: bool) -> tuple[str, ...]:
    """The gradient groups the checker reasons about, in report order: the built-in classes
    present in the model, then every user group under its own name."""
    t = model.transformer
    if t is None:
        classes = ["dense", "norms", "biases"]
        if has_expert_axis:
            classes.append("experts")
        classes.append("embedding")
    else:
        groups = param_groups(model)
        present = {g.checks_as for g in groups if not g.user}
        if has_expert_axis:
            present.add("experts")
        classes = [c for c in CLASSES if c in present]
    return tuple(classes) + tuple(g.name for g in param_groups(model) if g.user)


def class_of(model: Model, name: str) -> ParamGroup:
    """The group the checker's gradient group ``name`` reasons with: a user group itself, or a
    representative of a built-in class (its tensor rule and modes)."""
    for g in param_groups(model):
        if g.user and g.name == name:
            return g
    tensor = WHOLE if name in ("norms", "biases", "router") else SPLIT
    for g in param_groups(model):
        if not g.user and g.checks_as == name and g.restated:
            return replace(g, name=name)
    return ParamGroup(name, None, tensor=tensor, expert=name == "experts", checks_as=name)


def effective(pl: Placement, group: ParamGroup) -> Placement:
    """The plan's placement of a state with the group's own modes in place."""
    own = group.own_modes(pl.state)
    if not own:
        return pl
    return replace(pl, modes=tuple((a, own.get(a, m)) for a, m in pl.modes))


