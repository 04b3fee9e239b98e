"""torchtitan job configs (``job.toml``) in and out, beside ``interop.frameworks``.

``[parallelism]``: data-parallel shard degree (FSDP; -1 takes the rest of the devices) and
replicate degree (with a shard degree HSDP, alone DDP), tensor (with sequence parallelism),
pipeline with its schedule, context, expert and expert tensor (MoE parallel folding: the expert
group's roles on the data-shard, context and tensor axes); ``[training]`` local and global batch, sequence
length, mixed precision; ``[activation_checkpoint] mode``. Errors are PL141.
"""

from __future__ import annotations

import json
from functools import partial

from .. import ir
from ..diagnostics import Code
from ..frontend.configs import Table, load_toml
from ..ir import optimizers as opt
from ..ir import views
from .framework_common import (
    ImportReport,
    _axis_line,
    _imports,
    _mesh_and_plan,
    _number,
    _placement_options,
    _precision,
    _role_problems,
    _widths,
    dropped_keys,
    links_assumption,
    near_misses,
    node_links,
    per_node_source,
)


def _has_experts(model: str | None) -> bool:
    """Whether the model's Hugging Face config (read directly) has routed experts."""
    if model is None:
        return False
    from ..frontend import hf
    from ..frontend.loader import read_source

    return int(hf.parse_config(read_source(model), model).fields.get("experts", 1) or 1) > 1


_TITAN_SCHEDULES = {"1f1b": "one_f_one_b", "gpipe": "gpipe", "interleaved1f1b": "interleaved_1f1b"}


DROPPED = {"job": "the run's name and output folder", "metrics": "logging", "checkpoint": "checkpoint saving: "
           "not part of a training step", "profiling": "profiling", "comm": "timeouts and tracing",
           "model": "the model comes from --model or --params", "optimizer": "the optimizer's type and "
           "hyper-parameters: the plan's optimizer state is bytes { optimizer } (a 12-byte Adam state in mixed "
           "precision)", "lr_scheduler": "the learning-rate schedule: no memory or communication",
           "training.steps": "the run's length", "training.dataset": "the data", "training.dataset_path": "the data",
           "training.max_norm": "clipping by the global norm: its scalar all-reduce is not priced",
           "training.mixed_precision_reduce": "the reduction's data type: the plan sends gradients at bytes { grads }",
           "compile": "torch.compile: kernels, not memory or communication the plan models",
           "float8": "float8 training is not modelled (the plan's widths are bytes { ... })",
           "validation": "evaluation: not part of a training step"}
_DEFAULT = ("not read: from a torchtitan job the plan takes the parallel degrees, the pipeline schedule, the batch, "
            "the sequence length, the precision and activation checkpointing")


def _degrees(par: Table, devices: int) -> tuple[int, int, int, int, int, int]:
    """The replicate, shard, tensor, pipeline, context and expert degrees (a shard degree of -1 takes the rest)."""
    def degree(key: str, default: int = 1) -> int:
        return par.integer(key, default, allowed=(-1,) if key.endswith("shard_degree") else ())

    rep, shard = degree("data_parallel_replicate_degree"), degree("data_parallel_shard_degree", -1)
    t, p, c, e = (degree(k) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                      "context_parallel_degree", "expert_parallel_degree"))
    fixed = rep * t * p * c * (shard if shard != -1 else 1)
    if devices % fixed:
        raise par.error(None, f"{devices} devices are not a multiple of the degrees given ({fixed})")
    if shard == -1:
        shard = devices // fixed
    if rep * shard * t * p * c != devices:
        raise par.error(None, f"the degrees multiply to {rep * shard * t * p * c}, not {devices} devices")
    return rep, shard, t, p, c, e


