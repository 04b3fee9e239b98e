"""Mesh and model: the ``mesh`` and ``model`` blocks -> ``ir.Mesh`` and ``ir.Model``.

Mesh axes become names of the value table (an axis size is a count); the model block gives
the parameter count or a transformer shape, byte widths per state and the batch shape.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from .. import ir
from ..diagnostics import Code, DiagnosticError, did_you_mean
from ..frontend import hf, surface
from ..frontend.files import read_source
from ..ir import groups as pg
from ..ir.walker import fold
from .groups import check_groups, group_decl, props
from .hardware import build_hardware, is_hardware_line
from .losses_section import losses_section as _losses
from .modelvalues import MODEL_PROPS, TRANSFORMER_NUMERIC, _show, check_model_values, check_shape_values
from .shapes import number
from .values import Values

# DeepSpeed's bucket, prefetch and live-parameter settings (``costs.buckets``), under their config names
BUCKET_COUNTS = ("reduce_bucket_size", "prefetch_bucket_size", "max_live_parameters", "max_reuse_distance",
                 "param_persistence_threshold")
BUCKET_FLAGS = ("overlap_comm", "contiguous_gradients")
BYTES_PROPS = ("params", "grads", "optimizer", "activations", "logits")
TRANSFORMER_FLAGS = ("tied_embeddings", "gated_mlp", "bias", "qkv_bias", "shared_expert_gate", "router_bias",
                     "qk_norm", "drop_renormalise")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_dim", "qk_nope_dim", "v_head_dim")


def build_mesh(block: surface.MeshBlock, vals: Values) -> ir.Mesh:
    """The mesh; each axis declared also becomes a count in ``vals``."""
    error = vals.cx.error
    axes = []
    used_links = {d.link for d in block.axes if d.link}
    hardware_lines = [d for d in block.axes if is_hardware_line(d, used_links)]
    for decl in block.axes:
        if is_hardware_line(decl, used_links):
            continue
        if decl.name in vals.axes:
            error(Code.DUPLICATE_AXIS, f"axis '{decl.name}' is declared twice", decl.span,
                  (f"first declared at line {vals.axes[decl.name].span.line}",))
            continue
        if decl.name in vals.lets:
            error(Code.DUPLICATE_DEFINITION, f"'{decl.name}' is both a let binding and a mesh axis", decl.span)
            continue
        size = vals.count(decl.size, {}, f"the size of axis '{decl.name}'")
        if isinstance(size, ir.Const) and (size.value.denominator != 1 or size.value < 1):
            error(Code.BAD_AXIS_SIZE, f"the size of axis '{decl.name}' must be a positive integer, "
                  f"not {_show(size.value)}", decl.size.span)
            size = None
        elif isinstance(size, ir.Op) and not ir.symbols(size):
            error(Code.BAD_AXIS_SIZE, f"write the size of axis '{decl.name}' as a number or a name",
                  decl.size.span)
            size = None
        if size is None:
            # the size's error is reported; the axis still exists (size 1) so that the plans
            # naming it do not report it as undeclared as well
            size = ir.const(1)
        axis = ir.Axis(decl.name, size, decl.link, decl.span)
        vals.axes[decl.name] = axis
        vals.values[decl.name] = size
        vals.dims[decl.name] = ir.Dim.COUNT
        axes.append(axis)
    return ir.Mesh(tuple(axes), block.span, build_hardware(hardware_lines, axes, vals, block.span))


def build_model(block: surface.ModelBlock, vals: Values) -> ir.Model | None:
    """The model, or None after reporting what is wrong with the block."""
    error = vals.cx.error
    fields: dict[str, object] = {
        "params": None,
        "bytes_params": ir.const(2),
        "bytes_grads": ir.const(2),
        "bytes_optimizer": ir.const(12),
        "bytes_activations": ir.const(2),
        "microbatches": ir.const(1),
    }
    seen: set[str] = set()
    transformer = None
    mark = vals.cx.mark()
    groups: list[ir.GroupDecl] = []
    if block.source is not None:
        transformer = _from_config(vals, block)
        if transformer is None:
            return None
        if any(isinstance(i, surface.SubBlock) and i.key == "transformer" for i in block.items):
            error(Code.DUPLICATE_PROPERTY, "the transformer shape comes from the config; remove the 'transformer' section or "
                  "the 'from' clause", block.span)
            return None
        seen.add("transformer")
    for item in block.items:
        if isinstance(item, surface.SubBlock) and item.name is not None:
            _group(vals, item, groups)
            continue
        if item.key in seen:
            error(Code.DUPLICATE_PROPERTY, f"'{item.key}' is given twice in the model block", item.span)
            continue
        seen.add(item.key)
        if isinstance(item, surface.SubBlock) and item.key == "transformer":
            transformer = _transformer(vals, item)
        elif isinstance(item, surface.SubBlock):
            _section(vals, item, fields)
        else:
            _property(vals, item, fields)
    if vals.cx.failed_since(mark):
        return None
    if fields["params"] is None and transformer is None:
        error(Code.MISSING_SECTION, "the model needs 'params' (the parameter count Ψ) or a transformer shape",
              block.span)
        return None
    if "tied_embeddings" in fields and transformer is not None:
        error(Code.DUPLICATE_PROPERTY, "with a transformer shape, state 'tied_embeddings' in its 'transformer' section",
              next(i.span for i in block.items if i.key == "tied_embeddings"))
        return None
    model = ir.Model(transformer=transformer, span=block.span, groups=tuple(groups), **fields)
    check_model_values(model, vals, error)
    check_groups(vals, model)
    vals.group_names = tuple(g.name for g in pg.param_groups(model))
    return None if vals.cx.failed_since(mark) else model


def _group(vals: Values, item: surface.SubBlock, groups: list[ir.GroupDecl]) -> None:
    """A ``group NAME { ... }`` of the model block, added to ``groups``."""
    if item.name in {g.name for g in groups}:
        vals.cx.error(Code.DUPLICATE_PROPERTY, f"group '{item.name}' is declared twice in the model block", item.span)
        return
    g = group_decl(vals, item)
    if g is not None:
        groups.append(g)
        vals.groups.add(g.name)


def _bytes(vals: Values, block: surface.SubBlock, fields: dict) -> None:
    """``bytes { params = 2  grads = 4 ... }``: the byte widths of the states, and which were stated."""
    for p in props(vals, block.props, BYTES_PROPS, "bytes"):
        v = _width(vals, p)
        if v is not None:
            fields["bytes_" + p.key] = v
            fields["bytes_stated"] = fields.get("bytes_stated", ()) + (p.key,)


def _section(vals: Values, item: surface.SubBlock, fields: dict) -> None:
    """A section of the model block other than the transformer shape, into ``fields``."""
    read = _SECTIONS.get(item.key)
    if read is None:
        vals.cx.error(Code.UNKNOWN_PROPERTY, f"the model block has no '{item.key}' section", item.span,
                      did_you_mean(item.key, ("bytes", "transformer", "conventions", "losses", "buckets", "group",
                                               "attention")))
        return
    read(vals, item, fields)


def _property(vals: Values, item, fields: dict) -> None:
    """A ``key = value`` line of the model block, into ``fields``."""
    key = item.key
    if key == "tied_embeddings":  # a model without a shape: the embedding class tied across the stages
        f = vals.flag_value(item)
        if f is not None:
            fields["tied_embeddings"] = f
        return
    if key not in MODEL_PROPS:
        vals.cx.error(Code.UNKNOWN_PROPERTY, f"the model block has no property '{key}'", item.span,
                      did_you_mean(key, MODEL_PROPS + ("bytes", "transformer", "tied_embeddings")))
        return
    if not isinstance(item.value, (surface.Num, surface.Name, surface.BinOp, surface.Neg, surface.Call, surface.Bool)):
        vals.cx.error(Code.BAD_PROPERTY_VALUE, f"'{key}' needs a number", item.span)
        return
    v = vals.count(item.value, {}, f"'{key}'")
    if v is not None:
        fields[key] = v


def _from_config(vals: Values, block: surface.ModelBlock) -> ir.TransformerShape | None:
    """The transformer shape of ``model from "config.json"`` (a Hugging Face config)."""
    base = Path(vals.cx.base_dir) if vals.cx.base_dir is not None else Path.cwd()
    path = base / block.source
    try:
        text = read_source(path)
        shape = hf.parse_config(text, str(path))
    except DiagnosticError as exc:
        for d in exc.diagnostics:
            vals.cx.diags.append(d)
        vals.cx.sources.update(exc.sources)
        vals.cx.error(Code.BAD_CONFIG, f"cannot take the model from {block.source}", block.source_span)
        return None
    vals.cx.sources[str(path)] = text
    fields: dict = {}
    for k, v in shape.fields.items():
        if isinstance(v, (bool, str)):
            fields[k] = v
        else:
            fields[k] = ir.Const(Fraction(v), block.source_span)
    fields.setdefault("kv_heads", fields["heads"])
    return ir.TransformerShape(span=block.source_span, **fields)


ACTIVATION_COUNTS = ("shape", "korthikanti", "megatron", "llm_analysis", "pytorch_eager", "pytorch_eager_cuda")
ATTENTION_FLOPS = ("causal", "full")
COMPUTE_TIMES = ("kernels", "mfu")
TENSOR_BACKWARDS = ("exposed", "overlapped")


def _buckets(vals: Values, block: surface.SubBlock, fields: dict) -> None:
    """``buckets { reduce_bucket_size = 500000000  overlap_comm = true ... }``: DeepSpeed's runtime
    buffers (``costs.buckets``); sizes are element counts of at least 0, the flags true or false."""
    stated = []
    for p in props(vals, block.props, BUCKET_COUNTS + BUCKET_FLAGS, "buckets"):
        if p.key in BUCKET_FLAGS:
            f = vals.flag_value(p)
            if f is not None:
                stated.append((p.key, ir.const(int(f))))
            continue
        if p.value is None or isinstance(p.value, (surface.ModeMap, surface.Bool)):
            vals.cx.error(Code.BAD_PROPERTY_VALUE, f"'{p.key}' needs a number of elements", p.span)
            continue
        v = vals.count(p.value, {}, f"'{p.key}'")
        if v is None:
            continue
        known = fold(v, {})
        if known is not None and (known < 0 or known.denominator != 1):
            vals.cx.error(Code.BAD_AXIS_SIZE, f"'{p.key}' must be a whole number of elements, at least 0", p.value.span)
            continue
        stated.append((p.key, v))
    fields["buckets"] = tuple(stated)


# conventions that name one of a few choices: key -> (the choices, the model's field)
_CONVENTION_WORDS = {"activations": (ACTIVATION_COUNTS, "activation_count"),
                     "attention_flops": (ATTENTION_FLOPS, "attention_flops"),
                     "compute_time": (COMPUTE_TIMES, "compute_time"),
                     "tensor_backward": (TENSOR_BACKWARDS, "tensor_backward")}
# conventions that are bytes: key -> the message when they are not
_CONVENTION_BYTES = {"host_construction": "'host_construction' needs bytes (what one process builds at once, e.g. "
                                          "4 B * 16449536) or 'model' (the whole model in fp32)",
                     "reserve": "'reserve' needs bytes, e.g. reserve = 1 GiB"}


def _conventions(vals: Values, block: surface.SubBlock, fields: dict) -> None:
    """``conventions { activations = megatron  activation_allowance = 1.05 }``."""
    for p in props(vals, block.props, ("activations", "activation_allowance", "reserve", "reserve_fraction",
                                        "host_construction", "host_buffer_factor", "attention_flops",
                                        "compute_time", "tensor_backward"), "conventions"):
        if p.key == "host_construction" and isinstance(p.value, surface.Name) and p.value.id == "model":
            fields["host_construction_model"] = True
        elif p.key in _CONVENTION_WORDS:
            choices, name = _CONVENTION_WORDS[p.key]
            w = vals.word(p.value, choices, f"'{p.key}'")
            if w:
                fields[name] = w
        elif p.key in _CONVENTION_BYTES:
            r = None if p.value is None or isinstance(p.value, (surface.ModeMap, surface.Bool)) else \
                vals.expr(p.value, {})
            if r is None or r[1] is not ir.Dim.BYTES:
                vals.cx.error(Code.BAD_PROPERTY_VALUE, _CONVENTION_BYTES[p.key], p.span)
            else:
                fields[p.key] = r[0]
        elif p.value is None or isinstance(p.value, (surface.ModeMap, surface.Bool)):
            vals.cx.error(Code.BAD_PROPERTY_VALUE, f"'{p.key}' needs a number", p.span)
        else:
            _convention_number(vals, p, fields)


def _convention_number(vals: Values, p: surface.Prop, fields: dict) -> None:
    """reserve_fraction in [0, 1); host_buffer_factor and activation_allowance positive."""
    v = vals.count(p.value, {}, f"'{p.key}'")
    if v is None:
        return
    if p.key == "reserve_fraction":
        if isinstance(v, ir.Const) and not 0 <= v.value < 1:
            vals.cx.error(Code.BAD_AXIS_SIZE, "'reserve_fraction' must lie in [0, 1)", p.value.span)
            return
        fields["reserve_fraction"] = v
        return
    if isinstance(v, ir.Const) and v.value <= 0:
        vals.cx.error(Code.BAD_AXIS_SIZE, f"'{p.key}' must be positive", p.value.span)
        return
    fields["host_buffer_factor" if p.key == "host_buffer_factor" else "activation_allowance"] = v


def _width(vals: Values, p: surface.Prop) -> ir.Value | None:
    if p.value is None or isinstance(p.value, (surface.ModeMap, surface.Bool)):
        vals.cx.error(Code.BAD_PROPERTY_VALUE, f"the byte width of {p.key} needs a number", p.span)
        return None
    r = vals.expr(p.value, {})
    return None if r is None else r[0]  # bytes per element: a count or a byte quantity


def _transformer(vals: Values, block: surface.SubBlock) -> ir.TransformerShape | None:
    found: dict[str, object] = {}
    allowed = TRANSFORMER_NUMERIC + TRANSFORMER_FLAGS + ("norm",)
    for p in props(vals, block.props, allowed, "transformer"):
        if p.key in TRANSFORMER_FLAGS:
            b = vals.flag_value(p)
            if b is not None:
                found[p.key] = b
        elif p.key == "norm":
            w = vals.word(p.value, ("layernorm", "rmsnorm"), "'norm'")
            if w:
                found["norm"] = w
        elif p.value is None or isinstance(p.value, surface.ModeMap):
            vals.cx.error(Code.BAD_PROPERTY_VALUE, f"'{p.key}' needs a number", p.span)
        else:
            v = vals.count(p.value, {}, f"'{p.key}'")
            if v is not None:
                found[p.key] = v
    required = ("hidden", "layers", "heads", "vocab")
    missing = [k for k in required if k not in found]
    if missing:
        vals.cx.error(Code.MISSING_SECTION, f"the transformer shape needs {', '.join(missing)}", block.span)
        return None
    found.setdefault("kv_heads", found["heads"])
    found.setdefault("ffn", ir.Op("*", (ir.const(4), found["hidden"])))
    if "vocab_multiple" in found:
        mult, vocab = number(found["vocab_multiple"], vals), number(found["vocab"], vals)
        if mult is None or vocab is None or mult.denominator != 1 or vocab.denominator != 1:
            vals.cx.error(Code.BAD_PROPERTY_VALUE, "vocab_multiple pads a vocabulary given as whole numbers", block.span)
            return None
        found["vocab_multiple"], found["vocab"] = ir.const(mult), ir.const(vocab)
    if not _mla_complete(vals, found, block):
        return None
    moe_only = [k for k in ("expert_ffn", "shared_experts", "shared_expert_ffn", "dense_layers", "shared_expert_gate",
                            "router_bias", "moe_every", "moe_offset", "drop_renormalise") if k in found]
    experts = found.get("experts")
    if moe_only and (experts is None or (isinstance(experts, ir.Const) and experts.value == 1)):
        vals.cx.error(Code.MISSING_SECTION, f"{', '.join(moe_only)} describe a mixture of experts; give 'experts' too", block.span)
        return None
    if ("moe_every" in found or "moe_offset" in found) and not _moe_pattern(vals, found, block):
        return None
    shape = ir.TransformerShape(span=block.span, **found)
    mark = vals.cx.mark()
    check_shape_values(shape, vals, vals.cx.error, block.span)
    return None if vals.cx.failed_since(mark) else shape


def _mla_complete(vals: Values, found: dict, block: surface.SubBlock) -> bool:
    """Multi-head latent attention's fields: none, or kv_lora_rank with the head widths (and no head_dim)."""
    given = [k for k in MLA_FIELDS if k in found]
    if given and "kv_lora_rank" not in found:
        vals.cx.error(Code.MISSING_SECTION, f"multi-head latent attention needs kv_lora_rank ({', '.join(given)} given)", block.span)
        return False
    if "kv_lora_rank" not in found:
        return True
    missing = [k for k in ("qk_rope_dim", "qk_nope_dim", "v_head_dim") if k not in found]
    if missing:
        vals.cx.error(Code.MISSING_SECTION, f"multi-head latent attention needs {', '.join(missing)}", block.span)
        return False
    if "head_dim" in found:
        vals.cx.error(Code.DUPLICATE_PROPERTY, "with multi-head latent attention the head width is qk_nope_dim + qk_rope_dim "
                      "(and v_head_dim); head_dim does not apply", block.span)
        return False
    return True


