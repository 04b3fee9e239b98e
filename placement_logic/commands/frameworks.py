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
import shlex
from fractions import Fraction

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError, Span
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


def deepspeed_to_spec(text: str, file: str, devices: int, model: str | None, params: int | None) -> str:
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiagnosticError([Diagnostic("PL141", f"not a JSON config: {exc.msg}",
                                          Span.point(file, exc.lineno, exc.colno))]) from None
    if not isinstance(cfg, dict):
        raise _err(file, "a DeepSpeed config is one JSON object")
    zero = cfg.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise _err(file, f"zero_optimization.stage must be 0, 1, 2 or 3, not {json.dumps(stage)}")
    off_opt = (zero.get("offload_optimizer") or {}).get("device", "none")
    off_par = (zero.get("offload_param") or {}).get("device", "none")
    if off_par not in ("none", None) and stage != 3:
        raise _err(file, "offload_param needs ZeRO stage 3")
    local = ""
    if off_opt not in ("none", None, "cpu", "nvme") or off_par not in ("none", None, "cpu", "nvme"):
        raise _err(file, "offload devices are cpu or nvme")
    where = {"cpu": "host", "nvme": "nvme"}
    if off_opt in ("none", None) and off_par in ("none", None):
        strategy = ("ddp", "zero1", "zero2", "zero3")[stage]
    else:
        # the optimizer state (and its gradients) in host memory or on NVMe; with offload_param the
        # parameters too, fetched a layer at a time
        if stage == 0:
            raise _err(file, "offload_optimizer needs ZeRO stage 1, 2 or 3")
        opt = where.get(off_opt, "host")
        pmode = "S* (unit = layer" + (f", residency = {where[off_par]})" if off_par in where else ")") \
            if stage == 3 else "R"
        grads = f"O (residency = {opt})" if stage >= 2 else "R"
        strategy = "ds_offload"
        local = (f"strategy ds_offload {{\n  role = data\n  params: {pmode}\n  optimizer: O (residency = {opt})\n"
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
    widths = "params = 2\n    grads = 2\n    optimizer = 12" if half else "params = 4\n    grads = 4\n    optimizer = 8"
    head = f'model from "{model}" {{\n' if model else f"model {{\n  params = {params}\n"
    spec = (f"# from the DeepSpeed config {file} on {devices} devices\n{head}"
            f"  bytes {{\n    {widths}\n  }}\n  microbatch = {mb}\n  microbatches = {gas}\n}}\n\n")
    spec += local + _mesh_and_plan([("dp", devices, strategy)], "deepspeed", [])
    return _imports(spec) + "\n" + spec


def plan_to_deepspeed(spec: ir.Spec, plan: ir.Plan) -> tuple[dict, list[str]]:
    problems: list[str] = []
    data = plan.axes_with_role(ir.Role.DATA)
    others = [a for a in plan.mesh.names if a not in data]
    if others:
        problems.append(f"axes {', '.join(others)} ({', '.join(plan.role(a).value for a in others)}): DeepSpeed's "
                        "config describes data parallelism only (tensor and pipeline parallelism come from the "
                        "model code or Megatron-DeepSpeed)")
    if len(data) > 1:
        problems.append("more than one data axis: DeepSpeed's ZeRO has one data-parallel group (hpZ aside)")
    cfg: dict = {}
    if data:
        a = data[0]
        p, o, g = (plan.placement(s).mode(a) for s in (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS))
        R, S, SS, O = ir.Mode.R, ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O
        table = {(R, R, R): 0, (R, S, R): 1, (R, S, S): 2, (SS, S, S): 3}
        if (p, o, g) in table:
            cfg["zero_optimization"] = {"stage": table[(p, o, g)]}
        elif p is R and o is O and g in (S, O):
            dev = "nvme" if plan.placement(ir.State.OPTIMIZER).residency is ir.Residency.NVME else "cpu"
            cfg["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": dev}}
        elif p is SS and o is O:
            def device(state: ir.State) -> str:
                return "nvme" if plan.placement(state).residency is ir.Residency.NVME else "cpu"

            zero = {"stage": 3, "offload_optimizer": {"device": device(ir.State.OPTIMIZER)}}
            if plan.placement(ir.State.PARAMS).offloaded:
                zero["offload_param"] = {"device": device(ir.State.PARAMS)}
            cfg["zero_optimization"] = zero
        else:
            problems.append(f"params {p.value}, optimizer {o.value}, grads {g.value} over {a}: no ZeRO stage places "
                            "them so")
    model = plan.model
    mb = _number(model.microbatch, spec)
    gas = _number(model.microbatches, spec)
    cfg["train_micro_batch_size_per_gpu"] = int(mb) if mb is not None else 1
    cfg["gradient_accumulation_steps"] = int(gas) if gas is not None else 1
    n = 1
    for a in data:
        n *= int(_number(plan.mesh.axis(a).size, spec) or 1)
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * n
    width = _number(model.bytes_params, spec)
    if width == 2:
        cfg["bf16"] = {"enabled": True}
    if plan.overrides:
        problems.append("overrides describe what a system does wrong; a config cannot ask for them")
    return cfg, problems


