"""Framework configurations in and out: DeepSpeed JSON and Megatron-LM arguments <-> specs
(torchtitan's job configs: ``commands.torchtitan``).

Input: a DeepSpeed ``ds_config.json`` or a Megatron-LM argument list, with the device
count (and, for DeepSpeed, the model: a Hugging Face config or a parameter count). Output:
the text of a spec (model, mesh, one plan) that ``placement`` reads; or, the other way, the
DeepSpeed config or Megatron-LM arguments of a plan, with the list of what that framework
cannot express for it. Every error is a PL141 diagnostic; nothing is executed.

DeepSpeed: ``zero_optimization.stage`` 0-3 -> ddp, zero1, zero2, zero3;
``offload_optimizer.device`` cpu or nvme -> zero_offload (stages 1-2) or zero_infinity (stage
3, with ``offload_param``); ``train_micro_batch_size_per_gpu`` and
``gradient_accumulation_steps`` -> microbatch and microbatches (``train_batch_size`` must
agree); ``bf16``/``fp16`` -> 2-byte weights and gradients with a 12-byte Adam state (fp32:
4, 4 and 8). Megatron-LM: the tensor, pipeline (with virtual stages), context and expert
sizes, ``--sequence-parallel``, ``--use-distributed-optimizer``, ``--recompute-granularity``
and the model shape flags.
"""

from __future__ import annotations

import json
import re
import shlex
from fractions import Fraction

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError, Span
from ..ir import groups as pg
from ..ir.walker import fold


def _err(file: str, message: str, notes: tuple[str, ...] = ()) -> DiagnosticError:
    return DiagnosticError([Diagnostic("PL141", message, Span.point(file, 1, 1), notes=notes)])


def _mesh_and_plan(axes: list[tuple[str, int, str]], plan: str, extra: list[str]) -> str:
    used = [(n, s, b) for n, s, b in axes if s > 1] or [axes[0]]
    mesh = "mesh {\n" + "".join(f"  {n} = {s}\n" for n, s, _ in used) + "}\n"
    body = "".join(f"  {n}: {b}\n" for n, _, b in used) + "".join(f"  {line}\n" for line in extra)
    return mesh + f"\nplan {plan} {{\n{body}}}\n"


def _imports(text: str) -> str:
    names = {"ddp": "data", "zero1": "data", "zero2": "data", "zero3": "data", "zero_offload": "offload",
             "zero_infinity": "offload", "megatron_tp": "tensor", "megatron_sp": "tensor",
             "one_f_one_b": "pipeline", "interleaved_1f1b": "pipeline", "context_parallel": "context",
             "expert_parallel": "expert", "selective_recompute": "recompute", "full_recompute": "recompute"}
    mods: dict[str, list[str]] = {}
    for name, mod in names.items():
        if f": {name}" in text or f"use {name}" in text:
            mods.setdefault(mod, []).append(name)
    return "".join(f"from std.{m} import {', '.join(sorted(ns))}\n" for m, ns in sorted(mods.items()))


# --------------------------------------------------------------------------- DeepSpeed


def _widths(half: bool, grads: int = 2) -> str:
    """The model's byte widths: 16-bit weights (gradients of ``grads`` bytes, a 12-byte Adam
    state with its fp32 master copy), or fp32 throughout."""
    if half:
        return f"params = 2\n    grads = {grads}\n    optimizer = 12\n    activations = 2"
    return "params = 4\n    grads = 4\n    optimizer = 8\n    activations = 4"


def _precision(spec: ir.Spec, model: ir.Model, half_grads: int, what: str, problems: list[str]) -> bool | None:
    """True for the 16-bit widths ``_widths(True, half_grads)``, False for fp32; otherwise a problem."""
    got = tuple(_number(v, spec) for v in (model.bytes_params, model.bytes_grads, model.bytes_optimizer,
                                           model.bytes_activations))
    if got == (2, half_grads, 12, 2):
        return True
    if got == (4, 4, 8, 4):
        return False
    shown = ", ".join("?" if v is None else str(v) for v in got)
    problems.append(f"bytes (params, grads, optimizer, activations) = ({shown}): {what} has 16-bit weights with "
                    f"{half_grads}-byte gradients and a 12-byte Adam state (2, {half_grads}, 12, 2), or fp32 "
                    "(4, 4, 8, 4)")
    return None


