"""DeepSpeed ``ds_config.json`` <-> specs (see ``interop.frameworks``)."""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code
from ..frontend.configs import Table, load_json
from ..ir import optimizers as opt
from ..ir import views
from .framework_common import (
    ImportReport,
    _err,
    _imports,
    _mesh_and_plan,
    _number,
    _placement_options,
    _precision,
    _widths,
    dropped_keys,
    links_assumption,
    near_misses,
    node_links,
    per_node_source,
)
from .trainer_auto import resolve_auto

_OFFLOAD_TUNING = "how offloaded state is staged (pinned or staging buffers); the plan prices the bytes moved"
# why a key of a DeepSpeed config changes nothing the plan models (longest dotted prefix wins)
DROPPED = {
    "zero_optimization.allgather_bucket_size": "the stage 1-2 parameter all-gather bucket: DeepSpeed gathers into "
                                               "the flat parameter buffer in place (all_gather_into_tensor), no "
                                               "buffer of this size",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "checkpoint saving: not part of a training step",
    "zero_optimization.reduce_scatter": "how the gradient reduction is issued: the same bytes reach each device",
    "zero_optimization.allgather_partitions": "how the parameter all-gather is issued: the same bytes",
    "zero_optimization.round_robin_gradients": "the order gradients are copied to the host: the same bytes",
    "zero_optimization.sub_group_size": "the optimizer step's sub-groups: the optimizer step is not priced",
    "zero_optimization.offload_optimizer": _OFFLOAD_TUNING,
    "zero_optimization.offload_param": _OFFLOAD_TUNING,
    "gradient_clipping": "clipping by the global norm (the Trainer's max_grad_norm): its scalar all-reduce and the "
                         "scaling are not priced",
    "optimizer": "the optimizer's type and hyper-parameters: the plan's optimizer state is bytes { optimizer } (a "
                 "12-byte Adam state with its fp32 master copy, or 8 bytes in fp32)",
    "scheduler": "the learning-rate schedule: no memory or communication",
    "fp16": "loss scaling: no memory or communication the plan models",
    "bf16": "no memory or communication the plan models",
    "activation_checkpointing": "applies where the model code calls deepspeed.checkpointing; the plan has no "
                                "recompute (add use selective_recompute or use full_recompute to it when the model "
                                "checkpoints)",
    "communication_data_type": "the reduction's data type: the plan sends gradients at bytes { grads }",
    "prescale_gradients": "the scaling of gradients before their reduction: the same bytes",
    "gradient_predivide_factor": "the scaling of gradients before their reduction: the same bytes",
    "zero_allow_untested_optimizer": "a permission flag",
    "steps_per_print": "logging", "wall_clock_breakdown": "profiling", "flops_profiler": "profiling",
    "tensorboard": "logging", "wandb": "logging", "csv_monitor": "logging", "comms_logger": "logging",
    "dump_state": "logging",
}
_DEFAULT = ("not read: from a DeepSpeed config the plan takes the ZeRO stage, the offload devices, ZeRO++'s "
            "secondary partition and quantization, the buckets, the batch and the precision")
# the buffers DeepSpeed sizes (priced by costs.buckets): config key -> the buckets block's name
BUCKET_KEYS = {"reduce_bucket_size": "reduce_bucket_size", "stage3_prefetch_bucket_size": "prefetch_bucket_size",
               "stage3_max_live_parameters": "max_live_parameters", "stage3_max_reuse_distance": "max_reuse_distance",
               "stage3_param_persistence_threshold": "param_persistence_threshold"}
BUCKET_FLAGS = ("overlap_comm", "contiguous_gradients")
_STAGE0 = "ZeRO stage 0: DeepSpeed's ZeRO optimizer, whose buffers this sizes, does not run"
# the Hugging Face Trainer's "auto" for them, from the model's hidden size (integrations/deepspeed.py)
_TRAINER_AUTO = {"reduce_bucket_size": (1, 1, "hidden²"), "stage3_prefetch_bucket_size": (9, 10, "0.9 hidden²"),
                 "stage3_param_persistence_threshold": (10, 0, "10 hidden")}


def _hidden(model: str | None) -> int | None:
    """The hidden size of a Hugging Face config.json, if it can be read."""
    import json
    try:
        with open(model or "", encoding="utf-8") as fh:
            h = json.load(fh).get("hidden_size")
    except (OSError, ValueError, AttributeError):
        return None
    return h if isinstance(h, int) and not isinstance(h, bool) and h > 0 else None