def _moe_pattern(vals: Values, found: dict, block: surface.SubBlock) -> bool:
    """``moe_every``/``moe_offset``: whole numbers (with the layer counts) that leave at least one
    MoE layer; made constants so each stage's share of both kinds of layer is exact."""
    error = vals.cx.error
    if "moe_every" not in found:
        error(Code.MISSING_SECTION, "moe_offset picks the MoE layer within each moe_every layers; give moe_every too", block.span)
        return False
    keys = [k for k in ("layers", "dense_layers", "moe_every", "moe_offset") if k in found]
    got = {k: number(found[k], vals) for k in keys}
    bad = [k for k in keys if got[k] is None or got[k].denominator != 1 or got[k] < 0]
    if bad:
        error(Code.BAD_PROPERTY_VALUE, f"moe_every places MoE layers by index: {', '.join(bad)} must be whole numbers", block.span)
        return False
    L, d, k, r = (int(got.get(x, 0)) for x in ("layers", "dense_layers", "moe_every", "moe_offset"))
    if k < 1 or r >= k:
        error(Code.BAD_PROPERTY_VALUE, f"moe_every must be at least 1 and moe_offset below it (every {k}, offset {r})", block.span)
        return False
    if pg.moe_layers_below(L, d, k, r) == 0:
        error(Code.BAD_PROPERTY_VALUE, f"no layer is an MoE layer: of {L} layers, none from layer {d} on has index ≡ {r} (mod {k})",
              block.span)
        return False
    for x in keys:
        found[x] = ir.const(got[x])
    return True