def _placement_options(plan: ir.Plan, state: ir.State, unit: str, reshard: bool | None, framework: str,
                       problems: list[str]) -> None:
    """An S* state's reconstruction unit, prefetch depth and resharding, as ``framework`` gathers."""
    pl = plan.placement(state)
    if not any(m is ir.Mode.S_STAR for _, m in pl.modes):
        return
    got = [f"unit = {pl.unit}" if pl.unit not in ("layer", "block") else "", f"prefetch = {pl.prefetch}" if pl.prefetch != 1 else "",
           f"reshard_after_forward = {str(pl.reshard_after_forward).lower()}"
           if reshard is not None and pl.reshard_after_forward is not reshard else ""]
    got = [g for g in got if g]
    if got:
        problems.append(f"{state.value} S* ({', '.join(got)}): {framework} gathers one layer at a time"
                        + (" and frees it after forward" if reshard else ""))


def deepspeed_to_spec(text: str, file: str, devices: int, model: str | None, params: int | None,
                      seq: int | None = None, problems: list[str] | None = None) -> str:
    """The spec of a DeepSpeed config; what the DSL cannot express is appended to ``problems``
    (and written as comments at the top of the spec)."""
    problems = [] if problems is None else problems
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiagnosticError([Diagnostic("PL141", f"not a JSON config: {exc.msg}",
                                          Span.point(file, exc.lineno, exc.colno))]) from None
    if not isinstance(cfg, dict):
        raise _err(file, "a DeepSpeed config is one JSON object")
    zero = cfg.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise _err(file, "zero_optimization must be a JSON object")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise _err(file, f"zero_optimization.stage must be 0, 1, 2 or 3, not {json.dumps(stage)}")
    off_opt = (zero.get("offload_optimizer") or {}).get("device", "none")
    off_par = (zero.get("offload_param") or {}).get("device", "none")
    if off_par not in ("none", None) and stage != 3:
        raise _err(file, "offload_param needs ZeRO stage 3")
    local = ""
    if off_opt not in ("none", None, "cpu", "nvme") or off_par not in ("none", None, "cpu", "nvme"):
        raise _err(file, "offload devices are cpu or nvme")
    hpz = zero.get("zero_hpz_partition_size", 1)
    if isinstance(hpz, bool) or not isinstance(hpz, int) or hpz < 1:
        raise _err(file, f"zero_hpz_partition_size must be a positive integer, not {json.dumps(hpz)}")
    if hpz > 1:
        problems.append(f"zero_hpz_partition_size {hpz}: ZeRO++'s secondary parameter partition (a second copy "
                        f"sharded over groups of {hpz} devices, gathered there in backward) has no placement; the "
                        "plan is plain ZeRO-3 over all the devices, without the secondary copy's memory and with "
                        "backward gathers over all of them")
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if zero.get(key):
            problems.append(f"{key}: ZeRO++'s quantized collectives are not modelled (full-width communication)")
    where = {"cpu": "host", "nvme": "nvme"}
    if off_opt in ("none", None) and off_par in ("none", None):
        strategy = ("ddp", "zero1", "zero2", "zero3")[stage]
    else:
        # the optimizer state in host memory or on NVMe, the gradient partitions in host memory (stage 2 and
        # 3); with offload_param the parameters too, fetched a layer at a time
        if stage == 0:
            raise _err(file, "offload_optimizer needs ZeRO stage 1, 2 or 3")
        pmode = "S* (unit = layer" + (f", residency = {where[off_par]})" if off_par in where else ")") \
            if stage == 3 else "R"
        if off_opt in where:
            optimizer, grads = f"O (residency = {where[off_opt]})", "O (residency = host)" if stage >= 2 else "R"
        else:  # the parameters alone offloaded (stage 3): optimizer state and gradients sharded on the device
            optimizer, grads = "S", "S"
        strategy = "ds_offload"
        local = (f"strategy ds_offload {{\n  role = data\n  params: {pmode}\n  optimizer: {optimizer}\n"
                 f"  grads: {grads}\n  activations: R\n}}\n\n")
    mb = cfg.get("train_micro_batch_size_per_gpu", 1)
    gas = cfg.get("gradient_accumulation_steps", 1)
    for key, v in (("train_micro_batch_size_per_gpu", mb), ("gradient_accumulation_steps", gas)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _err(file, f"{key} must be a positive integer, not {json.dumps(v)}")
    tb = cfg.get("train_batch_size")
    if tb is not None and tb != mb * gas * devices:
        raise _err(file, f"train_batch_size {tb} is not micro batch {mb} × accumulation {gas} × {devices} devices "
                   f"= {mb * gas * devices}")
    half = bool((cfg.get("bf16") or {}).get("enabled")) or bool((cfg.get("fp16") or {}).get("enabled"))
    head = f'model from "{model}" {{\n' if model else f"model {{\n  params = {params}\n"
    spec = (f"# from the DeepSpeed config {file} on {devices} devices\n"
            + "".join(f"# not expressed: {p}\n" for p in problems) + head
            + f"  bytes {{\n    {_widths(half)}\n  }}\n" + (f"  seq = {seq}\n" if seq else "")
            + f"  microbatch = {mb}\n  microbatches = {gas}\n}}\n\n")
    spec += local + _mesh_and_plan([("dp", devices, strategy)], "deepspeed", [])
    return _imports(spec) + "\n" + spec


def plan_to_deepspeed(spec: ir.Spec, plan: ir.Plan) -> tuple[dict, list[str]]:
    problems: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    data = [a for a in plan.axes_with_role(ir.Role.DATA) if size[a] > 1]
    others = [a for a in plan.mesh.names if a not in plan.axes_with_role(ir.Role.DATA) and size[a] > 1]
    if others:
        problems.append(f"axes {', '.join(others)} ({', '.join(plan.role(a).value for a in others)}): DeepSpeed's "
                        "config describes data parallelism only (tensor and pipeline parallelism come from the "
                        "model code or Megatron-DeepSpeed)")
    if len(data) > 1:
        problems.append("more than one data axis: DeepSpeed's ZeRO has one data-parallel group (its hpZ "
                        "secondary partition is not a placement)")
    cfg: dict = {}
    R, S, SS, O = ir.Mode.R, ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O
    for a in data[:1]:
        p, o, g, act = (plan.placement(s).mode(a) for s in ir.STATES)
        res = {s: plan.placement(s).residency for s in ir.STATES}

        def device(state: ir.State, res=res) -> str:
            return "nvme" if res[state] is ir.Residency.NVME else "cpu"

        table = {(R, R, R): 0, (R, S, R): 1, (R, S, S): 2, (SS, S, S): 3}
        if (p, o, g) in table:
            cfg["zero_optimization"] = {"stage": table[(p, o, g)]}
            if p is SS and plan.placement(ir.State.PARAMS).offloaded:
                cfg["zero_optimization"]["offload_param"] = {"device": device(ir.State.PARAMS)}
        elif (p, o, g) in ((R, O, R), (R, O, O), (SS, O, O)):
            stage = 1 if g is R else 2 if p is R else 3
            zero = {"stage": stage, "offload_optimizer": {"device": device(ir.State.OPTIMIZER)}}
            if p is SS and plan.placement(ir.State.PARAMS).offloaded:
                zero["offload_param"] = {"device": device(ir.State.PARAMS)}
            cfg["zero_optimization"] = zero
            if g is O and res[ir.State.GRADS] is not ir.Residency.HOST:
                problems.append(f"grads O (residency = {res[ir.State.GRADS].value}) over {a}: DeepSpeed keeps the "
                                "offloaded gradient partitions in host memory")
        elif p is R and o is O and g is S:
            cfg["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": device(ir.State.OPTIMIZER)}}
            problems.append(f"grads S over {a} with the optimizer offloaded: DeepSpeed's ZeRO-Offload moves the "
                            "gradient partitions to host memory too (grads: O (residency = host))")
        else:
            problems.append(f"params {p.value}, optimizer {o.value}, grads {g.value} over {a}: no ZeRO stage places "
                            "them so")
        if act is not R:
            problems.append(f"activations {act.value} over {a}: data parallelism keeps each replica's activations")
        _placement_options(plan, ir.State.PARAMS, "layer", None, "DeepSpeed", problems)
    model = plan.model
    mb = _number(model.microbatch, spec)
    gas = _number(model.microbatches, spec)
    cfg["train_micro_batch_size_per_gpu"] = int(mb) if mb is not None else 1
    cfg["gradient_accumulation_steps"] = int(gas) if gas is not None else 1
    n = 1
    for a in data:
        n *= size[a]
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * n
    if _precision(spec, model, 2, "DeepSpeed", problems) is not False:
        cfg["bf16"] = {"enabled": True}
    if plan.recompute is not ir.Recompute.NONE:
        problems.append(f"recompute = {plan.recompute.value}: activation checkpointing is chosen in the model code "
                        "(deepspeed.checkpointing), not in the DeepSpeed config")
    if plan.flash_attention:
        problems.append("flash_attention: the attention kernel is chosen in the model code, not in the config")
    if plan.overrides:
        problems.append("overrides describe what a system does wrong; a config cannot ask for them")
    return cfg, problems


