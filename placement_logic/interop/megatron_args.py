"""Plans -> Megatron-LM arguments (see ``interop.frameworks``)."""

from __future__ import annotations

from functools import partial

from .. import ir
from ..ir import groups as pg
from ..ir import optimizers as opt
from ..ir import views
from .framework_common import _MEGATRON_MODES, _modes, _number, _precision, _role_problems

_FOLD_ORDER = {"dense": ((ir.Role.TENSOR, ir.Role.SEQUENCE), (ir.Role.CONTEXT,), (ir.Role.DATA,)),
               "expert": ((ir.Role.TENSOR, ir.Role.SEQUENCE), (ir.Role.EXPERT,), (ir.Role.DATA,))}


def _folded_sizes(plan: ir.Plan, fold, roles: dict, size: dict, problems: list[str]) -> dict[str, int] | None:
    """Megatron-LM's sizes of a folded layout: tensor, context and data of the dense layers,
    expert and expert tensor of the experts, each a product of mesh axes. Megatron-LM numbers
    the ranks tensor-innermost (tensor, context, data; expert tensor, expert, expert data), so
    the mesh's axes, the last innermost, must run in that order for both groupings."""
    inner = [a for a in reversed(plan.mesh.names) if a in roles and roles[a] is not ir.Role.PIPELINE]
    out = {"tp": 1, "cp": 1, "dp": 1, "ep": 1, "etp": 1}
    for which, role_of, keys in (("dense", plan.role, ("tp", "cp", "dp")),
                                 ("expert", partial(views.view(plan).group_role, fold), ("etp", "ep", "edp"))):
        rank = [next((i for i, rs in enumerate(_FOLD_ORDER[which]) if role_of(a) in rs), None) for a in inner]
        if None in rank or rank != sorted(rank):
            got = ", ".join(f"{a} ({role_of(a).value})" for a in inner)
            problems.append(f"the {which} roles of the axes, innermost first ({got}): Megatron-LM numbers its ranks "
                            + ("tensor, context, data" if which == "dense" else "expert tensor, expert, expert data")
                            + " from the innermost; the folding is not exported")
            return None
        for a, i in zip(inner, rank):
            if keys[i] in out:
                out[keys[i]] *= size[a]
    return out


def _axis_groups(plan: ir.Plan, roles: dict, *rs: ir.Role) -> list[tuple[str, ...]]:
    """The groups of these roles (a product binding's axes are one), axes of one device left out."""
    return [g for g in (tuple(a for a in grp if a in roles) for grp in plan.groups_with_role(*rs)) if g]


def _product(size: dict, axes: tuple[str, ...]) -> int:
    n = 1
    for a in axes:
        n *= size[a]
    return n


def _one(plan: ir.Plan, roles: dict, size: dict, role: ir.Role, flag: str, problems: list[str]) -> list[str]:
    """The flag of the one axis (group) of this role, if any; a problem if there are several."""
    found = _axis_groups(plan, roles, role)
    if len(found) > 1:
        problems.append(f"{len(found)} {role.value} axes: Megatron-LM has one")
    return [flag, str(_product(size, found[0]))] if found else []


def _parallel_sizes(spec: ir.Spec, plan: ir.Plan, roles: dict, size: dict,
                    problems: list[str]) -> tuple[list[str], int, dict[str, int] | None]:
    """The tensor, pipeline, context and expert sizes' flags, the tensor size and the folded sizes (if folded)."""
    out: list[str] = []
    tensor = _axis_groups(plan, roles, ir.Role.TENSOR, ir.Role.SEQUENCE)
    fold = views.expert_group(plan)
    folded = _folded_sizes(plan, fold, roles, size, problems) if fold is not None else None
    tp = _product(size, tensor[0]) if tensor else 1
    if folded is not None:  # several axes per factor, in Megatron-LM's rank order
        tp = folded["tp"]
        if tp > 1:
            out += ["--tensor-model-parallel-size", str(tp)]
        out += _one(plan, roles, size, ir.Role.PIPELINE, "--pipeline-model-parallel-size", problems)
        if folded["cp"] > 1:
            out += ["--context-parallel-size", str(folded["cp"])]
        out += ["--expert-model-parallel-size", str(folded["ep"]), "--expert-tensor-parallel-size", str(folded["etp"])]
        return out, tp, folded
    if len(tensor) > 1:
        problems.append(f"{len(tensor)} tensor axes: Megatron-LM has one (bind them as one product, "
                        f"[{', '.join(a for g in tensor for a in g)}]: ...)")
    if tensor:
        out += ["--tensor-model-parallel-size", str(tp)]
    for role, flag in ((ir.Role.PIPELINE, "--pipeline-model-parallel-size"),
                       (ir.Role.CONTEXT, "--context-parallel-size"),
                       (ir.Role.EXPERT, "--expert-model-parallel-size")):
        out += _one(plan, roles, size, role, flag, problems)
    if any(r is ir.Role.EXPERT for r in roles.values()) and any(r is ir.Role.CONTEXT for r in roles.values()):
        problems.append("an expert axis beside a context axis: Megatron-LM forms its expert groups from the "
                        "context ranks first; write the layout as the expert group's roles (parallel folding)")
    return out, tp, folded