def _buckets(zero: Table, model: str | None, assumed: list[str]) -> str:
    """The ``buckets`` block of the settings the config states ("auto" filled as the Trainer does
    when the model's hidden size is known)."""
    lines = []
    for key, name in BUCKET_KEYS.items():
        if zero.has(key) and zero.data[key] == "auto":
            h = _hidden(model)
            num, den, rule = _TRAINER_AUTO.get(key, (0, 0, ""))
            zero.used.append(zero.name(key))
            if h is None or not rule:
                assumed.append(f"{zero.name(key)} \"auto\": " + (f"the Trainer sets {rule} from the model, whose "
                               "hidden size is not known here" if rule else "no Trainer rule fills it")
                               + "; DeepSpeed's default is priced")
                continue
            v = h * h * num // den if den else h * num
            assumed.append(f'{zero.name(key)} "auto" = {v} ({rule}, hidden {h}, as the Trainer fills it)')
        else:
            v = zero.number(key, None, positive=False)
            if v is None:
                continue
            if v < 0 or v.denominator != 1:
                raise zero.error(key, f"{zero.name(key)} must be a whole number of elements, not {v}")
        lines.append(f"    {name} = {int(v)}\n")
    for key in BUCKET_FLAGS:
        if zero.has(key):
            lines.append(f"    {key} = {str(zero.flag(key, False)).lower()}\n")
    return "  buckets {\n" + "".join(lines) + "  }\n"


