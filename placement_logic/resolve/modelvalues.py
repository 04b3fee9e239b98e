"""The model's numbers held to their ranges: sizes and counts positive (a few may be 0), counts of
whole things whole, and shape fields held to one another. Run on the written model and on every
re-bound one (``--set``, sweep points, search rows: resolve.validate)."""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code
from .shapes import number

MODEL_PROPS = ("params", "seq", "microbatch", "microbatches")
TRANSFORMER_NUMERIC = ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k",
                       "capacity_factor", "head_dim", "position_embeddings", "q_lora_rank", "kv_lora_rank",
                       "qk_rope_dim", "qk_nope_dim", "v_head_dim", "expert_ffn", "shared_experts", "shared_expert_ffn",
                       "dense_layers", "mtp_layers", "norms_per_layer", "vocab_multiple", "moe_every", "moe_offset")


# (smaller, larger, why): a shape field that cannot exceed another
_AT_MOST = (
    ("top_k", "experts", "each token is routed to top_k of the experts"),
    ("kv_heads", "heads", "grouped-query attention shares each kv head among whole groups of heads"),
    ("dense_layers", "layers", "the dense layers are the first layers of the model"),
)
# shape fields that may be 0 (every other numeric field is a positive size or count)
_MAY_BE_ZERO = ("dense_layers", "mtp_layers", "shared_experts", "moe_offset")


# shape fields that may be fractions (every other one counts whole things)
_FRACTIONAL = ("capacity_factor",)
_UNITS = {"layers": "layers", "dense_layers": "layers", "mtp_layers": "layers", "heads": "heads", "kv_heads": "heads",
          "experts": "experts", "top_k": "experts", "shared_experts": "experts", "params": "parameters",
          "seq": "tokens", "microbatch": "sequences", "microbatches": "microbatches", "norms_per_layer": "norms"}


def _where(value, fallback):
    span = getattr(value, "span", None)
    return span if span is not None and span.line else fallback


def check_shape_values(shape: ir.TransformerShape, vals, error, fallback) -> None:
    """The shape's numeric fields where they are numbers: sizes and counts positive (a few may be
    0, ``_MAY_BE_ZERO``) and held to one another (``_AT_MOST``): a value past its bound would make
    parameter counts negative or meaningless. Run on the written shape and on every re-bound one."""
    for name in TRANSFORMER_NUMERIC:
        v = getattr(shape, name, None)
        n = number(v, vals) if v is not None else None
        span = getattr(v, "span", None)
        if n is None or span is None or not span.line or span.file != vals.cx.file:
            continue  # a value derived from others (ffn = 4h) is judged where they were given
        if n < 0 or (n == 0 and name not in _MAY_BE_ZERO):
            least = "at least 0" if name in _MAY_BE_ZERO else "positive"
            error(Code.BAD_PROPERTY_VALUE, f"{name} must be {least}, not {_show(n)}", _where(v, fallback))
        elif name not in _FRACTIONAL and n != int(n):
            error(Code.BAD_PROPERTY_VALUE, f"{name} counts whole {_UNITS.get(name, 'units')}: it must be a whole "
                  f"number, not {_show(n)}", _where(v, fallback))
    for small, large, why in _AT_MOST:
        a, b = (number(getattr(shape, f, None), vals) if getattr(shape, f, None) is not None else None
                for f in (small, large))
        if a is not None and b is not None and a > b:
            error(Code.BAD_PROPERTY_VALUE, f"{small} ({_show(a)}) cannot exceed {large} ({_show(b)}): {why}",
                  _where(getattr(shape, small), fallback))


def check_model_values(model: ir.Model, vals, error) -> None:
    """The model's counts where they are numbers: Ψ, the sequence, the microbatch and the
    number of microbatches positive; and its transformer shape's fields (``check_shape_values``)."""
    for name in MODEL_PROPS:
        v = getattr(model, name, None)
        n = number(v, vals) if v is not None else None
        if n is not None and n <= 0:
            error(Code.BAD_PROPERTY_VALUE, f"'{name}' must be positive, not {_show(n)}", _where(v, model.span))
        elif n is not None and n != int(n):
            error(Code.BAD_PROPERTY_VALUE, f"'{name}' counts whole {_UNITS[name]}: it must be a whole number, not "
                  f"{_show(n)}", _where(v, model.span))
    if model.transformer is not None:
        check_shape_values(model.transformer, vals, error, model.span)


def _show(x: Fraction) -> str:
    """Exact: an integer, a short decimal when it is one (3.5), else the fraction (8/3)."""
    if x.denominator == 1:
        return str(x.numerator)
    short = f"{float(x):g}"
    return short if Fraction(short) == x else f"{x.numerator}/{x.denominator}"