def _schedule(spec: ir.Spec, plan: ir.Plan, roles: dict, problems: list[str]) -> list[str]:
    """The virtual stages of an interleaved pipeline; a problem for a schedule other than 1F1B."""
    pipelined = any(r is ir.Role.PIPELINE for r in roles.values())
    if not pipelined or plan.schedule is None:
        return []
    if plan.schedule.kind is ir.ScheduleKind.INTERLEAVED:
        v = int(_number(plan.schedule.chunks, spec) or 1)
        return ["--num-virtual-stages-per-pipeline-rank", str(v)] if v > 1 else []
    if plan.schedule.kind is not ir.ScheduleKind.ONE_F_ONE_B:
        problems.append(f"schedule {plan.schedule.kind.value}: Megatron-LM schedules pipelines with 1F1B "
                        "(interleaved or not)")
    return []


def _data(plan: ir.Plan, roles: dict, folded: dict | None, problems: list[str]) -> list[str]:
    """The distributed optimizer of a sharded data axis; problems for what Megatron-LM's one group cannot say."""
    data = [a for a, r in roles.items() if r is ir.Role.DATA]
    if len(data) > 1 and folded is None:
        problems.append(f"{len(data)} data axes ({', '.join(data)}): Megatron-LM has one data-parallel group")
    if not any(_modes(plan, a)[1] is ir.Mode.S for a in data):
        return []
    if any(_modes(plan, a)[1] is ir.Mode.R for a in data):
        problems.append("the optimizer sharded over some data axes only: Megatron-LM's distributed optimizer "
                        "shards over the whole data-parallel group")
    return ["--use-distributed-optimizer"]


_RECOMPUTE = {ir.Recompute.SELECTIVE: ["--recompute-granularity", "selective"],
              ir.Recompute.FULL: ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                  "--recompute-num-layers", "1"]}


def _batch(spec: ir.Spec, model: ir.Model, roles: dict, size: dict) -> list[str]:
    """The sequence length, the micro-batch size and the global batch size, where the spec gives them."""
    out: list[str] = []
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
    return out


def _precision_flags(spec: ir.Spec, model: ir.Model, problems: list[str]) -> list[str]:
    if _precision(spec, model, 4, "Megatron-LM", []) is True:
        return ["--bf16"]  # fp32 main gradients
    if _precision(spec, model, 2, "Megatron-LM", []) is True:
        return ["--fp16"]  # 16-bit gradients (no --accumulate-allreduce-grads-in-fp32)
    if _precision(spec, model, 4, "Megatron-LM", problems) is None:
        problems[-1] = problems[-1].replace("or fp32", "(2, 2, 12, 2) with --fp16, or fp32")
    return []