# the model block's sections other than the transformer shape
def _attention(vals: Values, block: surface.SubBlock, fields: dict) -> None:
    """``attention { window = W }``: each query attends the keys of the last W positions, itself included
    (sliding-window attention; check.cpwindow); W a whole number of tokens, at least 1 (PL283)."""
    for p in props(vals, block.props, ("window", "chunk"), "attention"):
        v = None if p.value is None or isinstance(p.value, (surface.ModeMap, surface.Bool)) else \
            vals.count(p.value, {}, f"'{p.key}'")
        known = None if v is None else number(v, vals)  # a let folded too (window = w, let w = 3/2)
        if v is None or (known is not None and (known < 1 or known.denominator != 1)):
            got = "" if known is None else f" (not {known})"
            if p.key == "chunk":  # chunked (local) attention, Llama 4's attention_chunk_size (check.cpchunk)
                vals.cx.error(Code.CHUNK_SIZE, f"the attention chunk needs a whole number of tokens, at least 1{got} "
                              "(attention { chunk = 8192 })", p.span)
                continue
            vals.cx.error(Code.WINDOW_SIZE, f"the sliding window needs a whole number of tokens, at least 1{got} "
                          "(attention { window = 4096 })", p.span)
            continue
        fields["attention_chunk" if p.key == "chunk" else "attention_window"] = (v, p.span)


_SECTIONS = {"bytes": _bytes, "conventions": _conventions, "losses": _losses, "buckets": _buckets,
             "attention": _attention}