def _number(v: ir.Value | None, spec: ir.Spec) -> Fraction | None:
    return fold(v, dict(spec.bindings))


# --------------------------------------------------------------------------- Megatron-LM

_MEGATRON_INT = {
    "--tensor-model-parallel-size": "t", "--pipeline-model-parallel-size": "p", "--context-parallel-size": "c",
    "--expert-model-parallel-size": "e", "--expert-tensor-parallel-size": "etp",
    "--num-layers-per-virtual-pipeline-stage": "layers_per_chunk",
    "--num-virtual-stages-per-pipeline-rank": "v", "--micro-batch-size": "mb", "--global-batch-size": "gbs",
    "--seq-length": "s", "--num-layers": "L", "--hidden-size": "h", "--num-attention-heads": "a",
    "--num-query-groups": "kv", "--ffn-hidden-size": "f", "--padded-vocab-size": "V", "--vocab-size": "vocab",
    "--make-vocab-size-divisible-by": "vdiv", "--max-position-embeddings": "maxpos",
    "--num-experts": "E", "--moe-router-topk": "k", "--kv-channels": "dh", "--moe-ffn-hidden-size": "ef",
    "--moe-shared-expert-intermediate-size": "sf", "--mtp-num-layers": "mtp", "--q-lora-rank": "qr",
    "--kv-lora-rank": "kvr", "--qk-head-dim": "qkd", "--qk-pos-emb-head-dim": "qkp", "--v-head-dim": "vd",
    "--recompute-num-layers": "rnl",
}
_MEGATRON_FLAGS = {"--sequence-parallel": "sp", "--use-distributed-optimizer": "dist_opt", "--swiglu": "swiglu",
                   "--untie-embeddings-and-output-weights": "untie", "--disable-bias-linear": "no_bias",
                   "--group-query-attention": "gqa", "--bf16": "bf16", "--fp16": "fp16", "--add-qkv-bias": "qkv_bias",
                   "--qk-layernorm": "qk_norm", "--multi-latent-attention": "mla",
                   "--moe-router-enable-expert-bias": "router_bias", "--use-flash-attn": "flash",
                   "--accumulate-allreduce-grads-in-fp32": "fp32_grads"}