def _number(v: ir.Value | None, spec: ir.Spec) -> Fraction | None:
    return fold(v, dict(spec.bindings))


# --------------------------------------------------------------------------- Megatron-LM

_MEGATRON_INT = {
    "--tensor-model-parallel-size": "t", "--pipeline-model-parallel-size": "p", "--context-parallel-size": "c",
    "--expert-model-parallel-size": "e", "--num-layers-per-virtual-pipeline-stage": "layers_per_chunk",
    "--num-virtual-stages-per-pipeline-rank": "v", "--micro-batch-size": "mb", "--global-batch-size": "gbs",
    "--seq-length": "s", "--num-layers": "L", "--hidden-size": "h", "--num-attention-heads": "a",
    "--num-query-groups": "kv", "--ffn-hidden-size": "f", "--padded-vocab-size": "V", "--vocab-size": "V",
    "--num-experts": "E", "--moe-router-topk": "k", "--kv-channels": "dh",
}
_MEGATRON_FLAGS = {"--sequence-parallel": "sp", "--use-distributed-optimizer": "dist_opt", "--swiglu": "swiglu",
                   "--untie-embeddings-and-output-weights": "untie", "--disable-bias-linear": "no_bias",
                   "--group-query-attention": "gqa", "--bf16": "bf16", "--fp16": "fp16"}