def _expert_fold(par: Table, model: str | None, degrees: tuple, etp: int,
                 problems: list[str]) -> tuple[int, dict[str, str]]:
    """The data-shard devices inside the expert degree and the expert group's roles of the axes."""
    rep, shard, t, _, c, e = degrees
    if (shard * c) % e:
        raise par.error("expert_parallel_degree", f"expert_parallel_degree {e} does not divide the data-shard × "
                        "context devices")
    if etp not in (1, t):
        raise par.error("expert_tensor_parallel_degree", f"parallelism.expert_tensor_parallel_degree {etp!r} is 1 "
                        f"or the tensor degree {t}")
    borrowed = c * (t if etp == 1 else 1)  # the expert degree takes in all of context (and tensor when etp = 1)
    if e % borrowed or shard % (e // borrowed):
        raise par.error("expert_parallel_degree", f"expert_parallel_degree {e} is not the context degree {c}"
                        + (f" × the tensor degree {t}" if etp == 1 else "")
                        + f" × a divisor of the data-shard degree {shard}")
    if not _has_experts(model):
        problems.append(f"expert_parallel_degree {e}: the model has no experts to place (give the model's config "
                        "with --model)")
        return 1, {}
    if rep > 1 and shard > 1:
        problems.append(f"expert_parallel_degree {e} with HSDP: the experts folded over the data-shard devices "
                        "beside a replicate degree are not written; the plan has no expert axis, so every device "
                        "holds every expert")
        return 1, {}
    in_ep = e // borrowed
    return in_ep, {a: "expert" for a, n in (("dp_ep", in_ep), ("cp", c), ("tp", t if etp == 1 else 1)) if n > 1}


def _batch(training: Table, dp: int) -> tuple[int, int | None, int]:
    """The local batch, the sequence length and the micro-batches per step."""
    mb = training.integer("local_batch_size", None) or training.integer("batch_size", 1)
    seq = training.integer("seq_len", None)
    gbs = training.integer("global_batch_size", -1, allowed=(-1,))
    if gbs <= 0:
        return mb, seq, 1
    if gbs % (mb * dp):
        raise training.error("global_batch_size", f"training.global_batch_size {gbs} is not a multiple of local "
                             f"batch {mb} × data {dp}")
    return mb, seq, gbs // (mb * dp)


def _pipeline(par: Table) -> str:
    """The pipeline schedule's strategy."""
    sched = (par.string("pipeline_parallel_schedule", "1F1B") or "1F1B").lower()
    if sched not in _TITAN_SCHEDULES:
        raise par.error("pipeline_parallel_schedule", f"pipeline_parallel_schedule {par.raw('pipeline_parallel_schedule')!r} "
                        f"is not modelled (known: {', '.join(sorted(_TITAN_SCHEDULES))})")
    pipe = _TITAN_SCHEDULES[sched]
    if pipe == "interleaved_1f1b":
        v = par.integer("pipeline_parallel_virtual_stages", 2)
        pipe = f"interleaved_1f1b(v = {v})" if v > 1 else "one_f_one_b"
    return pipe


def _spec_imports(spec: str) -> str:
    """The imports of the written spec, torchtitan's data strategies and GPipe included."""
    imports = _imports(spec)
    extra_imports = [n for n in ("hybrid_shard", "fsdp_full_shard", "fsdp_shard_grad_op") if n in spec]
    if extra_imports:
        imports = f"from std.data import {', '.join(extra_imports)}\n" + imports
    if "gpipe" in spec and "gpipe" not in imports:
        imports += "from std.pipeline import gpipe\n"
    return imports


def torchtitan_to_spec(text: str, file: str, devices: int, model: str | None, params: int | None,
                       problems: list[str] | None = None, *, report: ImportReport | None = None,
                       per_node: int | None = None) -> str:
    """The spec of a torchtitan job config; what the DSL cannot express is appended to ``problems``,
    what was assumed and the keys read and dropped to ``report``."""
    problems = [] if problems is None else problems
    report = ImportReport() if report is None else report
    doc = load_toml(text, file, Code.BAD_FRAMEWORK_CONFIG)
    cfg = Table(doc, text, file, Code.BAD_FRAMEWORK_CONFIG)
    par = cfg.table("parallelism")
    training = cfg.table("training")
    degrees = _degrees(par, devices)
    rep, shard, t, p, c, e = degrees
    etp = par.integer("expert_tensor_parallel_degree", t if e > 1 else 1)
    in_ep, roles = _expert_fold(par, model, degrees, etp, problems) if e > 1 else (1, {})
    mb, seq, m = _batch(training, rep * shard)
    ckpt = cfg.table("activation_checkpoint")
    ac = ckpt.choice("mode", ("none", "selective", "full"), "selective")
    option = str(ckpt.raw("selective_ac_option", "op"))
    if ac == "selective" and option != "op":
        problems.append(f"selective_ac_option {option!r}: checkpointing every {option}-th layer whole is not "
                        "modelled (the DSL's selective recompute is per operation, Megatron-LM's attention core); "
                        "the plan recomputes selectively")
    mixed = training.string("mixed_precision_param", "bfloat16")
    head = f'model from "{model}" {{\n' if model else f"model {{\n  params = {params}\n"
    group = ("  group experts {\n    role = {" + ", ".join(f"{a}: {r}" for a, r in roles.items()) + "}\n  }\n"
             if roles else "")
    model_text = (head + f"  bytes {{\n    {_widths(mixed in ('bfloat16', 'float16'))}\n  }}\n"
                  + (f"  seq = {seq}\n" if seq else "") + f"  microbatch = {mb}\n  microbatches = {m}\n" + group
                  + "}\n\n")
    pipe = _pipeline(par)
    reshard = par.choice("fsdp_reshard_after_forward", ("default", "always", "never"), "default")
    # torchtitan's default keeps the parameters gathered between forward and backward under pipelining
    keep = reshard == "never" or (reshard == "default" and p > 1)
    fsdp = "fsdp_shard_grad_op" if keep else "fsdp_full_shard"
    axes: list[tuple[str, int, str]] = []
    extra: list[str] = []
    if rep > 1 and shard > 1:
        mesh_axes = [("replicate", rep), ("shard", shard)]
        extra.append("[replicate, shard]: " + ("titan_hsdp" if keep else "hybrid_shard"))
    elif rep > 1:
        axes.append(("dp", rep, "ddp"))
    else:  # with experts folded over data-shard devices: dp_shard_mod_ep, dp_shard_in_ep
        axes += [("dp", shard // in_ep, fsdp), ("dp_ep", in_ep, fsdp)]
    axes += [("cp", c, "context_parallel"), ("tp", t, "megatron_sp"), ("pp", p, pipe)]
    if ac != "none":
        extra.append(f"use {ac}_recompute")
    extra.append("flash_attention")  # torchtitan's models attend with scaled_dot_product_attention
    data_inner = ([("shard", shard), ("replicate", rep)] if rep > 1 and shard > 1 else [("dp", rep)] if rep > 1
                  else [("dp_ep", in_ep), ("dp", shard // in_ep)])
    per, source = per_node_source(per_node, None, "a torchtitan job")
    links = node_links([("tp", t), ("cp", c)] + data_inner + [("pp", p)], per)
    report.assumed.extend(links_assumption(links, per, source, "in torchtitan's device mesh order, innermost first: "
                                           "tensor, context, data shard, data replicate, pipeline"))
    report.read += cfg.used
    near_misses(doc, cfg.used, DROPPED, text, file, cfg.asked)
    report.dropped += dropped_keys(doc, cfg.used, DROPPED, _DEFAULT)
    spec_body = _mesh_and_plan(axes, "torchtitan", extra, links=links)
    local = ""
    if rep > 1 and shard > 1:
        spec_body = spec_body.replace("mesh {\n", "mesh {\n" + "".join(_axis_line(n, s, links) for n, s in mesh_axes),
                                      1)
        spec_body = spec_body.replace(f"  dp: {fsdp}\n", "")
        if keep:
            local = ("strategy titan_hsdp over (replicate, shard) extends hybrid_shard {\n"
                     "  params: {replicate: R, shard: S*} (unit = block, reshard_after_forward = false)\n}\n\n")
    fold = (f" (MoE parallel folding: experts on expert {e} = data shard {in_ep} × context {c}"
            + (f" × tensor {t}" if etp == 1 and t > 1 else "") + f", expert tensor {etp})" if roles else "")
    spec = (f"# from the torchtitan job {file} on {devices} devices{fold}\n" + report.comments()
            + "".join(f"# not expressed: {q}\n" for q in problems) + model_text + local + spec_body)
    return _spec_imports(spec) + "\n" + spec


_R, _S, _SS = ir.Mode.R, ir.Mode.S, ir.Mode.S_STAR
_TITAN_MODES = {ir.Role.DATA: ((_R, _R, _R, _R), (_SS, _S, _S, _R)), ir.Role.TENSOR: ((_S, _S, _S, _S),),
                ir.Role.SEQUENCE: ((_S, _S, _S, _S),), ir.Role.PIPELINE: ((_S, _S, _S, _S),),
                ir.Role.CONTEXT: ((_R, _R, _R, _S),)}


def _titan_folded(plan: ir.Plan, fold, roles: dict, size: dict, problems: list[str]) -> tuple[int, int] | None:
    """torchtitan's expert and expert tensor degrees of a folded plan. Its mesh, the last
    innermost, is replicate × shard_mod_ep × shard_in_ep × context × tensor, and the expert
    degree is shard_in_ep × context (× tensor when the expert tensor degree is 1): the experts'
    roles must be expert on the context axes, expert or tensor on the tensor axes, and expert
    on data-shard axes inside the others, which stay data."""
    inner = [a for a in reversed(plan.mesh.names) if a in roles and roles[a] is not ir.Role.PIPELINE]
    role_of = partial(views.view(plan).group_role, fold)
    order = {ir.Role.TENSOR: 0, ir.Role.SEQUENCE: 0, ir.Role.CONTEXT: 1, ir.Role.DATA: 2}
    dense = [order.get(roles[a], 3) for a in inner]
    tensor = [a for a in inner if roles[a] in (ir.Role.TENSOR, ir.Role.SEQUENCE)]
    data = [a for a in inner if roles[a] is ir.Role.DATA]
    in_ep = [a for a in data if role_of(a) is ir.Role.EXPERT]
    ok = (dense == sorted(dense) and all(role_of(a) is ir.Role.EXPERT for a in inner if roles[a] is ir.Role.CONTEXT)
          and len({role_of(a) for a in tensor}) <= 1 and all(role_of(a) in (ir.Role.EXPERT, ir.Role.TENSOR,
                                                                              ir.Role.SEQUENCE) for a in tensor)
          and data[:len(in_ep)] == in_ep and all(role_of(a) is ir.Role.DATA for a in data[len(in_ep):])
          and all(plan.placement(ir.State.PARAMS).mode(a) is ir.Mode.S_STAR for a in in_ep))
    if not ok:
        got = ", ".join(f"{a} ({roles[a].value}; experts: {role_of(a).value})" for a in inner)
        problems.append(f"the expert group's roles, innermost first ({got}): torchtitan's expert degree is the inner "
                        "data-shard devices × context (× tensor with expert tensor degree 1); the folding is not "
                        "exported")
        return None
    ep = 1
    for a in inner:
        ep *= size[a] if role_of(a) is ir.Role.EXPERT else 1
    t = 1
    for a in tensor:
        t *= size[a]
    return ep, (1 if tensor and role_of(tensor[0]) is ir.Role.EXPERT else t)


_SCHEDULE_NAMES = {ir.ScheduleKind.ONE_F_ONE_B: "1F1B", ir.ScheduleKind.GPIPE: "GPipe",
                   ir.ScheduleKind.INTERLEAVED: "Interleaved1F1B"}


def _titan_schedule(spec: ir.Spec, plan: ir.Plan, problems: list[str]) -> dict[str, object]:
    """torchtitan's pipeline schedule (and virtual stages) of the plan's; a problem where it has none."""
    kind = plan.schedule.kind if plan.schedule is not None else ir.ScheduleKind.ONE_F_ONE_B
    name = _SCHEDULE_NAMES.get(kind)
    if name is None:
        problems.append(f"schedule {kind.value}: torchtitan has no such schedule")
        return {}
    if kind is ir.ScheduleKind.INTERLEAVED:
        return {"pipeline_parallel_schedule": name,
                "pipeline_parallel_virtual_stages": int(_number(plan.schedule.chunks, spec) or 1)}
    return {"pipeline_parallel_schedule": name}


def plan_to_torchtitan(spec: ir.Spec, plan: ir.Plan) -> tuple[str, list[str]]:
    problems: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    roles = {a: views.view(plan).role(a) for a in plan.mesh.names if size[a] > 1}
    _role_problems(plan, list(roles), _TITAN_MODES, "torchtitan", problems)
    par: dict[str, object] = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 1}
    seen: dict[str, str] = {}
    fold = views.expert_group(plan)
    experts = _titan_folded(plan, fold, roles, size, problems) if fold is not None else None
    for a, r in roles.items():
        pm = plan.placement(ir.State.PARAMS).mode(a)
        key = {ir.Role.DATA: "data_parallel_shard_degree" if pm is ir.Mode.S_STAR else
               "data_parallel_replicate_degree", ir.Role.TENSOR: "tensor_parallel_degree",
               ir.Role.SEQUENCE: "tensor_parallel_degree", ir.Role.PIPELINE: "pipeline_parallel_degree",
               ir.Role.CONTEXT: "context_parallel_degree"}.get(r)
        if key is None:
            continue
        one_product = any(b.product and a in b.axes and seen.get(key) in b.axes for b in plan.bindings)
        if key in seen and not one_product and not (experts is not None and key == "data_parallel_shard_degree"):
            problems.append(f"axes {seen[key]} and {a}: torchtitan has one {key.replace('_degree', '')} degree")
        seen[key] = a
        par[key] = int(par.get(key, 1)) * size[a]
        if r is ir.Role.PIPELINE:
            par.update(_titan_schedule(spec, plan, problems))
    if experts is not None:
        par["expert_parallel_degree"], par["expert_tensor_parallel_degree"] = experts
    if "tensor_parallel_degree" in par and not plan.sequence_parallel and \
            not any(r is ir.Role.SEQUENCE for r in roles.values()):
        problems.append("tensor parallelism without sequence parallelism: torchtitan's tensor parallelism splits "
                        "the norms' sequence too")
    sharded = any(plan.placement(ir.State.PARAMS).mode(a) is ir.Mode.S_STAR for a in roles)
    if sharded:
        pl = plan.placement(ir.State.PARAMS)
        _placement_options(plan, ir.State.PARAMS, "block", None, "torchtitan's FSDP", problems)
        par["fsdp_reshard_after_forward"] = "always" if pl.reshard_after_forward else "never"
    lines = ["[parallelism]"] + [f"{k} = {json.dumps(v)}" for k, v in par.items()]
    model = plan.model
    lines += ["", "[training]"]
    mb = _number(model.microbatch, spec)
    m = _number(model.microbatches, spec)
    if mb is not None:
        lines.append(f"local_batch_size = {int(mb)}")
        dp = int(par["data_parallel_replicate_degree"]) * int(par["data_parallel_shard_degree"])
        if m is not None:
            lines.append(f"global_batch_size = {int(mb * m * dp)}")
    seq = _number(model.seq, spec) if model.seq is not None else None
    if seq is not None:
        lines.append(f"seq_len = {int(seq)}")
    half = _precision(spec, model, 2, "torchtitan", problems)
    lines.append(f'mixed_precision_param = "{"float32" if half is False else "bfloat16"}"')
    lines += ["", "[activation_checkpoint]", f'mode = "{plan.recompute.value}"']
    if plan.recompute is ir.Recompute.SELECTIVE:
        lines.append('selective_ac_option = "op"')
    if not plan.flash_attention:
        problems.append("attention without flash_attention: torchtitan's models attend with "
                        "scaled_dot_product_attention, which keeps no score matrix")
    if any(not opt.is_placement(o) for o in plan.overrides):  # not optimizer[G]: gather | round_robin
        problems.append("overrides describe what a system does wrong; a job config cannot ask for them")
    problems += opt.export_problems(plan, "torchtitan", "job config")
    return "\n".join(lines) + "\n", problems