_MEGATRON_CHOICES = {"--recompute-granularity": ("recompute", {"selective": "selective", "full": "full"}),
                     "--recompute-method": ("method", {"uniform": "uniform", "block": "block"}),
                     "--normalization": ("norm", {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}),
                     "--position-embedding-type": ("pos", {"rope": "rope", "learned_absolute": "learned",
                                                           "none": "none"})}


def _moe_layer_freq(text: str, layers: int, file: str) -> list[bool]:
    """Megatron-LM's --moe-layer-freq: an integer k (MoE on layers i with i mod k = 0) or a
    Python list of 0/1 per layer, written as list literals joined by + and repeated by *
    (``([0]*3+[1]*58)``); parsed here without evaluating anything."""
    t = text.replace(" ", "")
    if t.isdigit():
        k = int(t)
        if k < 1:
            raise _err(file, "--moe-layer-freq needs a positive integer or a list of 0/1 per layer")
        return [i % k == 0 for i in range(layers)]
    if t.startswith("(") and t.endswith(")"):
        t = t[1:-1]
    out: list[bool] = []
    for term in t.split("+"):
        m = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*(\d+))?", term)
        if m is None:
            raise _err(file, f"--moe-layer-freq {text!r} is neither an integer nor a list of 0/1 such as "
                       "([0]*3+[1]*58)")
        out += [x == "1" for x in m.group(1).split(",")] * int(m.group(2) or 1)
    if len(out) != layers:
        raise _err(file, f"--moe-layer-freq lists {len(out)} layers, not --num-layers {layers}")
    return out


def _fit_moe_pattern(moe: list[bool], file: str) -> dict[str, int]:
    """dense_layers, moe_every and moe_offset (as few as needed) for a per-layer MoE pattern."""
    ones = [i for i, m in enumerate(moe) if m]
    if not ones:
        raise _err(file, "--moe-layer-freq makes no layer an MoE layer")
    if ones == list(range(ones[0], len(moe))):
        return {"dense_layers": ones[0]} if ones[0] else {}
    k = ones[1] - ones[0] if len(ones) > 1 else len(moe)  # one MoE layer: a period longer than the model
    d, r = ones[0], ones[0] % k
    if moe != [i >= d and i % k == r for i in range(len(moe))]:
        raise _err(file, "--moe-layer-freq: MoE layers that are not every k-th layer after the first dense ones are "
                   "not modelled")
    out = {"moe_every": k}
    if r:
        out["moe_offset"] = r
    if d >= k:
        out["dense_layers"] = d
    return out


