"""Round trips through DeepSpeed, Megatron-LM and torchtitan: import(export(p)) = p.

Property: for every plan drawn from a framework's vocabulary (ZeRO stages and offload
devices, micro batch, accumulation and global batch, precision, tensor, pipeline with its
schedule and virtual stages, context and expert sizes, sequence parallelism, the
distributed optimizer, recompute, flash attention), the export states no problem and
importing the exported configuration gives the plan back. And for plans drawn wider than
that vocabulary (two axes of one role, other placements, other widths, options the
framework has no knob for), the exporter either states what it cannot express or the round
trip is exact: nothing is dropped silently.

Oracle: equality of a normal form computed from the resolved plans alone (every axis of
size > 1 as its role, size and per-state modes with their options, the model's widths,
batch and shape, the plan's settings), independent of axis names and mesh order, which
the frameworks do not have. The model that lives outside a framework's configuration (the
parameter count for DeepSpeed and torchtitan, DeepSpeed's sequence length) is passed to the
import, as a user does with --params and --seq."""

from __future__ import annotations

import json
import shlex

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from tiers import examples

from placement_logic import ir
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.interop.frameworks import deepspeed_to_spec, megatron_to_spec, plan_to_deepspeed, plan_to_megatron
from placement_logic.interop.torchtitan import plan_to_torchtitan, torchtitan_to_spec
from placement_logic.ir.walker import fold

