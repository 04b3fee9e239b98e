"""Hugging Face ``config.json`` -> a transformer shape.

Input: the text of a model's ``config.json`` (read directly: no network, no hub, no
``transformers``). Output: ``HFShape``: the transformer fields of the DSL as exact numbers
and flags, the keys read, and the keys that change neither memory nor communication
(listed by ``--verbose``). An unknown ``model_type``, a missing or mistyped key is a
``DiagnosticError`` (PL140) located at the key in the JSON file.

Families: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2,
deepseek_v3, gemma, gemma2, gpt2, gpt_neox. docs/language.md ("A model from a Hugging Face
config") lists the keys each one reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from .configs import load_json

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
            "gemma", "gemma2", "gpt2", "gpt_neox")


@dataclass
class HFShape:
    fields: dict = field(default_factory=dict)  # transformer field -> int | Fraction | bool | str
    used: list = field(default_factory=list)  # config keys read
    ignored: list = field(default_factory=list)  # config keys that change no cost


def _position(text: str, key: str) -> tuple[int, int]:
    m = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    if not m:
        return 1, 1
    line = text.count("\n", 0, m.start()) + 1
    col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    return line, col


class _Reader:
    def __init__(self, cfg: dict, text: str, file: str):
        self.cfg, self.text, self.file = cfg, text, file
        self.used: list[str] = []

    def error(self, key: str | None, message: str, notes: tuple[str, ...] = ()) -> DiagnosticError:
        line, col = _position(self.text, key) if key else (1, 1)
        return DiagnosticError([Diagnostic(Code.BAD_CONFIG, message, Span(self.file, line, col, line,
                                                                     col + (len(key) + 2 if key else 1)),
                                           notes=notes)], {self.file: self.text})

    def has(self, key: str) -> bool:
        return key in self.cfg and self.cfg[key] is not None

    def int(self, key: str, default: int | None = None, low: int = 1) -> int:
        if not self.has(key):
            if default is not None:
                return default
            raise self.error(None, f"the config has no '{key}', which a {self.cfg.get('model_type')} model needs")
        v = self.cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise self.error(key, f"'{key}' must be an integer of at least {low}, not {json.dumps(v)}")
        self.used.append(key)
        return v

    def flag(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        v = self.cfg[key]
        if not isinstance(v, bool):
            raise self.error(key, f"'{key}' must be true or false, not {json.dumps(v)}")
        self.used.append(key)
        return v

    def number(self, key: str, default: Fraction) -> Fraction:
        if not self.has(key):
            return default
        v = self.cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise self.error(key, f"'{key}' must be a positive number, not {json.dumps(v)}")
        self.used.append(key)
        return Fraction(str(v))


def parse_config(text: str, file: str) -> HFShape:
    cfg = load_json(text, file, Code.BAD_CONFIG)
    if not isinstance(cfg, dict):
        raise DiagnosticError([Diagnostic(Code.BAD_CONFIG, "a config.json holds one JSON object", Span.point(file, 1, 1))],
                              {file: text})
    r = _Reader(cfg, text, file)
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        shown = json.dumps(kind) if kind is not None else "no model_type"
        raise r.error("model_type" if kind is not None else None, f"unsupported model_type {shown}",
                      (f"supported: {', '.join(FAMILIES)}",))
    r.used.append("model_type")
    f: dict = {}
    if kind == "gpt2":
        _gpt2(r, f)
    else:
        _decoder(r, f, kind)
    experts = _EXPERTS.get(kind)
    if experts is not None:
        experts(r, f, kind)
    _relations(r, f)
    return HFShape(f, r.used, sorted(k for k in cfg if k not in r.used))


def _gpt2(r: _Reader, f: dict) -> None:
    h = f["hidden"] = r.int("n_embd")
    f["layers"] = r.int("n_layer")
    f["heads"] = r.int("n_head")
    f["ffn"] = r.int("n_inner", 4 * h)
    f["vocab"] = r.int("vocab_size")
    f["position_embeddings"] = r.int("n_positions")
    f["tied_embeddings"] = r.flag("tie_word_embeddings", True)
    f["norm"], f["bias"], f["gated_mlp"] = "layernorm", True, False


def _decoder(r: _Reader, f: dict, kind: str) -> None:
    """The families with Hugging Face's common key names (hidden_size, num_hidden_layers ...)."""
    h = f["hidden"] = r.int("hidden_size")
    f["layers"] = r.int("num_hidden_layers")
    a = f["heads"] = r.int("num_attention_heads")
    f["kv_heads"] = r.int("num_key_value_heads", a)
    f["vocab"] = r.int("vocab_size")
    if kind == "gpt_neox":
        f["ffn"] = r.int("intermediate_size", 4 * h)
        f["tied_embeddings"] = r.flag("tie_word_embeddings", False)
        f["norm"], f["bias"], f["gated_mlp"] = "layernorm", True, False
    else:
        _gated(r, f, kind, h, a)