def _value(doc: dict, dotted: str):
    for part in dotted.split("."):
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def deepspeed_to_spec(text: str, file: str, devices: int, model: str | None, params: int | None,
                      seq: int | None = None, problems: list[str] | None = None, *,
                      report: ImportReport | None = None, per_node: int | None = None,
                      trainer: dict | None = None) -> str:
    """The spec of a DeepSpeed config; what the DSL cannot express is appended to ``problems``
    (and written as comments at the top of the spec), what was assumed to ``report`` (with
    the keys read and dropped). ``trainer``: the Hugging Face Trainer's values for ``"auto"``
    (``micro``, ``accum``, ``global_batch``, ``precision``; ``interop.trainer_auto``)."""
    problems = [] if problems is None else problems
    report = ImportReport() if report is None else report
    doc = load_json(text, file, Code.BAD_FRAMEWORK_CONFIG, "a JSON config")
    if not isinstance(doc, dict):
        raise _err(file, "a DeepSpeed config is one JSON object")
    original = {k: v for k, v in doc.items()}
    trainer = trainer or {}
    resolve_auto(doc, text, file, devices, trainer.get("micro"), trainer.get("accum"), trainer.get("global_batch"),
                 trainer.get("precision"), report.assumed)
    cfg = Table(doc, text, file, Code.BAD_FRAMEWORK_CONFIG)
    zero = cfg.table("zero_optimization", allow_false=True)
    stage = zero.integer("stage", 0, low=0, high=3)
    off_opt = zero.table("offload_optimizer").choice("device", ("none", "cpu", "nvme"), "none")
    off_par = zero.table("offload_param").choice("device", ("none", "cpu", "nvme"), "none")
    if off_par != "none" and stage != 3:
        raise zero.error("offload_param", "offload_param needs ZeRO stage 3")
    local = ""
    hpz = zero.integer("zero_hpz_partition_size", 1)
    if hpz > 1:
        problems.append(f"zero_hpz_partition_size {hpz}: ZeRO++'s secondary parameter partition (a second copy "
                        f"sharded over groups of {hpz} devices, gathered there in backward) has no placement; the "
                        "plan is plain ZeRO-3 over all the devices, without the secondary copy's memory and with "
                        "backward gathers over all of them")
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if zero.flag(key, False):
            problems.append(f"{key}: ZeRO++'s quantized collectives are not modelled (full-width communication)")
    where = {"cpu": "host", "nvme": "nvme"}
    if off_opt == "none" and off_par == "none":
        strategy = ("ddp", "zero1", "zero2", "zero3")[stage]
    else:
        # the optimizer state in host memory or on NVMe, the gradient partitions in host memory (stage 2 and
        # 3); with offload_param the parameters too, fetched a layer at a time
        if stage == 0:
            raise zero.error("offload_optimizer", "offload_optimizer needs ZeRO stage 1, 2 or 3")
        pmode = "S* (unit = layer" + (f", residency = {where[off_par]})" if off_par in where else ")") \
            if stage == 3 else "R"
        if off_opt in where:
            optimizer, grads = f"O (residency = {where[off_opt]})", "O (residency = host)" if stage >= 2 else "R"
        else:  # the parameters alone offloaded (stage 3): optimizer state and gradients sharded on the device
            optimizer, grads = "S", "S"
        strategy = "ds_offload"
        local = (f"strategy ds_offload {{\n  role = data\n  params: {pmode}\n  optimizer: {optimizer}\n"
                 f"  grads: {grads}\n  activations: R\n}}\n\n")
    mb = cfg.integer("train_micro_batch_size_per_gpu", 1)
    gas = cfg.integer("gradient_accumulation_steps", 1)
    tb = cfg.integer("train_batch_size", None)
    if tb is not None and tb != mb * gas * devices:
        raise cfg.error("train_batch_size", f"train_batch_size {tb} is not micro batch {mb} × accumulation {gas} × "
                        f"{devices} devices = {mb * gas * devices}")
    # DeepSpeed's ZeRO optimizer (stages 1-3) runs with its buffers whether or not the config sizes them
    buckets = _buckets(zero, model, report.assumed) if stage >= 1 else ""
    bf16 = cfg.table("bf16", allow_false=True).flag("enabled", False)
    fp16 = cfg.table("fp16", allow_false=True).flag("enabled", False)  # read either way: --verbose lists it read
    half = bf16 or fp16
    per, source = per_node_source(per_node, None, "a DeepSpeed config")
    links = node_links([("dp", devices)], per)
    report.assumed.extend(links_assumption(links, per, source, "data-parallel only"))
    report.assumed.append("attention without flash_attention and no recompute: a DeepSpeed config does not say "
                          "what the model code does (add flash_attention or use selective_recompute to the plan "
                          "when it does)")
    if seq is None:
        report.assumed.append("no sequence length: the data pipeline sets it, not the config, so activations are "
                              "left unpriced (pass --seq N)")
    near_misses(original, cfg.used, DROPPED, text, file, cfg.asked)
    report.read += cfg.used
    reasons = DROPPED if stage else {**DROPPED, **{f"zero_optimization.{k}": _STAGE0 for k in (*BUCKET_KEYS,
                                                                                               *BUCKET_FLAGS)}}
    report.dropped += [(k, why + (' ("auto": the Trainer fills it at run time)' if _value(original, k) == "auto"
                                  else "")) for k, why in dropped_keys(original, cfg.used, reasons, _DEFAULT)]
    head = f'model from "{model}" {{\n' if model else f"model {{\n  params = {params}\n"
    spec = (f"# from the DeepSpeed config {file} on {devices} devices\n" + report.comments()
            + "".join(f"# not expressed: {p}\n" for p in problems) + head
            + f"  bytes {{\n    {_widths(half)}\n  }}\n" + (f"  seq = {seq}\n" if seq else "")
            + f"  microbatch = {mb}\n  microbatches = {gas}\n" + buckets + "}\n\n")
    spec += local + _mesh_and_plan([("dp", devices, strategy)], "deepspeed", [], links=links)
    return _imports(spec) + "\n" + spec


def plan_to_deepspeed(spec: ir.Spec, plan: ir.Plan) -> tuple[dict, list[str]]:
    problems: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    data = [a for a in views.view(plan).axes_with_role(ir.Role.DATA) if size[a] > 1]
    others = [a for a in plan.mesh.names if a not in views.view(plan).axes_with_role(ir.Role.DATA) and size[a] > 1]
    if others:
        problems.append(f"axes {', '.join(others)} ({', '.join(views.view(plan).role(a).value for a in others)}): DeepSpeed's "
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
        _placement_options(plan, ir.State.PARAMS, "layer", True, "DeepSpeed", problems)  # stage 3 frees after forward
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
    if any(not opt.is_placement(o) for o in plan.overrides):  # not optimizer[G]: gather | round_robin
        problems.append("overrides describe what a system does wrong; a config cannot ask for them")
    problems += opt.export_problems(plan, "DeepSpeed", "config")
    return cfg, problems
