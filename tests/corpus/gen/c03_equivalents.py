"""The corpus generator's the equivalent registry and its restatements, checkpoints and loss terms (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from dataclasses import dataclass

from .c00_bases import BASES, KNOWN_GAPS, REGATHER, D, mutant, spec_text

# ---------------------------------------------------------------------------------------
# Equivalents


@dataclass(frozen=True)
class Equivalent:
    name: str
    of: str  # the plan it is equivalent to
    why: str
    imports: tuple[str, ...]
    model: str
    mesh: tuple[tuple[str, int], ...]
    body: tuple[str, ...]
    strategies: tuple[str, ...] = ()
    known_gap: str = ""  # filled from KNOWN_GAPS

    def text(self) -> str:
        header = [f"equivalent to: {self.of}", f"why: {self.why}"]
        if self.known_gap:
            header.append(f"known-gap: {self.known_gap}")
        return spec_text(header, self.imports, self.model, self.mesh, list(self.strategies), "equivalent",
                         list(self.body))


EQUIVALENTS: list[Equivalent] = []


def equivalent(name, of, why, body, base_name=None, imports=(), model=None, mesh=None, strategies=()):
    b = BASES[base_name] if base_name else None
    EQUIVALENTS.append(Equivalent(
        name, of, why, tuple((b.imports if b else ()) + tuple(imports)), model or b.model,
        tuple(mesh or b.mesh), tuple(body), tuple(strategies), KNOWN_GAPS.get(name, "")))


def with_base(name, base_name, why, lines, of=None):
    b = BASES[base_name]
    equivalent(name, of or b.title, why, list(b.bind) + list(lines), base_name)


# a group block restating the plan's own modes, or placing itself as a correct plan would
for name, b, model, why in [
    ("group_restates_ddp", "ddp", "plain_vision_ddp", "a group restating DDP's modes (`placement = {dp: R}`)"),
    ("group_restates_experts_ep", "ep", "moe_experts_restated", "the experts restating expert parallelism's "
     "modes on ep"),
    ("group_zero3_beside_ddp", "ddp", "plain_vision_zero3", "a group placing itself as ZeRO-3 beside DDP: its "
     "buffer is gathered, reduce-scattered and stepped by its own collectives"),
    ("group_params_r_beside_zero3", "zero3", "plain_vision_params_r", "a group's params replicated over dp "
     "beside ZeRO-3: its updated shards are all-gathered after the step by its own buffer's re-gather"),
]:
    bb = BASES[b]
    equivalent(name, bb.title, why + "; the plan computes what single-device training computes.", list(bb.bind), b,
               model=model)

# renamed and reordered axes
for b, mesh, bind in [
    ("ddp", [("replicas", 8)], ["replicas: ddp"]),
    ("zero3", [("shards", 16)], ["shards: zero3"]),
    ("tp", [("tp", 8), ("dp", 8)], ["tp: megatron_tp", "dp: ddp"]),
    ("sp", [("mp", 4), ("batch", 8)], ["batch: zero1", "mp: megatron_sp"]),
    ("hsdp", [("gpus", 8), ("nodes", 4)], ["[nodes, gpus]: hybrid_shard"]),
    ("hsdp", [("inner", 8), ("outer", 4)], ["[outer, inner]: hybrid_shard"]),
    ("3d", [("pp", 4), ("tp", 8), ("dp", 4)], ["pp: interleaved_1f1b(v = 2)", "tp: megatron_sp", "dp: zero1"]),
    ("4d", [("stages", 4), ("ctx", 2), ("tensor", 8), ("batch", 4)],
     ["batch: zero1", "ctx: context_parallel", "tensor: megatron_sp", "stages: interleaved_1f1b(v = 2)"]),
    ("ep", [("experts", 8), ("data", 4)], ["experts: expert_parallel", "data: ddp"]),
    ("cp", [("seq", 4), ("batch", 8)], ["batch: ddp", "seq: context_parallel"]),
    ("zeropp_zero1", [("nodes", 4), ("gpus", 8), ("stages", 4)],
     ["[stages, gpus, nodes]: zeropp_zero1(v = 2, U = 4)"]),
]:
    bb = BASES[b]
    equivalent(f"renamed_{b}_{'_'.join(a for a, _ in mesh)}", bb.title,
               "the same plan with its mesh axes renamed and/or declared in another order; "
               "nothing depends on axis names or order.",
               bind, b, mesh=mesh)

# long forms and shorthands of library strategies
LONG = {
    "ddp": ("data", "R", "R", "R", "R"),
    "zero1": ("data", "R", "S", "R", "R"),
    "zero2": ("data", "R", "S", "S", "R"),
    "zero3": ("data", "S*", "S", "S", "R"),
    "megatron_tp": ("tensor", "S", "S", "S", "S"),
    "context_parallel": ("context", "R", "R", "R", "S"),
    "expert_parallel": ("expert", "S", "S", "S", "R"),
}


def block(name, role, p, o, g, a, extra=()):
    lines = [f"strategy {name} {{", f"  role = {role}"] + [f"  {x}" for x in extra]
    lines += [f"  params: {p}", f"  optimizer: {o}", f"  grads: {g}", f"  activations: {a}", "}"]
    return "\n".join(lines)


for lib, (role, *modes) in LONG.items():
    b = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3", "megatron_tp": "tp",
         "context_parallel": "cp", "expert_parallel": "ep"}[lib]
    bb = BASES[b]
    bind = [x.replace(f": {lib}", ": my_" + lib) for x in bb.bind]
    imports = [i for i in bb.imports if not i.endswith(" " + lib)]
    equivalent(f"long_form_{lib}", bb.title,
               f"std {lib} restated as a block strategy with role = {role} and one line per state.",
               bind, None, imports=imports, model=bb.model, mesh=bb.mesh,
               strategies=[block("my_" + lib, role, *modes)])
    equivalent(f"shorthand_{lib}", bb.title,
               f"std {lib} restated as the 4-tuple shorthand {role}({', '.join(modes)}).",
               bind, None, imports=imports, model=bb.model, mesh=bb.mesh,
               strategies=[f"strategy my_{lib} = {role}({', '.join(modes)})"])

equivalent("shorthand_default_role_zero1", "ZeRO-1", "the shorthand without a role prefix defaults to data.",
           ["dp: my_zero1"], None, model="plain", mesh=[("dp", 8)], strategies=["strategy my_zero1 = (R, S, R, R)"])
equivalent("long_form_megatron_sp", BASES["sp"].title,
           "std megatron_sp restated as a block strategy with the sequence_parallel setting.",
           ["dp: zero1", "tp: my_sp"], None, imports=[D + "zero1"], model="dense", mesh=BASES["sp"].mesh,
           strategies=[block("my_sp", "tensor", "S", "S", "S", "S", ["sequence_parallel"])])
equivalent("extends_megatron_tp_sp", BASES["sp"].title,
           "a strategy extending std megatron_tp with sequence_parallel is std megatron_sp.",
           ["dp: zero1", "tp: my_sp"], None, imports=[D + "zero1", "from std.tensor import megatron_tp"],
           model="dense", mesh=BASES["sp"].mesh,
           strategies=["strategy my_sp extends megatron_tp {\n  sequence_parallel\n}"])
equivalent("long_form_gpipe", BASES["gpipe"].title, "std gpipe restated as a block strategy with its schedule.",
           ["dp: ddp", "pp: my_gpipe"], None, imports=[D + "ddp"], model="tied", mesh=BASES["gpipe"].mesh,
           strategies=[block("my_gpipe", "pipeline", "S", "S", "S", "S", ["schedule = gpipe"])])
equivalent("long_form_hybrid_shard", "FSDP HYBRID_SHARD",
           "std hybrid_shard restated as a two-axis block strategy with per-axis modes.",
           ["[nodes, gpus]: my_hsdp"], None, model="plain", mesh=BASES["hsdp"].mesh,
           strategies=["strategy my_hsdp over (replicate, shard) {\n  role = {replicate: data, shard: data}\n"
                       "  params: {replicate: R, shard: S*}\n  optimizer: {replicate: R, shard: S}\n"
                       "  grads: {replicate: R, shard: S}\n  activations: R\n}"])

# per-axis split of a multi-axis strategy
equivalent("split_hybrid_shard", "FSDP HYBRID_SHARD",
           "hybrid_shard split into its per-axis parts: DDP over nodes and ZeRO-3 over gpus.",
           ["nodes: ddp", "gpus: zero3"], None, imports=[D + "ddp, zero3"], model="plain", mesh=BASES["hsdp"].mesh)
equivalent("split_zeropp_dp", "ZeroPP with DDP across nodes",
           "zeropp_dp split per axis: a pipeline axis, ZeRO-3 over intra and DDP over inter "
           "(the schedule differs only in cost).",
           ["stage: interleaved_1f1b(v = 2)", "intra: zero3", "inter: ddp"], None,
           imports=[D + "ddp, zero3", "from std.pipeline import interleaved_1f1b"], model="pipeline",
           mesh=BASES["zeropp_dp"].mesh)
equivalent("split_zeropp_zero1", "ZeroPP with ZeRO-1 across nodes",
           "zeropp_zero1 split per axis: a pipeline axis, ZeRO-3 over intra and ZeRO-1 over inter "
           "(the schedule differs only in cost).",
           ["stage: gpipe", "intra: zero3", "inter: zero1"], None,
           imports=[D + "zero1, zero3", "from std.pipeline import gpipe"], model="pipeline",
           mesh=BASES["zeropp_zero1"].mesh)

# per-state, per-axis placements written in the plan
with_base("per_axis_zero1_from_ddp", "ddp", "DDP with the optimizer placed S on dp is ZeRO-1.",
          ["optimizer: {dp: S}"], of="ZeRO-1")
with_base("per_axis_zero2_from_ddp", "ddp", "DDP with optimizer and grads placed S on dp is ZeRO-2.",
          ["optimizer: {dp: S}", "grads: {dp: S}"], of="ZeRO-2")
with_base("per_axis_zero3_from_zero2", "zero2", "ZeRO-2 with params placed S* on dp is ZeRO-3.",
          ["params: {dp: S*}"], of="ZeRO-3")
with_base("per_axis_ddp_from_zero3", "zero3", "ZeRO-3 with every state placed R on dp is DDP.",
          ["params: {dp: R}", "optimizer: {dp: R}", "grads: {dp: R}"], of="DDP")
with_base("per_axis_restated_3d", "3d", "the 3D plan's own placements restated per axis.",
          ["params: {dp: R, tp: S, pp: S}", "optimizer: {dp: S, tp: S, pp: S}", "grads: {dp: R, tp: S, pp: S}"])
with_base("per_axis_zero3_tp", "tp", "DDP x TP with ZeRO-3 placements on dp is FSDP x TP.",
          ["params: {dp: S*}", "optimizer: {dp: S}", "grads: {dp: S}"], of=BASES["fsdp_tp"].title)

# explicit overrides that restate the derived behaviour
for name, b, lines, why in [
    ("reduce_dp_ddp", "ddp", ["override grads: reduce over (dp)"], "DDP reduces every group over dp."),
    ("reduce_dp_zero2", "zero2", ["override grads: reduce over (dp)"], "ZeRO-2 reduce-scatters every group over dp."),
    ("reduce_dp_cp", "cp", ["override grads: reduce over (dp, cp)"], "gradients vary over dp and cp."),
    ("reduce_norms_sp", "sp", ["override grads[norms]: reduce over (dp, tp)", "override grads[biases]: reduce over (dp, tp)"],
     "under sequence parallelism norm and bias grads are reduced over dp and tp."),
    ("reduce_heads_mqa", "mqa_tp", ["override grads[kv]: reduce over (dp, tp)",
                                    "override grads[qk_norms]: reduce over (dp, tp)"],
     "the copied K/V head and the query/key norms see each rank's heads only: reduced over dp and tp."),
    ("reduce_heads_mqa_sp", "mqa_sp", ["override grads[kv]: reduce over (dp, tp)",
                                       "override grads[qk_norms]: reduce over (dp, tp)"],
     "with sequence parallelism too, the copied K/V head and the query/key norms are reduced over dp and tp."),
    ("clip_filter_kv_copies_gqa", "gqa_tp", ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)"],
     "a written sum over tp with the duplicate filter over tp: the layer norms, the biases and each copied kv head "
     "counted once, as the derived norm does."),
    ("clip_filter_kv_copies_gqa_tp2", "gqa_tp2", ["override clip_norm: reduce over (tp, tl)",
                                                   "override clip_norm: dedupe over (tp, tl)"],
     "over two tensor axes, a written sum with the duplicate filter over both: each copy group (a run of the joint "
     "index) counted once, as the derived norm does."),
    ("clip_filter_kv_joint_gqa_tp3x4", "gqa_tp3x4", ["override clip_norm: reduce over (tp, tl)",
                                                     "override clip_norm: dedupe over (tp, tl)"],
     "copy groups crossing tp and tl, a written sum with the duplicate filter over both: each copy group (a run of "
     "6 joint ranks) counted once, as the derived norm does."),
    ("clip_filter_names_kv_gqa", "gqa_tp", ["override clip_norm: reduce over (tp)",
                                            "override clip_norm[norms]: dedupe over (tp)",
                                            "override clip_norm[biases]: dedupe over (tp)",
                                            "override clip_norm[kv]: dedupe over (tp)"],
     "the duplicate filter stated group by group, the copied kv heads named: each copy group counted once."),
    ("reduce_experts_ep", "ep", ["override grads[experts]: reduce over (dp)",
                                 "override grads[dense]: reduce over (dp, ep)"],
     "expert grads are reduced over the expert-data axis only, the others over dp and ep."),
    ("tokens_dp", "ddp", ["override tokens: reduce over (dp)"], "the token count is summed over dp."),
    ("tokens_dp_cp", "cp", ["override tokens: reduce over (dp, cp)"], "the token count is summed over dp and cp."),
    ("global_mean", "zero1", ["override loss: global_mean"], "the global token mean is the default loss."),
    ("clip_norm_zero3", "zero3", ["override clip_norm: reduce over (dp)"],
     "ZeRO-3 grads are sharded over dp, so the squared norms are summed over dp."),
    ("clip_norm_dense_3d", "3d", ["override clip_norm[dense]: reduce over (tp, pp)"],
     "dense grads are sharded over tp and pp and replicated over dp (ZeRO-1)."),
    ("overflow_zero3", "zero3", ["override overflow: reduce over (dp)"], "the overflow flag or-reduced over dp."),
    ("dropout_vary_sp", "sp", ["override dropout_seed: vary over (tp)"],
     "sequence-parallel slices take distinct dropout seeds."),
    ("dropout_same_tp", "tp", ["override dropout_seed: same"], "without SP the replicated region takes one seed."),
    ("tie_reduce_pp", "gpipe", ["override embedding: tie_reduce over (pp)"],
     "the tied embedding is summed once over the stage pair."),
    ("gather_dp_zero3", "zero3", ["override params: gather over (dp)"], "ZeRO-3 gathers params once over dp."),
    ("gather_gpus_hsdp", "hsdp", ["override params: gather over (gpus)"],
     "HYBRID_SHARD gathers params once over the shard axis."),
    ("overflow_local_ddp", "ddp", ["override overflow: reduce over ()"],
     "after DDP's all-reduce every rank holds the same full gradient, so a local overflow check agrees."),
]:
    with_base(f"restated_{name}", b, "explicit override restating the derived behaviour: " + why, lines)

# two kv heads on tp = 2 x tl = 2 tensor ranks: each copy group is the whole tl axis (tp holds whole heads), so a
# reduction over (dp, tl) is the sum over each copy group (check.kvproduct)
equivalent("kv_copy_group_whole_tl_gqa", BASES["gqa_tp2"].title,
           "with tp = 2 and tl = 2 each kv head is copied on both tl ranks of one tp rank: `grads[kv]: reduce over "
           "(dp, tl)` sums each copy group once, as the derived collective does.",
           list(BASES["gqa_tp2"].bind) + ["override grads[kv]: reduce over (dp, tl)"], "gqa_tp2",
           mesh=[("dp", 8), ("tp", 2), ("tl", 2)])

# cancelling errors and exact means
for name, b, lines, why in [
    ("twice_divided_ddp", "ddp", ["override grads: reduce over (dp, dp)", "override grads: divide by dp"],
     "a second all-reduce over dp multiplies by dp; dividing by dp cancels it."),
    ("twice_divided_zero1", "zero1", ["override grads: reduce over (dp, dp)", "override grads: divide by dp"],
     "a second all-reduce over dp multiplies by dp; dividing by dp cancels it."),
    ("tokens_twice_grads_twice", "ddp", ["override grads: reduce over (dp, dp)", "override tokens: reduce over (dp, dp)"],
     "reducing the token count twice multiplies it by dp, which cancels the gradient's second reduction."),
    ("pdm_equal_ddp", "ddp", ["override tokens: equal", "override loss: per_device_mean"],
     "packed equal-length batches make a mean of per-device means exact."),
    ("pdm_equal_cp", "cp", ["override tokens: equal", "override loss: per_device_mean"],
     "packed equal-length batches make a mean of per-device means over dp and cp exact."),
    ("pmm_equal_zero2", "zero2", ["override tokens: equal", "override loss: per_microbatch_mean"],
     "equal-token microbatches make a mean of per-microbatch means exact."),
    ("pmm_equal_1f1b", "1f1b", ["override tokens: equal", "override loss: per_microbatch_mean"],
     "equal-token microbatches make a mean of per-microbatch means exact."),
    ("pdm_equal_divisor_ddp", "ddp",
     ["override tokens: equal", "override loss: per_device_mean", "override grads: divide by dp"],
     "with equal tokens a per-device mean divided explicitly by dp is the global mean."),
    ("sum_loss_ddp", "ddp", ["override loss: sum"],
     "a sum loss reduced by summation and never divided is the global sum-loss gradient."),
    ("sum_loss_1f1b", "1f1b", ["override loss: sum"],
     "a sum loss over microbatches and stages: accumulation adds, nothing divides."),
    ("pdm_equal_experts_ep", "ep",
     ["override tokens: equal", "override loss: per_device_mean", "override grads[experts]: divide by dp * ep"],
     "with equal tokens, expert grads of per-device means divided by the whole data group are exact."),
]:
    with_base(f"cancel_{name}", b, why, lines)

# overrides that are harmless under the semantics (an override the step cannot read at all, such as
# no_regather where nothing is re-gathered, is an input error, PL506, and is not in the corpus)
for name, b, lines, why in [
    ("overflow_twice_zero2", "zero2", ["override overflow: reduce over (dp, dp)"],
     "the overflow flag is or-reduced, and an or is idempotent: a second reduction changes nothing."),
    ("overflow_replicated_hsdp", "hsdp", ["override overflow: reduce over (nodes, gpus)"],
     "or-reducing the overflow flag over the replicated axis too changes nothing."),
    ("amax_world_tp", "tp", ["override amax: reduce over (dp, tp)"],
     "the fp8 amax all-reduced over the data and tensor groups, every axis whose ranks hold different pieces: the "
     "derived reduction restated."),
    ("amax_mx_blocks_sp", "sp", ["override amax[dense]: blockwise over (tp) by 32"],
     "MX fp8 scales per block of 32 from each tensor rank's shard: the MLP width, the query width and the "
     "sequence-parallel slices are whole blocks at every tensor size the model takes."),
    ("overflow_world_zero2_pp", "zero2_pp", ["override overflow: reduce over (dp, pp)"],
     "the found-inf flag the loss scaler reads reduced over every axis a gradient is sharded on, as derived: every "
     "rank's scale, growth tracker and hysteresis counter follow single-device training's."),
    ("divide_by_one_ddp", "ddp", ["override grads: divide by 1"], "dividing the global token mean by 1."),
    ("dropout_vary_data_tp", "tp", ["override dropout_seed: vary over (dp)"],
     "dropout seeds are constrained only along the tensor axis; data replicas see different samples anyway."),
    ("tokens_dp_ep", "ep", ["override tokens: reduce over (dp, ep)"],
     "the token count is summed over every axis that splits the batch."),
    ("clip_norm_gpus_hsdp", "hsdp", ["override clip_norm: reduce over (gpus)"],
     "HYBRID_SHARD grads are sharded over gpus and replicated over nodes."),
]:
    with_base(f"harmless_{name}", b, why, lines)

# the duplicate filter stated beside a written norm reduction (Megatron-LM's clip_grad_norm: the
# squared norm of the parameters that are not tensor-parallel duplicates, and of a shared embedding
# on one stage, all-reduced over the model-parallel group)
for name, b, lines, why in [
    ("tp", "tp", ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)"],
     "the grad norm summed over tp, the norm weights and biases (replicated over tp) counted on one tp rank."),
    ("norms_tp", "tp", ["override clip_norm[norms]: reduce over (tp)", "override clip_norm[norms]: dedupe over (tp)"],
     "the norm weights' squared norm summed over tp and counted on one tp rank."),
    ("fsdp_tp", "fsdp_tp", ["override clip_norm: reduce over (dp, tp)", "override clip_norm: dedupe over (tp)"],
     "the grad norm summed over the dp shards and over tp, the tp-replicated groups counted on one tp rank."),
    ("sp", "sp", ["override clip_norm: reduce over (tp)", "override clip_norm: dedupe over (tp)"],
     "under sequence parallelism the reduced norm-weight and bias gradients are replicated over tp: filtered."),
    ("3d", "3d", ["override clip_norm: reduce over (tp, pp)", "override clip_norm: dedupe over (tp, pp)"],
     "Megatron-LM's norm: tensor-parallel duplicates on one tp rank, the tied embedding on one stage, summed "
     "over tp and pp."),
]:
    with_base(f"filtered_clip_norm_{name}", b, "a written norm reduction with the duplicate filter stated: " + why,
              lines)

with_base("experts_replicated_ep", "ep",
          "experts placed R on ep: every rank holds every expert, so expert grads are partial over ep and the "
          "derived schedule reduces them over it; the plan is DDP over both axes.",
          ["params: {ep: R}", "optimizer: {ep: R}", "grads: {ep: R}"], of="DDP x DDP")
with_base("tensor_replicated_tp", "tp",
          "every state placed R on tp without sequence parallelism: each tp rank computes the whole model on "
          "the same tokens, a redundant copy of DDP.",
          ["params: {tp: R}", "optimizer: {tp: R}", "grads: {tp: R}"], of="DDP")

# checkpoint save, load and reshard (check/checkpoint.py; docs/semantics.md, "Checkpoints")
CKPT_EP = "expert-parallel checkpoints written by one ep rank (KempnerInstitute/KempnerForge#202)"
CKPT_REPLICA = "a replica id that ignores the tp rank: every tp rank writes (NVIDIA/Megatron-LM#4801)"
CKPT_SKIP = "optimizer state not saved with bf16 and ZeRO stage 0 (deepspeedai/DeepSpeed#7786)"
CKPT_RESHARD = "optimizer shards not remapped on a new dp size (ServiceNow/Fast-LLM#436, deepspeedai/DeepSpeed#5105)"
CKPT_RNG = "RNG state of tp rank 0 restored on every tp rank (NVIDIA-NeMo/Automodel#3437, NVIDIA/Megatron-LM#6858)"
RESUME = "override checkpoint: resume"
for b, lines, what, mirrors in [
    ("zero3", ["override checkpoint: save_rank0 over (dp)"], "ZeRO-3 state, sharded over dp, written by dp rank 0 "
     "only: the other shards are lost.", CKPT_EP),
    ("ddp", ["override checkpoint: save_from over (dp)"], "DDP state, replicated over dp, written by every dp rank: "
     "dp writes of each key.", CKPT_REPLICA),
    ("tp", ["override checkpoint[norms]: save_from over (tp)"], "LayerNorm weights, replicated over tp, written by "
     "every tp rank.", CKPT_REPLICA),
    ("ep", ["override checkpoint[experts]: save_rank0 over (ep)"], "the experts, split over ep, written by ep rank "
     "0 only.", CKPT_EP),
    ("moe_3d", ["override checkpoint[experts]: save_rank0 over (ep)"], "the experts of a TP x EP plan written by ep "
     "rank 0 only.", CKPT_EP),
    ("zero1", ["override checkpoint: skip_optimizer"], "the optimizer state left out of the checkpoint.", CKPT_SKIP),
    ("3d", ["override checkpoint[dense]: save_rank0 over (pp)"], "the dense layers of every pipeline stage written "
     "by stage 0 only.", CKPT_EP),
]:
    mutant(f"ckpt_save_{b}_{lines[0].split(': ')[1].split()[0]}", b, what, [RESUME] + lines,
           ["SC checkpoint save"], mirrors=mirrors)
for b in ["zero1", "sp", "interleaved"]:
    mutant(f"ckpt_no_regather_after_load_{b}", b, "params replicated over dp over a sharded optimizer, not "
           "all-gathered from the loaded master shards after a load.",
           [RESUME, "override checkpoint: no_regather_after_load"], ["SC checkpoint load re-gather"], mirrors=REGATHER)
for b, axes in [("zero1", "dp"), ("fsdp", "dp"), ("tp", "tp"), ("3d", "pp"), ("ep", "ep")]:
    group = "[experts]" if b == "ep" else ""
    mutant(f"ckpt_reshard_by_rank_{b}_{axes}", b, f"resumed on a new {axes} size with the shards read by rank index.",
           [f"override checkpoint: reshard over ({axes})", f"override checkpoint{group}: load_by_rank over ({axes})"],
           ["SC checkpoint reshard"], mirrors=CKPT_RESHARD)
for b in ["sp", "3d"]:
    mutant(f"ckpt_rng_shared_{b}", b, "one RNG state, tp rank 0's, restored on every sequence-parallel tp rank.",
           [RESUME, "override checkpoint: rng_shared"], ["SC checkpoint rng"], mirrors=CKPT_RNG)
for b in ["ddp", "zero1", "sp"]:
    mutant(f"ckpt_rng_not_restored_{b}", b, "no generator restored after the load: every rank's stream back at its "
           "seed, offset 0.", [RESUME, "override checkpoint: rng_not_restored"], ["SC checkpoint rng"],
           mirrors="the RNG load failed and skipped after a resume (huggingface/accelerate#4283, #3960)")
for b in ["sp", "3d"]:
    mutant(f"ckpt_rng_by_coordinates_{b}", b, "resumed on a new tp size with the RNG streams read by the saved ranks' "
           "coordinates.", ["override checkpoint: reshard over (tp)", "override checkpoint: rng_by_coordinates"],
           ["SC checkpoint rng"], mirrors="RNG keyed by the saved tp/pp coordinates (NVIDIA-NeMo/Megatron-Bridge#5100)")
for b in ["ddp", "zero1", "zero3", "hsdp", "tp", "sp", "ep", "3d", "moe_3d"]:
    with_base(f"ckpt_resume_{b}", b, "a checkpoint saved and loaded on the same mesh as derived: sharded states "
              "written by every rank, replicated ones by rank 0, params re-gathered from a sharded optimizer.", [RESUME])
for b, axes in [("zero1", "dp"), ("zero3", "dp"), ("3d", "dp, tp, pp"), ("ep", "dp, ep")]:
    with_base(f"ckpt_reshard_{b}", b, f"a checkpoint loaded on new sizes of ({axes}), every shard remapped by its "
              "global offset.", [f"override checkpoint: reshard over ({axes})"])
# loss terms whose path, stated, is the objective's own
for name, b, model, line, why in [
    ("aux_stats_global_stated_ep", "ep", "moe_aux_global", "override loss[aux]: stats_per_step over (ep, dp)",
     "the aux loss's routing statistics gathered over every data and expert rank and the step's microbatches"),
    ("aux_stats_micro_local_ep", "ep", "moe_aux_micro", "override loss[aux]: stats_per_microbatch over ()",
     "the aux loss's routing statistics of each rank's microbatch, no rank splitting a sequence"),
    ("aux_stats_seq_tp_moe_3d", "moe_3d", "moe_aux_seq", "override loss[aux]: stats_per_sequence over ()",
     "the aux loss's routing statistics per sequence, the tensor ranks (no sequence parallelism) routing the same "
     "tokens"),
    ("aux_stats_one_sequence_ep", "ep", "moe_aux_seq", "override loss[aux]: stats_per_microbatch over ()",
     "the aux loss's routing statistics of each microbatch, which holds one sequence: its sequence's"),
    ("aux_path_stated_ep", "ep", "moe_aux", "override loss[aux]: per_microbatch_mean",
     "the MoE aux loss's path stated as its objective's own"),
    ("mtp_tokens_stated_cp", "cp", "dense_mtp", "override tokens[mtp]: reduce over (dp, cp)",
     "the MTP loss's token count summed over every axis that splits the tokens"),
    ("mtp_tokens_dp_tp", "tp", "dense_mtp", "override tokens[mtp]: reduce over (dp)",
     "the MTP loss's token count summed over dp, not over tp where every rank sees the same tokens"),
]:
    bb = BASES[b]
    equivalent(name, bb.title, why + "; the term's contributions are weighted as the objective states.",
               list(bb.bind) + [line], b, model=model)

# the aux loss's statistics over packed rows (check.auxpacked): per row pools a row's documents
mutant("aux_stats_packed_row_ep", "ep",
       "a sequence-wise load-balancing loss over packed rows whose router sees each flattened pack as one sequence: "
       "one f and one P per row, its documents pooled (`loss[aux]: stats_per_row over ()`).",
       ["override loss[aux]: stats_per_row over ()"], ["GI aux_stats"],
       mirrors="seq_aux_loss on a variable-length THD pack (NVIDIA/Megatron-LM#6108)", model="moe_aux_seq_packed")
mutant("aux_stats_packed_doc_for_micro_ep", "ep",
       "a per-microbatch load-balancing loss over packed rows computed per document instead "
       "(`loss[aux]: stats_per_sequence over ()`).", ["override loss[aux]: stats_per_sequence over ()"],
       ["GI aux_stats"], model="moe_aux_micro_packed")
mutant("aux_stats_packed_length_weighted_ep", "ep",
       "a sequence-wise load-balancing loss over packed rows whose per-document values are averaged over the tokens, "
       "each document weighted by its length (`loss[aux]: stats_length_weighted`).",
       ["override loss[aux]: stats_length_weighted"], ["GI aux_stats"], model="moe_aux_seq_packed")
for name, model, line, why in [
    ("aux_stats_packed_doc_stated_ep", "moe_aux_seq_packed", "override loss[aux]: stats_per_sequence over ()",
     "the sequence-wise aux loss's statistics per document of the packed rows, no rank splitting a row"),
    ("aux_stats_packed_one_row_ep", "moe_aux_micro_packed", "override loss[aux]: stats_per_row over ()",
     "the per-microbatch aux loss's statistics per packed row, each microbatch one row: its microbatch's"),
]:
    equivalent(name, BASES["ep"].title, why + "; the term's contributions are weighted as the objective states.",
               list(BASES["ep"].bind) + [line], "ep", model=model)

# the aux loss's f and P over groups of their own: the path computes the loss of their union where every shard
# holds as many real tokens (`tokens: equal`), and not where the counts may differ
AUX_SPLIT = [
    ("aux_counts_global_probs_local_ep",
     ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: probs_per_sequence over ()"],
     "a global-batch load-balancing loss from token counts all-reduced over every data and expert rank and "
     "accumulated over the step, times each rank's own mean probabilities per sequence"),
    ("aux_counts_per_microbatch_probs_per_step_ep",
     ["override loss[aux]: stats_per_microbatch over (dp, ep)", "override loss[aux]: probs_per_step over ()"],
     "a global-batch load-balancing loss from token counts all-reduced over the ranks per microbatch and mean "
     "probabilities accumulated over the step per rank"),
]
for name, lines, why in AUX_SPLIT:
    bb = BASES["ep"]
    equivalent(name, bb.title, why + ", every rank and microbatch holding as many tokens, none padded (`tokens: "
               "equal`): the mean over the cells of f·P, one factor common to them, is that factor times the "
               "cells' mean of the other, the pooled one at equal counts, so the path computes the loss of the two "
               "groups' union, the step (NVIDIA/Megatron-LM#1561).",
               list(bb.bind) + lines + ["override tokens: equal"], "ep", model="moe_aux_global")

# the capacity step on each router call's real tokens, the padding masked before it
for name, model, why in [
    ("capacity_masks_padding_ep", "moe", "a dropping MoE layer whose router clears the padded positions before the "
     "capacity step (`capacity: masks_padding`, NVIDIA/Megatron-LM#5542's fix): the objective's step"),
    ("capacity_masks_padding_aux_micro_ep", "moe_aux_micro", "padding masked both in the load-balancing loss's "
     "statistics and before the capacity step (`capacity: masks_padding`)"),
]:
    bb = BASES["ep"]
    equivalent(name, bb.title, why + ".", list(bb.bind) + ["override capacity: masks_padding"], "ep", model=model)

