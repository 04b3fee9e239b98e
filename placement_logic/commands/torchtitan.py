"""torchtitan job configs (``job.toml``) in and out, beside ``commands.frameworks``.

``[parallelism]``: data-parallel shard degree (FSDP; -1 takes the rest of the devices) and
replicate degree (with a shard degree HSDP, alone DDP), tensor (with sequence parallelism),
pipeline with its schedule, context, expert; ``[training]`` local and global batch, sequence
length, mixed precision; ``[activation_checkpoint] mode``. Errors are PL141.
"""

from __future__ import annotations

import json

from .. import ir
from .frameworks import _err, _imports, _mesh_and_plan, _number

_TITAN_SCHEDULES = {"1f1b": "one_f_one_b", "gpipe": "gpipe", "interleaved1f1b": "interleaved_1f1b"}


def torchtitan_to_spec(text: str, file: str, devices: int, model: str | None, params: int | None) -> str:
    import tomllib

    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _err(file, f"not a TOML job config: {exc}") from None
    par = cfg.get("parallelism", {})
    training = cfg.get("training", {})

    def degree(key: str, default: int = 1) -> int:
        v = par.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and not (v == -1 and key.endswith("shard_degree"))):
            raise _err(file, f"parallelism.{key} must be a positive integer (-1 for the shard degree), not {v!r}")
        return v

    rep, shard = degree("data_parallel_replicate_degree"), degree("data_parallel_shard_degree", -1)
    t, p, c, e = (degree(k) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                      "context_parallel_degree", "expert_parallel_degree"))
    fixed = rep * t * p * c * (shard if shard != -1 else 1)
    if devices % fixed:
        raise _err(file, f"{devices} devices are not a multiple of the degrees given ({fixed})")
    if shard == -1:
        shard = devices // fixed
    if rep * shard * t * p * c != devices:
        raise _err(file, f"the degrees multiply to {rep * shard * t * p * c}, not {devices} devices")
    if e > 1 and (rep * shard * c) % e:
        raise _err(file, f"expert_parallel_degree {e} does not divide the data × context devices")
    mb = training.get("local_batch_size", training.get("batch_size", 1))
    seq = training.get("seq_len")
    gbs = training.get("global_batch_size", -1)
    dp = rep * shard
    m = 1
    if isinstance(gbs, int) and gbs > 0:
        if gbs % (mb * dp):
            raise _err(file, f"training.global_batch_size {gbs} is not a multiple of local batch {mb} × data {dp}")
        m = gbs // (mb * dp)
    ac = cfg.get("activation_checkpoint", {}).get("mode", "selective")
    if ac not in ("none", "selective", "full"):
        raise _err(file, f"activation_checkpoint.mode {ac!r} is none, selective or full")
    mixed = cfg.get("training", {}).get("mixed_precision_param", "bfloat16")
    widths = "params = 2\n    grads = 2\n    optimizer = 12" if mixed in ("bfloat16", "float16") else \
        "params = 4\n    grads = 4\n    optimizer = 8"
    head = f'model from "{model}" {{\n' if model else f"model {{\n  params = {params}\n"
    model_text = (head + f"  bytes {{\n    {widths}\n  }}\n" + (f"  seq = {seq}\n" if seq else "")
                  + f"  microbatch = {mb}\n  microbatches = {m}\n}}\n\n")
    sched = str(par.get("pipeline_parallel_schedule", "1F1B")).lower()
    if sched not in _TITAN_SCHEDULES:
        raise _err(file, f"pipeline_parallel_schedule {par.get('pipeline_parallel_schedule')!r} is not modelled "
                   f"(known: {', '.join(sorted(_TITAN_SCHEDULES))})")
    pipe = _TITAN_SCHEDULES[sched]
    axes: list[tuple[str, int, str]] = []
    extra: list[str] = []
    if rep > 1 and shard > 1:
        mesh_axes = [("replicate", rep), ("shard", shard)]
        extra.append("[replicate, shard]: hybrid_shard")
    elif rep > 1:
        axes.append(("dp", rep, "ddp"))
    else:
        axes.append(("dp", shard, "fsdp_full_shard"))
    axes += [("cp", c, "context_parallel"), ("tp", t, "megatron_sp"), ("pp", p, pipe)]
    if ac != "none":
        extra.append(f"use {ac}_recompute")
    spec_body = _mesh_and_plan(axes, "torchtitan", extra)
    if rep > 1 and shard > 1:
        spec_body = spec_body.replace("mesh {\n", "mesh {\n" + "".join(f"  {n} = {s}\n" for n, s in mesh_axes), 1)
        spec_body = spec_body.replace("  dp: fsdp_full_shard\n", "")
    spec = f"# from the torchtitan job {file} on {devices} devices\n" + model_text + spec_body
    imports = _imports(spec)
    if "hybrid_shard" in spec:
        imports = imports.replace("from std.data import ", "from std.data import hybrid_shard, ") \
            if "from std.data import" in imports else "from std.data import hybrid_shard\n" + imports
    if "fsdp_full_shard" in spec and "fsdp_full_shard" not in imports:
        imports = "from std.data import fsdp_full_shard\n" + imports
    if "gpipe" in spec and "gpipe" not in imports:
        imports += "from std.pipeline import gpipe\n"
    return imports + "\n" + spec


def plan_to_torchtitan(spec: ir.Spec, plan: ir.Plan) -> tuple[str, list[str]]:
    problems: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    roles = {a: plan.role(a) for a in plan.mesh.names}
    par: dict[str, object] = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 1}
    for a, r in roles.items():
        pm = plan.placement(ir.State.PARAMS).mode(a)
        if r is ir.Role.DATA:
            key = "data_parallel_shard_degree" if pm is ir.Mode.S_STAR else "data_parallel_replicate_degree"
            if pm not in (ir.Mode.S_STAR, ir.Mode.R):
                problems.append(f"params {pm.value} over {a}: torchtitan shards with FSDP (S*) or replicates (R)")
            if pm is ir.Mode.R and plan.placement(ir.State.OPTIMIZER).mode(a) is not ir.Mode.R:
                problems.append(f"a sharded optimizer over {a} with replicated params: torchtitan has no ZeRO-1/2")
            par[key] = int(par[key]) * size[a]
        elif r in (ir.Role.TENSOR, ir.Role.SEQUENCE):
            par["tensor_parallel_degree"] = size[a]
        elif r is ir.Role.PIPELINE:
            par["pipeline_parallel_degree"] = size[a]
            kind = plan.schedule.kind if plan.schedule is not None else ir.ScheduleKind.ONE_F_ONE_B
            name = {ir.ScheduleKind.ONE_F_ONE_B: "1F1B", ir.ScheduleKind.GPIPE: "GPipe",
                    ir.ScheduleKind.INTERLEAVED: "Interleaved1F1B"}.get(kind)
            if name is None:
                problems.append(f"schedule {kind.value}: torchtitan has no such schedule")
            else:
                par["pipeline_parallel_schedule"] = name
        elif r is ir.Role.CONTEXT:
            par["context_parallel_degree"] = size[a]
        elif r is ir.Role.EXPERT:
            par["expert_parallel_degree"] = size[a]
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
    lines.append(f'mixed_precision_param = "{"bfloat16" if _number(model.bytes_params, spec) == 2 else "float32"}"')
    lines += ["", "[activation_checkpoint]", f'mode = "{plan.recompute.value}"']
    if plan.overrides:
        problems.append("overrides describe what a system does wrong; a job config cannot ask for them")
    return "\n".join(lines) + "\n", problems