def megatron_to_spec(text: str, file: str, devices: int) -> str:
    args = shlex.split(text, comments=True)
    got: dict = {}
    i = 0
    while i < len(args):
        a = args[i]
        key, _, inline = a.partition("=")
        if key in _MEGATRON_INT:
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if inline else 2
            if not value.isdigit() or int(value) < 1:
                raise _err(file, f"{key} needs a positive integer, not {value!r}")
            got[_MEGATRON_INT[key]] = int(value)
            continue
        if a in _MEGATRON_FLAGS:
            got[_MEGATRON_FLAGS[a]] = True
        elif a == "--recompute-granularity":
            if i + 1 >= len(args) or args[i + 1] not in ("selective", "full"):
                raise _err(file, "--recompute-granularity is selective or full")
            got["recompute"] = args[i + 1]
            i += 1
        elif a == "--normalization":
            if i + 1 >= len(args):
                raise _err(file, "--normalization needs a value")
            got["norm"] = {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}.get(args[i + 1])
            if got["norm"] is None:
                raise _err(file, f"--normalization {args[i + 1]} is not modelled (RMSNorm or LayerNorm)")
            i += 1
        i += 1
    t, p, c, e = (got.get(k, 1) for k in ("t", "p", "c", "e"))
    if devices % (t * p * c * e):
        raise _err(file, f"{devices} devices are not a multiple of tensor {t} × pipeline {p} × context {c} × "
                   f"expert {e}")
    dp = devices // (t * p * c * e)
    for need in ("L", "h", "a"):
        if need not in got:
            flag = next(k for k, v in _MEGATRON_INT.items() if v == need)
            raise _err(file, f"the arguments have no {flag}, which the model needs")
    tr = [f"hidden = {got['h']}", f"layers = {got['L']}", f"heads = {got['a']}",
          f"vocab = {got.get('V', 32000)}"]
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
    tr.append("tied_embeddings = false" if got.get("untie") else "tied_embeddings")
    if got.get("E", 1) > 1:
        tr += [f"experts = {got['E']}", f"top_k = {got.get('k', 2)}"]
    mb = got.get("mb", 1)
    m = 1
    if "gbs" in got:
        if got["gbs"] % (mb * dp):
            raise _err(file, f"--global-batch-size {got['gbs']} is not a multiple of micro batch {mb} × data "
                       f"parallel {dp}")
        m = got["gbs"] // (mb * dp)
    half = got.get("bf16") or got.get("fp16")
    widths = "params = 2\n    grads = 4\n    optimizer = 12" if half else "params = 4\n    grads = 4\n    optimizer = 8"
    model = ("model {\n  transformer {\n" + "".join(f"    {x}\n" for x in tr) + "  }\n"
             + f"  bytes {{\n    {widths}\n  }}\n" + (f"  seq = {got['s']}\n" if "s" in got else "")
             + f"  microbatch = {mb}\n  microbatches = {m}\n}}\n\n")
    v = got.get("v") or (got["L"] // (p * got["layers_per_chunk"]) if got.get("layers_per_chunk") else 1)
    pipe = f"interleaved_1f1b(v = {v})" if v > 1 else "one_f_one_b"
    axes = [("dp", dp, "zero1" if got.get("dist_opt") else "ddp"), ("cp", c, "context_parallel"),
            ("ep", e, "expert_parallel"), ("tp", t, "megatron_sp" if got.get("sp") else "megatron_tp"),
            ("pp", p, pipe)]
    extra = {"selective": ["use selective_recompute"], "full": ["use full_recompute"]}.get(got.get("recompute"), [])
    note = (" (the expert axis is kept apart from the data axis: Megatron-LM folds it into data parallelism)"
            if e > 1 else "")
    spec = (f"# from the Megatron-LM arguments in {file} on {devices} devices{note}\n" + model
            + _mesh_and_plan(axes, "megatron", extra))
    return _imports(spec) + "\n" + spec


def plan_to_megatron(spec: ir.Spec, plan: ir.Plan) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    out: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    roles = {a: plan.role(a) for a in plan.mesh.names}

    def one(role: ir.Role, flag: str) -> None:
        axes = [a for a, r in roles.items() if r is role]
        if len(axes) > 1:
            problems.append(f"{len(axes)} {role.value} axes: Megatron-LM has one")
        if axes:
            out.extend([flag, str(size[axes[0]])])

    one(ir.Role.TENSOR, "--tensor-model-parallel-size")
    if not [a for a, r in roles.items() if r is ir.Role.TENSOR]:
        one(ir.Role.SEQUENCE, "--tensor-model-parallel-size")
    one(ir.Role.PIPELINE, "--pipeline-model-parallel-size")
    one(ir.Role.CONTEXT, "--context-parallel-size")
    one(ir.Role.EXPERT, "--expert-model-parallel-size")
    if plan.sequence_parallel or any(r is ir.Role.SEQUENCE for r in roles.values()):
        out.append("--sequence-parallel")
    if plan.schedule is not None and plan.schedule.kind is ir.ScheduleKind.INTERLEAVED:
        v = _number(plan.schedule.chunks, spec)
        out += ["--num-virtual-stages-per-pipeline-rank", str(int(v))] if v else []
    elif plan.schedule is not None and plan.schedule.kind is ir.ScheduleKind.GPIPE:
        problems.append("GPipe: Megatron-LM schedules pipelines with 1F1B (interleaved or not)")
    data = [a for a, r in roles.items() if r is ir.Role.DATA]
    for a in data:
        p, o, g = (plan.placement(s).mode(a) for s in (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS))
        if (p, o, g) == (ir.Mode.R, ir.Mode.S, ir.Mode.R) or (p, o, g) == (ir.Mode.R, ir.Mode.S, ir.Mode.S):
            if "--use-distributed-optimizer" not in out:
                out.append("--use-distributed-optimizer")
        elif (p, o, g) != (ir.Mode.R, ir.Mode.R, ir.Mode.R):
            problems.append(f"params {p.value}, optimizer {o.value}, grads {g.value} over {a}: Megatron-LM shards "
                            "only the optimizer state (--use-distributed-optimizer); use FSDP for more")
    if plan.recompute is not ir.Recompute.NONE:
        out += ["--recompute-granularity", plan.recompute.value]
    t = plan.model.transformer
    if t is not None:
        for flag, v in (("--num-layers", t.layers), ("--hidden-size", t.hidden), ("--num-attention-heads", t.heads),
                        ("--ffn-hidden-size", t.ffn), ("--padded-vocab-size", t.vocab)):
            n = _number(v, spec)
            if n is not None:
                out += [flag, str(int(n))]
        kv, a = _number(t.kv_heads, spec), _number(t.heads, spec)
        if kv is not None and kv != a:
            out += ["--group-query-attention", "--num-query-groups", str(int(kv))]
        if t.gated_mlp:
            out.append("--swiglu")
        if t.norm == "rmsnorm":
            out += ["--normalization", "RMSNorm"]
        if not t.bias:
            out.append("--disable-bias-linear")
        if not t.tied_embeddings:
            out.append("--untie-embeddings-and-output-weights")
        E = _number(t.experts, spec)
        if E is not None and E > 1:
            out += ["--num-experts", str(int(E)), "--moe-router-topk", str(int(_number(t.top_k, spec) or 1))]
    model = plan.model
    for flag, v in (("--seq-length", model.seq), ("--micro-batch-size", model.microbatch)):
        n = _number(v, spec) if v is not None else None
        if n is not None:
            out += [flag, str(int(n))]
    mb, m = _number(model.microbatch, spec), _number(model.microbatches, spec)
    if mb is not None and m is not None:
        dp = 1
        for a in data:
            dp *= size[a]
        out += ["--global-batch-size", str(int(mb * m * dp))]
    if _number(model.bytes_params, spec) == 2:
        out.append("--bf16")
    if plan.overrides:
        problems.append("overrides describe what a system does wrong; arguments cannot ask for them")
    return out, problems