def _megatron_args(text: str, file: str) -> dict:
    args = shlex.split(text, comments=True)
    got: dict = {}
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, inline = a.partition("=")
        if key == "--moe-layer-freq":
            got["moe_freq"] = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            continue
        if key in _MEGATRON_INT or key in _MEGATRON_CHOICES:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            if key in _MEGATRON_INT:
                if not value.isdigit() or int(value) < 1:
                    raise _err(file, f"{key} needs a positive integer, not {value!r}")
                got[_MEGATRON_INT[key]] = int(value)
            else:
                name, table = _MEGATRON_CHOICES[key]
                if value not in table:
                    raise _err(file, f"{key} {value!r} is not modelled ({', '.join(table)})")
                got[name] = table[value]
            continue
        if a in _MEGATRON_FLAGS:
            got[_MEGATRON_FLAGS[a]] = True
        i += 1
    return got


def megatron_to_spec(text: str, file: str, devices: int, problems: list[str] | None = None) -> str:
    """The spec of Megatron-LM arguments; what the DSL cannot express is appended to ``problems``."""
    problems = [] if problems is None else problems
    got = _megatron_args(text, file)
    t, p, c, e = (got.get(k, 1) for k in ("t", "p", "c", "e"))
    if devices % (t * p * c):
        raise _err(file, f"{devices} devices are not a multiple of tensor {t} × pipeline {p} × context {c}")
    dp_all = devices // (t * p * c)  # Megatron-LM's data-parallel size; the expert size folds into it
    if dp_all % e:
        raise _err(file, f"--expert-model-parallel-size {e} does not divide the data-parallel size {dp_all} "
                   "(experts folded over context devices are not modelled)")
    dp = dp_all // e
    if got.get("etp", t) != t:
        problems.append(f"--expert-tensor-parallel-size {got['etp']}: experts split over a tensor size of their own "
                        f"(not {t}) have no placement; the plan splits them over the tensor axis")
    for need in ("L", "h", "a"):
        if need not in got:
            flag = next(k for k, v in _MEGATRON_INT.items() if v == need)
            raise _err(file, f"the arguments have no {flag}, which the model needs")
    if "V" not in got and "vocab" not in got:
        raise _err(file, "the arguments have no --padded-vocab-size or --vocab-size, which the model needs")
    tr = [f"hidden = {got['h']}", f"layers = {got['L']}", f"heads = {got['a']}"]
    if "V" in got:
        tr.append(f"vocab = {got['V']}")
    else:  # Megatron-LM pads the vocabulary to a multiple of make-vocab-size-divisible-by (128) × tensor size
        tr += [f"vocab = {got['vocab']}", f"vocab_multiple = {got.get('vdiv', 128) * t}"]
    if got.get("gqa") and "kv" in got:
        tr.append(f"kv_heads = {got['kv']}")
    if "f" in got:
        tr.append(f"ffn = {got['f']}")
    if got.get("dh") and got["dh"] * got["a"] != got["h"]:
        tr.append(f"head_dim = {got['dh']}")
    if got.get("swiglu"):
        tr.append("gated_mlp")
    tr.append(f"norm = {got.get('norm', 'layernorm')}")
    tr.append("bias = false" if got.get("no_bias") else "bias = true")
    if got.get("qkv_bias") and got.get("no_bias"):
        tr.append("qkv_bias")
    if got.get("qk_norm"):
        tr.append("qk_norm")
    tr.append("tied_embeddings = false" if got.get("untie") else "tied_embeddings")
    if got.get("pos", "learned") == "learned":  # Megatron-LM's default position embedding
        rows = got.get("maxpos", got.get("s"))
        if rows is None:
            raise _err(file, "learned absolute position embeddings (the default --position-embedding-type) need "
                       "--max-position-embeddings")
        tr.append(f"position_embeddings = {rows}")
    if got.get("mla"):
        for key, name in (("qr", "q_lora_rank"), ("kvr", "kv_lora_rank"), ("qkp", "qk_rope_dim"),
                          ("qkd", "qk_nope_dim"), ("vd", "v_head_dim")):
            if key in got:
                tr.append(f"{name} = {got[key]}")
            elif key != "qr":
                flag = next(k for k, v in _MEGATRON_INT.items() if v == key)
                raise _err(file, f"--multi-latent-attention needs {flag}")
    if got.get("E", 1) > 1:
        tr += [f"experts = {got['E']}", f"top_k = {got.get('k', 2)}"]
        if "ef" in got:
            tr.append(f"expert_ffn = {got['ef']}")
        if "sf" in got:
            tr += ["shared_experts = 1", f"shared_expert_ffn = {got['sf']}"]
        if got.get("router_bias"):
            tr.append("router_bias")
        if "moe_freq" in got:
            tr += [f"{k} = {v}" for k, v in _fit_moe_pattern(_moe_layer_freq(got["moe_freq"], got["L"], file),
                                                              file).items()]
    if got.get("mtp"):
        tr.append(f"mtp_layers = {got['mtp']}")
    mb = got.get("mb", 1)
    m = 1
    if "gbs" in got:
        if got["gbs"] % (mb * dp_all):
            raise _err(file, f"--global-batch-size {got['gbs']} is not a multiple of micro batch {mb} × data "
                       f"parallel {dp_all}")
        m = got["gbs"] // (mb * dp_all)
    half = got.get("bf16") or got.get("fp16")
    # bf16 keeps fp32 main gradients; fp16 too with --accumulate-allreduce-grads-in-fp32, else 16-bit ones
    grads = 4 if got.get("bf16") or got.get("fp32_grads") else 2
    model = ("model {\n  transformer {\n" + "".join(f"    {x}\n" for x in tr) + "  }\n"
             + f"  bytes {{\n    {_widths(bool(half), grads)}\n  }}\n" + (f"  seq = {got['s']}\n" if "s" in got else "")
             + f"  microbatch = {mb}\n  microbatches = {m}\n}}\n\n")
    v = got.get("v") or (got["L"] // (p * got["layers_per_chunk"]) if got.get("layers_per_chunk") else 1)
    pipe = f"interleaved_1f1b(v = {v})" if v > 1 else "one_f_one_b"
    axes = [("dp", dp, "zero1" if got.get("dist_opt") else "ddp"), ("cp", c, "context_parallel"),
            ("ep", e, "expert_parallel"), ("tp", t, "megatron_sp" if got.get("sp") else "megatron_tp"),
            ("pp", p, pipe)]
    extra = []
    if got.get("recompute") == "selective":
        extra.append("use selective_recompute")
    elif got.get("recompute") == "full":
        method, n = got.get("method", "uniform"), got.get("rnl", 1)
        per_chunk = got["L"] // (p * v)
        if (method, n) == ("uniform", 1) or (method == "block" and n >= per_chunk):
            extra.append("use full_recompute")
        else:
            what = (f"checkpointing groups of {n} layers" if method == "uniform" else
                    f"recomputing only {n} of the {per_chunk} layers of each chunk")
            problems.append(f"--recompute-method {method} --recompute-num-layers {n}: {what} is not modelled (full "
                            "recompute keeps each layer's input and recomputes every layer: uniform 1, or block over "
                            "every layer of a chunk); the plan recomputes every layer")
            extra.append("use full_recompute")
    if got.get("flash"):
        extra.append("flash_attention")
    note = (" (the expert axis divides Megatron-LM's data-parallel devices: dense parameters are replicated over "
            "dp × ep, experts over dp)" if e > 1 else "")
    spec = (f"# from the Megatron-LM arguments in {file} on {devices} devices{note}\n"
            + "".join(f"# not expressed: {q}\n" for q in problems) + model
            + _mesh_and_plan(axes, "megatron", extra))
    return _imports(spec) + "\n" + spec


# the placements (params, optimizer, grads, activations) Megatron-LM gives each role; data: DDP or the
# distributed optimizer
_R, _S = ir.Mode.R, ir.Mode.S
_MEGATRON_MODES = {ir.Role.TENSOR: ((_S, _S, _S, _S),), ir.Role.SEQUENCE: ((_S, _S, _S, _S),),
                   ir.Role.PIPELINE: ((_S, _S, _S, _S),), ir.Role.CONTEXT: ((_R, _R, _R, _S),),
                   ir.Role.EXPERT: ((_S, _S, _S, _R),), ir.Role.DATA: ((_R, _R, _R, _R), (_R, _S, _R, _R))}


def _modes(plan: ir.Plan, a: str) -> tuple[ir.Mode, ...]:
    return tuple(plan.placement(s).mode(a) for s in ir.STATES)


def _role_problems(plan: ir.Plan, axes: list[str], allowed: dict, framework: str, problems: list[str]) -> None:
    for a in axes:
        got = _modes(plan, a)
        role = plan.role(a)
        if role not in allowed:
            why = {ir.Role.EXPERT: f"{framework} borrows its expert devices from the data-shard and context devices "
                                   "(parallel folding); an expert axis of its own has no degree there"}
            problems.append(f"{a} ({role.value}): " + why.get(role, f"{framework} has no {role.value} parallelism"))
        elif got not in allowed[role]:
            want = " or ".join("(" + ", ".join(m.value for m in w) + ")" for w in allowed[role])
            problems.append(f"params, optimizer, grads, activations ({', '.join(m.value for m in got)}) over {a}: "
                            f"{framework}'s {role.value} parallelism places them {want}")
        for s in ir.STATES:
            if plan.placement(s).mode(a) is not ir.Mode.S_STAR and plan.placement(s).offloaded:
                problems.append(f"{s.value} offloaded to {plan.placement(s).residency.value}: not exported ("
                                f"{framework}'s configuration has no offload of this kind that the plan models)")
                break


def plan_to_megatron(spec: ir.Spec, plan: ir.Plan) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    out: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    roles = {a: plan.role(a) for a in plan.mesh.names if size[a] > 1}
    _role_problems(plan, list(roles), _MEGATRON_MODES, "Megatron-LM", problems)

    def one(role: ir.Role, flag: str) -> None:
        axes = [a for a, r in roles.items() if r is role]
        if len(axes) > 1:
            problems.append(f"{len(axes)} {role.value} axes: Megatron-LM has one")
        if axes:
            out.extend([flag, str(size[axes[0]])])

    tensor = [a for a, r in roles.items() if r in (ir.Role.TENSOR, ir.Role.SEQUENCE)]
    if len(tensor) > 1:
        problems.append(f"{len(tensor)} tensor axes: Megatron-LM has one")
    if tensor:
        out += ["--tensor-model-parallel-size", str(size[tensor[0]])]
    one(ir.Role.PIPELINE, "--pipeline-model-parallel-size")
    one(ir.Role.CONTEXT, "--context-parallel-size")
    one(ir.Role.EXPERT, "--expert-model-parallel-size")
    if plan.sequence_parallel or any(r is ir.Role.SEQUENCE for r in roles.values()):
        out.append("--sequence-parallel")
    pipelined = any(r is ir.Role.PIPELINE for r in roles.values())
    v = 1
    if pipelined and plan.schedule is not None and plan.schedule.kind is ir.ScheduleKind.INTERLEAVED:
        v = int(_number(plan.schedule.chunks, spec) or 1)
        if v > 1:
            out += ["--num-virtual-stages-per-pipeline-rank", str(v)]
    elif pipelined and plan.schedule is not None and plan.schedule.kind is not ir.ScheduleKind.ONE_F_ONE_B:
        problems.append(f"schedule {plan.schedule.kind.value}: Megatron-LM schedules pipelines with 1F1B "
                        "(interleaved or not)")
    data = [a for a, r in roles.items() if r is ir.Role.DATA]
    if len(data) > 1:
        problems.append(f"{len(data)} data axes ({', '.join(data)}): Megatron-LM has one data-parallel group")
    if any(_modes(plan, a)[1] is ir.Mode.S for a in data):
        out.append("--use-distributed-optimizer")
        if any(_modes(plan, a)[1] is ir.Mode.R for a in data):
            problems.append("the optimizer sharded over some data axes only: Megatron-LM's distributed optimizer "
                            "shards over the whole data-parallel group")
    if plan.recompute is ir.Recompute.SELECTIVE:
        out += ["--recompute-granularity", "selective"]
    elif plan.recompute is ir.Recompute.FULL:
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if plan.flash_attention:
        out.append("--use-flash-attn")
    t = plan.model.transformer
    if t is None:
        problems.append("a model without a transformer shape: Megatron-LM's arguments describe the model's shape")
    else:
        out += _megatron_model(spec, t, size[tensor[0]] if tensor else 1, problems)
    model = plan.model
    for flag, val in (("--seq-length", model.seq), ("--micro-batch-size", model.microbatch)):
        n = _number(val, spec) if val is not None else None
        if n is not None:
            out += [flag, str(int(n))]
    mb, m = _number(model.microbatch, spec), _number(model.microbatches, spec)
    if mb is not None and m is not None:
        dp = 1
        for a, r in roles.items():  # Megatron-LM's data-parallel size holds the expert devices
            dp *= size[a] if r in (ir.Role.DATA, ir.Role.EXPERT) else 1
        out += ["--global-batch-size", str(int(mb * m * dp))]
    if _precision(spec, model, 4, "Megatron-LM", []) is True:
        out.append("--bf16")  # fp32 main gradients
    elif _precision(spec, model, 2, "Megatron-LM", []) is True:
        out.append("--fp16")  # 16-bit gradients (no --accumulate-allreduce-grads-in-fp32)
    elif _precision(spec, model, 4, "Megatron-LM", problems) is None:
        problems[-1] = problems[-1].replace("or fp32", "(2, 2, 12, 2) with --fp16, or fp32")
    if plan.overrides:
        problems.append("overrides describe what a system does wrong; arguments cannot ask for them")
    return out, problems


def _megatron_model(spec: ir.Spec, t: ir.TransformerShape, tp: int, problems: list[str]) -> list[str]:
    out: list[str] = []

    def num(v) -> int | None:
        n = _number(v, spec)
        return None if n is None else int(n)

    for flag, v in (("--num-layers", t.layers), ("--hidden-size", t.hidden), ("--num-attention-heads", t.heads),
                    ("--ffn-hidden-size", t.ffn)):
        if num(v) is not None:
            out += [flag, str(num(v))]
    vm = num(t.vocab_multiple) if t.vocab_multiple is not None else None
    if vm is None:
        out += ["--padded-vocab-size", str(num(t.vocab))]
    elif vm % tp == 0:
        out += ["--vocab-size", str(num(t.vocab)), "--make-vocab-size-divisible-by", str(vm // tp)]
    else:
        out += ["--padded-vocab-size", str(num(t.vocab))]
        problems.append(f"vocab_multiple = {vm}: Megatron-LM pads to a multiple of the tensor size {tp}")
    kv, a = num(t.kv_heads), num(t.heads)
    if kv is not None and kv != a:
        out += ["--group-query-attention", "--num-query-groups", str(kv)]
    if t.head_dim is not None and num(t.head_dim) is not None and num(t.head_dim) * a != num(t.hidden):
        out += ["--kv-channels", str(num(t.head_dim))]
    if t.gated_mlp:
        out.append("--swiglu")
    if t.norm == "rmsnorm":
        out += ["--normalization", "RMSNorm"]
    if not t.bias:
        out.append("--disable-bias-linear")
        if t.qkv_bias:
            out.append("--add-qkv-bias")
    elif t.qkv_bias is False:
        problems.append("bias without qkv_bias: Megatron-LM's linear biases include q, k and v")
    if t.qk_norm:
        out.append("--qk-layernorm")
    if not t.tied_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    if t.position_embeddings is not None:
        out += ["--position-embedding-type", "learned_absolute", "--max-position-embeddings",
                str(num(t.position_embeddings))]
    else:
        out += ["--position-embedding-type", "rope"]
    if t.kv_lora_rank is not None:
        out.append("--multi-latent-attention")
        for flag, v in (("--q-lora-rank", t.q_lora_rank), ("--kv-lora-rank", t.kv_lora_rank),
                        ("--qk-head-dim", t.qk_nope_dim), ("--qk-pos-emb-head-dim", t.qk_rope_dim),
                        ("--v-head-dim", t.v_head_dim)):
            if v is not None:
                out += [flag, str(num(v))]
    E = num(t.experts)
    if E is not None and E > 1:
        out += ["--num-experts", str(E), "--moe-router-topk", str(num(t.top_k) or 1)]
        if t.expert_ffn is not None:
            out += ["--moe-ffn-hidden-size", str(num(t.expert_ffn))]
        if t.shared_experts is not None and num(t.shared_experts):
            n = num(t.shared_experts)
            width = num(t.shared_expert_ffn if t.shared_expert_ffn is not None else
                        t.expert_ffn if t.expert_ffn is not None else t.ffn)
            out += ["--moe-shared-expert-intermediate-size", str(n * width)]
            if n > 1:
                problems.append(f"shared_experts = {n}: Megatron-LM has one shared expert of width "
                                f"{n} × {width} (the same parameters and memory)")
        if t.router_bias:
            out.append("--moe-router-enable-expert-bias")
        if t.shared_expert_gate:
            problems.append("shared_expert_gate: Megatron-LM's shared expert has no output gate")
        if num(t.capacity_factor) != 1:
            problems.append(f"capacity_factor = {_number(t.capacity_factor, spec)}: not exported "
                            "(--moe-expert-capacity-factor drops tokens, which the plan does not model)")
        pattern = pg.moe_pattern(t)
        L, d = num(t.layers), num(t.dense_layers) if t.dense_layers is not None else 0
        if pattern is not None:
            _, d, k, r = pattern
            if d == 0 and r == 0:
                out += ["--moe-layer-freq", str(k)]
            else:
                out += ["--moe-layer-freq", "[" + ",".join("1" if i >= d and i % k == r else "0" for i in range(L))
                        + "]"]
        elif d:
            out += ["--moe-layer-freq", f"([0]*{d}+[1]*{L - d})"]
    if t.mtp_layers is not None and num(t.mtp_layers):
        out += ["--mtp-num-layers", str(num(t.mtp_layers))]
    if t.norms_per_layer is not None and num(t.norms_per_layer) != 2:
        problems.append(f"norms_per_layer = {num(t.norms_per_layer)}: Megatron-LM's layers have two norms")
    return out