def plan_to_megatron(spec: ir.Spec, plan: ir.Plan) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    size = {a.name: int(_number(a.size, spec) or 1) for a in plan.mesh.axes}
    roles = {a: views.view(plan).role(a) for a in plan.mesh.names if size[a] > 1}
    _role_problems(plan, list(roles), _MEGATRON_MODES, "Megatron-LM", problems)
    out, tp, folded = _parallel_sizes(spec, plan, roles, size, problems)
    if plan.sequence_parallel or any(r is ir.Role.SEQUENCE for r in roles.values()):
        out.append("--sequence-parallel")
    out += _schedule(spec, plan, roles, problems)
    out += _data(plan, roles, folded, problems)
    out += _RECOMPUTE.get(plan.recompute, [])
    if plan.flash_attention:
        out.append("--use-flash-attn")
    t = plan.model.transformer
    if t is None:
        problems.append("a model without a transformer shape: Megatron-LM's arguments describe the model's shape")
    else:
        out += _megatron_model(spec, t, tp, problems)
    out += _batch(spec, plan.model, roles, size)
    out += _precision_flags(spec, plan.model, problems)
    if any(not opt.is_placement(o) for o in plan.overrides):  # not optimizer[G]: gather | round_robin
        problems.append("overrides describe what a system does wrong; arguments cannot ask for them")
    muon, not_said = opt.megatron_args(plan)
    if "--use-layer-wise-distributed-optimizer" in muon and "--use-distributed-optimizer" in out:
        out.remove("--use-distributed-optimizer")  # the state sharded by whole layers instead of flat shards
    out += muon
    problems += not_said
    return out, problems


def _int(spec: ir.Spec, v) -> int | None:
    n = _number(v, spec)
    return None if n is None else int(n)


def _megatron_model(spec: ir.Spec, t: ir.TransformerShape, tp: int, problems: list[str]) -> list[str]:
    num = partial(_int, spec)
    out: list[str] = []
    for flag, v in (("--num-layers", t.layers), ("--hidden-size", t.hidden), ("--num-attention-heads", t.heads),
                    ("--ffn-hidden-size", t.ffn)):
        if num(v) is not None:
            out += [flag, str(num(v))]
    out += _vocab(num, t, tp, problems)
    out += _layer_flags(num, t, problems)
    if t.kv_lora_rank is not None:
        out.append("--multi-latent-attention")
        for flag, v in (("--q-lora-rank", t.q_lora_rank), ("--kv-lora-rank", t.kv_lora_rank),
                        ("--qk-head-dim", t.qk_nope_dim), ("--qk-pos-emb-head-dim", t.qk_rope_dim),
                        ("--v-head-dim", t.v_head_dim)):
            if v is not None:
                out += [flag, str(num(v))]
    E = num(t.experts)
    if E is not None and E > 1:
        out += _experts(spec, num, t, E, problems)
    if t.mtp_layers is not None and num(t.mtp_layers):
        out += ["--mtp-num-layers", str(num(t.mtp_layers))]
    if t.norms_per_layer is not None and num(t.norms_per_layer) != 2:
        problems.append(f"norms_per_layer = {num(t.norms_per_layer)}: Megatron-LM's layers have two norms")
    return out


def _vocab(num, t: ir.TransformerShape, tp: int, problems: list[str]) -> list[str]:
    """The vocabulary: padded by Megatron-LM to a multiple of the tensor size times the divisor given."""
    vm = num(t.vocab_multiple) if t.vocab_multiple is not None else None
    if vm is None:
        return ["--padded-vocab-size", str(num(t.vocab))]
    if vm % tp == 0:
        return ["--vocab-size", str(num(t.vocab)), "--make-vocab-size-divisible-by", str(vm // tp)]
    problems.append(f"vocab_multiple = {vm}: Megatron-LM pads to a multiple of the tensor size {tp}")
    return ["--padded-vocab-size", str(num(t.vocab))]


def _layer_flags(num, t: ir.TransformerShape, problems: list[str]) -> list[str]:
    """Attention groups and head width, the MLP, norms, biases, embeddings and positions of a layer."""
    out: list[str] = []
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
        return out + ["--position-embedding-type", "learned_absolute", "--max-position-embeddings",
                      str(num(t.position_embeddings))]
    return out + ["--position-embedding-type", "rope"]


def _experts(spec: ir.Spec, num, t: ir.TransformerShape, E: int, problems: list[str]) -> list[str]:
    """A mixture of E experts: router, expert and shared-expert widths, and which layers hold experts."""
    out = ["--num-experts", str(E), "--moe-router-topk", str(num(t.top_k) or 1)]
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
            return out + ["--moe-layer-freq", str(k)]
        return out + ["--moe-layer-freq", "[" + ",".join("1" if i >= d and i % k == r else "0" for i in range(L))
                      + "]"]
    if d:
        out += ["--moe-layer-freq", f"([0]*{d}+[1]*{L - d})"]
    return out