def _gated(r: _Reader, f: dict, kind: str, h: int, a: int) -> None:
    """The RMSNorm families with a gated MLP (llama and its descendants): head width, biases, norms."""
    f["ffn"] = r.int("intermediate_size")
    tied_default = kind in ("gemma", "gemma2")
    f["tied_embeddings"] = r.flag("tie_word_embeddings", tied_default)
    f["norm"], f["gated_mlp"] = "rmsnorm", True
    if r.has("head_dim") and not kind.startswith("deepseek"):
        dh = r.int("head_dim")
        if dh * a != h:
            f["head_dim"] = dh
    attention_bias = r.flag("attention_bias", False)
    mlp_bias = r.flag("mlp_bias", False)
    f["bias"] = attention_bias and mlp_bias
    if kind in ("qwen2", "qwen2_moe"):
        f["qkv_bias"] = True  # Qwen2's q, k and v projections carry biases (its attention_bias is implied)
    elif attention_bias and not mlp_bias:
        raise r.error("attention_bias", "attention biases without MLP biases are not modelled",
                      ("the DSL has biases on every linear layer (bias) or on q, k and v only (qkv_bias)",))
    if kind in ("qwen3", "qwen3_moe"):
        f["qk_norm"] = True
    if kind == "gemma2":
        f["norms_per_layer"] = 4


def _mixtral(r: _Reader, f: dict, kind: str) -> None:
    f["experts"] = r.int("num_local_experts")
    f["top_k"] = r.int("num_experts_per_tok")


def _qwen_moe(r: _Reader, f: dict, kind: str) -> None:
    f["experts"] = r.int("num_experts")
    f["top_k"] = r.int("num_experts_per_tok")
    f["expert_ffn"] = r.int("moe_intermediate_size")
    # Qwen: layer i is MoE unless it is in mlp_only_layers, when (i + 1) mod decoder_sparse_step = 0
    step = r.int("decoder_sparse_step", 1)
    only = r.cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise r.error("mlp_only_layers", f"'mlp_only_layers' must be a list of layer indices, not "
                      f"{json.dumps(r.cfg.get('mlp_only_layers'))}")
    if only:
        r.used.append("mlp_only_layers")
        if sorted(only) != list(range(len(only))):
            raise r.error("mlp_only_layers", f"dense layers {json.dumps(only)} that are not the first ones are not "
                          "modelled", ("dense_layers = k makes the first k layers dense",))
        f["dense_layers"] = len(only)
    if step > 1:
        f["moe_every"], f["moe_offset"] = step, step - 1
    if kind == "qwen2_moe" and r.int("shared_expert_intermediate_size", 0, low=0):
        f["shared_experts"] = 1
        f["shared_expert_ffn"] = r.int("shared_expert_intermediate_size", low=0)
        f["shared_expert_gate"] = True


def _deepseek(r: _Reader, f: dict, kind: str) -> None:
    f["experts"] = r.int("n_routed_experts")
    f["top_k"] = r.int("num_experts_per_tok")
    f["expert_ffn"] = r.int("moe_intermediate_size")
    shared = r.int("n_shared_experts", 0, low=0)
    if shared:
        f["shared_experts"] = shared
    dense = r.int("first_k_dense_replace", 0, low=0)
    if dense:
        f["dense_layers"] = dense
    freq = r.int("moe_layer_freq", 1)
    if freq > 1:  # DeepSeek: layer i is MoE when i >= first_k_dense_replace and i mod moe_layer_freq = 0
        f["moe_every"] = freq
    if r.has("q_lora_rank"):
        f["q_lora_rank"] = r.int("q_lora_rank")
    f["kv_lora_rank"] = r.int("kv_lora_rank")
    f["qk_rope_dim"] = r.int("qk_rope_head_dim")
    f["qk_nope_dim"] = r.int("qk_nope_head_dim")
    f["v_head_dim"] = r.int("v_head_dim")
    if kind == "deepseek_v3" or r.cfg.get("topk_method") == "noaux_tc":
        f["router_bias"] = True
        if r.has("topk_method"):
            r.used.append("topk_method")
    mtp = r.int("num_nextn_predict_layers", 0, low=0)
    if mtp:
        f["mtp_layers"] = mtp


# the mixture-of-experts keys of each family that has them
_EXPERTS = {"mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe, "deepseek_v2": _deepseek,
            "deepseek_v3": _deepseek}


# (field, bound field, the config key of the field): counts that cannot exceed another
_AT_MOST = (("top_k", "experts", "num_experts_per_tok"), ("kv_heads", "heads", "num_key_value_heads"),
            ("dense_layers", "layers", "first_k_dense_replace"), ("dense_layers", "layers", "mlp_only_layers"))


def _relations(r: "_Reader", f: dict) -> None:
    """A count past the one that bounds it (more routed experts per token than experts, more
    dense layers than layers) is an error at its key: it would make parameter counts negative."""
    for small, large, key in _AT_MOST:
        if small in f and large in f and key in r.used and f[small] > f[large]:
            raise r.error(key, f"'{key}' ({f[small]}) cannot exceed the model's {large} ({f[large]})")


def model_block_text(shape: HFShape, source: str) -> str:
    """The formatted ``model { transformer { ... } }`` block of a config."""
    lines = [f"# from {source}", "model {", "  transformer {"]
    for k, v in shape.fields.items():
        if v is True:
            lines.append(f"    {k}")
        elif v is False:
            lines.append(f"    {k} = false")
        else:
            lines.append(f"    {k} = {v}")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"