SETTINGS = settings(max_examples=examples(60), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
NAMES = st.sampled_from(["dp", "data", "d", "rep", "x", "y", "z", "w", "tp", "pp", "cp", "ep", "u", "v2"])
HALF, FP32 = (2, 2, 12, 2), (4, 4, 8, 4)
MEGATRON_HALF = (2, 4, 12, 2)  # bf16 weights, fp32 main gradients (HALF: --fp16)


# --------------------------------------------------------------------------- the normal form


def normal_form(spec: ir.Spec, plan: ir.Plan) -> dict:
    b = dict(spec.bindings)

    def n(v):
        x = fold(v, b)
        return None if x is None else (int(x) if x.denominator == 1 else x)

    axes = []
    for ax in plan.mesh.axes:
        size = n(ax.size)
        if size == 1:
            continue
        role = plan.role(ax.name)
        role = ir.Role.TENSOR if role is ir.Role.SEQUENCE else role
        states = []
        for s in ir.STATES:
            pl = plan.placement(s)
            m = pl.mode(ax.name)
            unit = "layer" if pl.unit == "block" else pl.unit  # one transformer layer either way
            opts = (unit, pl.prefetch, pl.reshard_after_forward) if m is ir.Mode.S_STAR else ()
            res = pl.residency.value if m is ir.Mode.O or (m is ir.Mode.S_STAR and pl.residency is not
                                                            ir.Residency.DEVICE) else ""
            states.append((s.value, m.value, res, opts))
        axes.append((role.value, size, tuple(states)))
    m = plan.model
    t = m.transformer
    shape = None
    if t is not None:
        shape = {}
        for k, v in vars(t).items():
            if k == "span":
                continue
            shape[k] = n(v) if isinstance(v, (ir.Const, ir.Sym, ir.Op)) else v
        if shape["head_dim"] is not None and shape["head_dim"] * shape["heads"] == shape["hidden"]:
            shape["head_dim"] = None
        if shape["qkv_bias"] is None:
            shape["qkv_bias"] = shape["bias"]
        # which layers are MoE layers, however the fields state it
        L, d, k, r = (shape[x] or 0 for x in ("layers", "dense_layers", "moe_every", "moe_offset"))
        shape["moe_layers"] = tuple(i >= d and i % (k or 1) == r for i in range(L)) if shape["experts"] > 1 else ()
        for x in ("dense_layers", "moe_every", "moe_offset"):
            del shape[x]
    sched = plan.schedule
    pipelined = any(r == "pipeline" for r, _, _ in axes)
    return {
        "axes": sorted(axes),
        "widths": tuple(n(v) for v in (m.bytes_params, m.bytes_grads, m.bytes_optimizer, m.bytes_activations)),
        "params": n(m.params) if t is None else None,
        "shape": shape,
        "seq": n(m.seq), "microbatch": n(m.microbatch), "microbatches": n(m.microbatches),
        "recompute": plan.recompute.value, "flash": plan.flash_attention,
        "sp": any(r == "tensor" for r, _, _ in axes) and (plan.sequence_parallel or any(
            plan.role(a) is ir.Role.SEQUENCE for a in plan.mesh.names)),
        "schedule": (sched.kind.value, n(sched.chunks), n(sched.unit)) if sched is not None and pipelined else None,
        "overrides": plan.overrides,
    }


def _load(text: str) -> ir.Spec:
    return load_string(format_source(text, "<import>"), "<import>")


def _devices(spec: ir.Spec, plan: ir.Plan) -> int:
    out = 1
    for ax in plan.mesh.axes:
        out *= int(fold(ax.size, dict(spec.bindings)))
    return out


# --------------------------------------------------------------------------- drawing plans


def _model_block(d, *, transformer: str | None = None, widths=(HALF, FP32)) -> str:
    widths = d(st.sampled_from(widths))
    lines = ["model {"]
    if transformer:
        lines.append(transformer)
    else:
        lines.append(f"  params = {d(st.integers(1, 10**6)) * 1000}")
    lines.append("  bytes {\n    params = %d\n    grads = %d\n    optimizer = %d\n    activations = %d\n  }" % widths)
    if d(st.booleans()):
        lines.append(f"  seq = {d(st.sampled_from([512, 1024, 4096]))}")
    lines.append(f"  microbatch = {d(st.integers(1, 8))}")
    lines.append(f"  microbatches = {d(st.integers(1, 16))}")
    return "\n".join(lines) + "\n}\n"


@st.composite
def deepspeed_plans(draw):
    """One data axis: ZeRO 0-3, optimizer offload (cpu, nvme) for stages 1-3, parameter offload for stage 3."""
    d = draw
    name, size = d(NAMES), d(st.integers(2, 64))
    stage = d(st.integers(0, 3))
    off_opt = d(st.sampled_from([None, "host", "nvme"])) if stage else None
    off_par = d(st.sampled_from([None, "host", "nvme"])) if stage == 3 else None
    if off_opt is None and off_par is None:
        strategy = ("ddp", "zero1", "zero2", "zero3")[stage]
        head = f"from std.data import {strategy}\n"
    else:
        strategy = "s"
        pmode = "R" if stage < 3 else "S* (unit = layer" + (f", residency = {off_par})" if off_par else ")")
        grads = "R" if stage == 1 else "O (residency = host)"
        opt = f"O (residency = {off_opt})" if off_opt else "S"
        grads = grads if off_opt else "S"
        head = (f"strategy s {{\n  role = data\n  params: {pmode}\n  optimizer: {opt}\n"
                f"  grads: {grads}\n  activations: R\n}}\n")
    return (head + _model_block(d) + f"mesh {{ {name} = {size} }}\nplan p {{\n  {name}: {strategy}\n}}\n")


def _transformer(d, t: int = 1, p: int = 1, c: int = 1, e: int = 1) -> str:
    kv = t * d(st.integers(1, 4))
    heads = kv * d(st.sampled_from([1, 2, 4]))
    dh = d(st.sampled_from([16, 32, 64]))
    hidden = heads * dh if d(st.booleans()) else heads * dh * 2
    fields = [f"hidden = {hidden}", f"layers = {p * d(st.integers(1, 4))}", f"heads = {heads}",
              f"kv_heads = {kv}", f"ffn = {t * d(st.integers(1, 64)) * 16}", f"vocab = {t * d(st.integers(1, 400)) * 8}"]
    if hidden != heads * dh:
        fields.append(f"head_dim = {dh}")
    if d(st.booleans()):
        fields.append("gated_mlp")
    fields.append(f"norm = {d(st.sampled_from(['rmsnorm', 'layernorm']))}")
    bias = d(st.booleans())
    fields.append(f"bias = {str(bias).lower()}")
    if not bias and d(st.booleans()):
        fields.append("qkv_bias")
    fields.append(f"tied_embeddings = {str(d(st.booleans())).lower()}")
    if e > 1 or d(st.booleans()):
        fields += [f"experts = {e * d(st.integers(2, 4))}", f"top_k = {d(st.integers(1, 2))}"]
        if d(st.booleans()):
            fields.append(f"expert_ffn = {t * d(st.integers(1, 32)) * 16}")
        layers = int(fields[1].split("=")[1])
        pattern = d(st.sampled_from(["none", "dense", "every"]))
        if pattern == "dense" and layers > 1:
            fields.append(f"dense_layers = {d(st.integers(1, layers - 1))}")
        elif pattern == "every":
            k = d(st.integers(1, 3))
            r = d(st.integers(0, k - 1))
            first = d(st.integers(0, 2))
            if first + (r - first) % k < layers:  # at least one MoE layer
                fields.append(f"moe_every = {k}\n    moe_offset = {r}" + (f"\n    dense_layers = {first}" if first else ""))
    if d(st.booleans()):
        fields.append("qk_norm")
    return "  transformer {\n" + "".join(f"    {f}\n" for f in fields) + "  }"


@st.composite
def megatron_plans(draw):
    """Data (DDP or the distributed optimizer), tensor (with or without sequence parallelism),
    pipeline (1F1B or interleaved with v chunks), context and expert axes in any subset and order
    (context and expert not both: Megatron-LM forms its expert groups from the context ranks
    first, a folding, tests/test_import_folding.py)."""
    d = draw
    roles = d(st.lists(st.sampled_from(["dp", "tp", "pp", "cp", "ep"]), unique=True, min_size=1)
              .filter(lambda rs: not {"cp", "ep"} <= set(rs)))
    names = d(st.lists(NAMES, min_size=len(roles), max_size=len(roles), unique=True))
    size = {r: d(st.sampled_from([2, 4])) for r in roles}
    binding, imports = {}, set()
    v = d(st.sampled_from([1, 2, 3])) if "pp" in roles else 1
    for r in roles:
        if r == "dp":
            s = d(st.sampled_from(["ddp", "zero1"]))
            binding[r], _ = s, imports.add(f"from std.data import {s}")
        elif r == "tp":
            s = d(st.sampled_from(["megatron_tp", "megatron_sp"]))
            binding[r], _ = s, imports.add(f"from std.tensor import {s}")
        elif r == "pp":
            binding[r] = f"interleaved_1f1b(v = {v})" if v > 1 else "one_f_one_b"
            imports.add("from std.pipeline import " + ("interleaved_1f1b" if v > 1 else "one_f_one_b"))
        elif r == "cp":
            binding[r], _ = "context_parallel", imports.add("from std.context import context_parallel")
        else:
            binding[r], _ = "expert_parallel", imports.add("from std.expert import expert_parallel")
    tr = _transformer(d, size.get("tp", 1), size.get("pp", 1) * v, size.get("cp", 1), size.get("ep", 1))
    model = _model_block(d, transformer=tr, widths=(MEGATRON_HALF, HALF, FP32))
    settings_ = []
    rec = d(st.sampled_from(["none", "selective", "full"]))
    if rec != "none":
        settings_.append(f"recompute = {rec}")
    if d(st.booleans()):
        settings_.append("flash_attention")
    order = d(st.permutations(range(len(roles))))
    mesh = "mesh {\n" + "".join(f"  {names[i]} = {size[roles[i]]}\n" for i in order) + "}\n"
    plan = "plan p {\n" + "".join(f"  {names[i]}: {binding[roles[i]]}\n" for i in order) \
        + "".join(f"  {s}\n" for s in settings_) + "}\n"
    return "\n".join(sorted(imports)) + "\n" + model + mesh + plan


@st.composite
def torchtitan_plans(draw):
    """FSDP (shard), DDP (replicate) or HSDP (both) with tensor (sequence parallel), pipeline
    (GPipe, 1F1B, interleaved 1F1B), context and activation checkpointing."""
    d = draw
    data = d(st.sampled_from(["shard", "replicate", "hsdp"]))
    others = d(st.lists(st.sampled_from(["tp", "pp", "cp"]), unique=True))
    names = d(st.lists(NAMES, min_size=len(others) + 2, max_size=len(others) + 2, unique=True))
    imports, lines, mesh = set(), [], []
    if data == "hsdp":
        r, s = names[0], names[1]
        mesh += [f"  {r} = {d(st.sampled_from([2, 4]))}", f"  {s} = {d(st.sampled_from([2, 8]))}"]
        lines.append(f"  [{r}, {s}]: hybrid_shard")
        imports.add("from std.data import hybrid_shard")
    else:
        s = d(st.sampled_from(["fsdp_full_shard", "fsdp_shard_grad_op"])) if data == "shard" else "ddp"
        mesh.append(f"  {names[0]} = {d(st.sampled_from([2, 4, 8]))}")
        lines.append(f"  {names[0]}: {s}")
        imports.add(f"from std.data import {s}")
    for r, nm in zip(others, names[2:]):
        size = d(st.sampled_from([2, 4]))
        mesh.append(f"  {nm} = {size}")
        if r == "tp":
            lines.append(f"  {nm}: megatron_sp")
            imports.add("from std.tensor import megatron_sp")
        elif r == "cp":
            lines.append(f"  {nm}: context_parallel")
            imports.add("from std.context import context_parallel")
        else:
            sched = d(st.sampled_from(["gpipe", "one_f_one_b", "interleaved_1f1b(v = 2)", "interleaved_1f1b(v = 3)"]))
            lines.append(f"  {nm}: {sched}")
            imports.add(f"from std.pipeline import {sched.split('(')[0]}")
    rec = d(st.sampled_from(["none", "selective", "full"]))
    if rec != "none":
        lines.append(f"  recompute = {rec}")
    lines.append("  flash_attention")
    order = d(st.permutations(range(len(mesh))))
    return ("\n".join(sorted(imports)) + "\n" + _model_block(d)
            + "mesh {\n" + "\n".join(mesh[i] for i in order) + "\n}\nplan p {\n" + "\n".join(lines) + "\n}\n")


# --------------------------------------------------------------------------- round trips


def _drawn(text: str) -> ir.Spec:
    """A drawn plan; one the language refuses (two pipeline schedules, say) is not a case."""
    try:
        return load_string(text)
    except DiagnosticError:
        reject()


def _deepspeed_round_trip(text: str):
    spec = _drawn(text)
    plan = spec.plans[0]
    cfg, problems = plan_to_deepspeed(spec, plan)
    if problems:
        return spec, plan, problems, None
    b = dict(spec.bindings)
    seq = fold(plan.model.seq, b) if plan.model.seq is not None else None
    back = _load(deepspeed_to_spec(json.dumps(cfg), "<cfg>", _devices(spec, plan), None,
                                   int(fold(plan.model.params, b)), seq=int(seq) if seq else None))
    return spec, plan, problems, back


def _megatron_round_trip(text: str):
    spec = _drawn(text)
    plan = spec.plans[0]
    argv, problems = plan_to_megatron(spec, plan)
    if problems:
        return spec, plan, problems, None
    return spec, plan, problems, _load(megatron_to_spec(shlex.join(argv), "<args>", _devices(spec, plan)))


def _torchtitan_round_trip(text: str):
    spec = _drawn(text)
    plan = spec.plans[0]
    toml_text, problems = plan_to_torchtitan(spec, plan)
    if problems:
        return spec, plan, problems, None
    params = int(fold(plan.model.params, dict(spec.bindings)))
    return spec, plan, problems, _load(torchtitan_to_spec(toml_text, "<toml>", _devices(spec, plan), None, params))


@SETTINGS
@given(deepspeed_plans())
def test_deepspeed_round_trip(text):
    spec, plan, problems, back = _deepspeed_round_trip(text)
    assert problems == [], (text, problems)
    assert normal_form(back, back.plans[0]) == normal_form(spec, plan), text


@SETTINGS
@given(megatron_plans())
def test_megatron_round_trip(text):
    spec, plan, problems, back = _megatron_round_trip(text)
    assert problems == [], (text, problems)
    assert normal_form(back, back.plans[0]) == normal_form(spec, plan), text


@SETTINGS
@given(torchtitan_plans())
def test_torchtitan_round_trip(text):
    spec, plan, problems, back = _torchtitan_round_trip(text)
    assert problems == [], (text, problems)
    assert normal_form(back, back.plans[0]) == normal_form(spec, plan), text


# --------------------------------------------------------------------------- wider than the vocabulary

ONE_AXIS = {"ddp": "data", "zero1": "data", "zero2": "data", "zero3": "data", "fsdp_full_shard": "data",
            "fsdp_shard_grad_op": "data", "zero_offload": "offload", "zero_infinity": "offload",
            "megatron_tp": "tensor", "megatron_sp": "tensor", "one_f_one_b": "pipeline", "gpipe": "pipeline",
            "interleaved_1f1b": "pipeline", "context_parallel": "context", "expert_parallel": "expert"}
EXTRAS = ["q_lora_rank = 16\n    kv_lora_rank = 16\n    qk_rope_dim = 8\n    qk_nope_dim = 8\n    v_head_dim = 8",
          "shared_experts = 2", "shared_experts = 1\n    shared_expert_gate", "dense_layers = 1", "mtp_layers = 1",
          "router_bias", "norms_per_layer = 4", "vocab_multiple = 64", "position_embeddings = 128",
          "capacity_factor = 2", "qk_norm", "bias = true\n    qkv_bias = false", "moe_every = 2",
          "moe_every = 3\n    moe_offset = 1", "moe_every = 2\n    dense_layers = 3"]


@st.composite
def wide_plans(draw, transformer: bool):
    """Any library strategies on any axes (two of one role included), any widths and settings."""
    d = draw
    chosen = d(st.lists(st.sampled_from(sorted(ONE_AXIS) + ["hybrid_shard"]), min_size=1, max_size=4))
    names = iter(["a", "b", "c", "e", "f", "g", "h", "i"])
    mesh, lines, imports = [], [], set()
    for s in chosen:
        imports.add(f"from std.{ONE_AXIS.get(s, 'data')} import {s}")
        if s == "hybrid_shard":
            x, y = next(names), next(names)
            mesh += [f"  {x} = 2", f"  {y} = 2"]
            lines.append(f"  [{x}, {y}]: hybrid_shard")
        else:
            x = next(names)
            mesh.append(f"  {x} = {d(st.sampled_from([1, 2]))}")
            lines.append(f"  {x}: {s}" + ("(v = 2)" if s == "interleaved_1f1b" else ""))
    rec = d(st.sampled_from(["none", "selective", "full"]))
    if rec != "none":
        lines.append(f"  recompute = {rec}")
    if d(st.booleans()):
        lines.append("  flash_attention")
    widths = d(st.sampled_from([HALF, FP32, MEGATRON_HALF, (2, 2, 12, 4), (4, 4, 12, 4), (2, 4, 12, 2)]))
    if transformer:
        extra = d(st.lists(st.sampled_from(EXTRAS), max_size=2, unique_by=lambda x: x.split()[0]))
        body = ("  transformer {\n    hidden = 64\n    layers = 8\n    heads = 8\n    kv_heads = 8\n    ffn = 128\n"
                "    vocab = 256\n    experts = 4\n    top_k = 2\n    expert_ffn = 32\n    norm = rmsnorm\n"
                "    gated_mlp\n" + "".join(f"    {x}\n" for x in extra) + "  }\n")
        if "bias = true" not in body:
            body = body.replace("    gated_mlp\n", "    gated_mlp\n    bias = false\n")
    else:
        body = f"  params = {d(st.integers(1, 10**6)) * 1000}\n"
    model = ("model {\n" + body + "  bytes {\n    params = %d\n    grads = %d\n    optimizer = %d\n"
             "    activations = %d\n  }\n" % widths + "  seq = 1024\n  microbatch = 2\n  microbatches = 4\n}\n")
    return ("\n".join(sorted(imports)) + "\n" + model + "mesh {\n" + "\n".join(mesh) + "\n}\nplan p {\n"
            + "\n".join(lines) + "\n}\n")


def _stated_or_exact(round_trip, text):
    spec, plan, problems, back = round_trip(text)
    if problems:
        assert all(isinstance(p, str) and p for p in problems)
        return
    assert normal_form(back, back.plans[0]) == normal_form(spec, plan), text


@SETTINGS
@given(wide_plans(transformer=False))
def test_deepspeed_states_what_it_drops(text):
    _stated_or_exact(_deepspeed_round_trip, text)


@SETTINGS
@given(wide_plans(transformer=True))
def test_megatron_states_what_it_drops(text):
    _stated_or_exact(_megatron_round_trip, text)


@SETTINGS
@given(wide_plans(transformer=False))
def test_torchtitan_states_what_it_drops(text):
    _stated_or_exact(_torchtitan_round_trip, text)
