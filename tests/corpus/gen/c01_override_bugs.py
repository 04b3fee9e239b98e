"""The corpus generator's mutants of overrides: gradient reductions, loss normalisation, global reductions, the tied embedding, accumulation and subtler departures (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import (
    BASES,
    CLIP_FILTER,
    CLIP_FSDP,
    CLIP_PP,
    CP_TOKENS,
    DROPOUT,
    EXPERT_DIV,
    KV_COPIES,
    MB_MEANS,
    MEAN_OF_MEANS,
    NO_BUFFER,
    OVERFLOW,
    QK_NORMS,
    SP_BIASES,
    SP_DROPOUT,
    SP_NORMS,
    TIED_NORM,
    TIED_SUM,
    TWICE,
    gi,
    gi_root,
    mutant,
)

# -- override bugs: gradient reductions -------------------------------------------------

for b, line, groups, ax, extra, mirrors in [
    ("ddp", "override grads: reduce over ()", None, "dp", [], ""),
    ("zero2", "override grads: reduce over ()", None, "dp", [], ""),
    ("tp", "override grads: reduce over ()", None, "dp", [], ""),
    ("hsdp", "override grads: reduce over (gpus)", None, "nodes", [], ""),
    ("hsdp", "override grads: reduce over (nodes)", None, "gpus", [], ""),
    ("cp", "override grads: reduce over (dp)", None, "cp", [], ""),
    ("cp_zero3", "override grads[dense]: reduce over (dp)", ["dense"], "cp", [], ""),
    ("ep", "override grads: reduce over (dp)", ["dense", "norms", "biases", "embedding"], "ep", ["CR07"], ""),
    ("4d", "override grads[dense]: reduce over (dp)", ["dense"], "cp", [], ""),
    ("zeropp_dp", "override grads: reduce over (intra)", None, "inter", [], ""),
    ("sp", "override grads[norms]: reduce over (dp)", ["norms"], "tp", ["CR05"], SP_NORMS),
    ("mqa_tp", "override grads[kv]: reduce over (dp)", ["kv"], "tp", [], KV_COPIES),
    ("mqa_tp", "override grads[qk_norms]: reduce over (dp)", ["qk_norms"], "tp", [], QK_NORMS),
    ("mqa_sp", "override grads[kv]: reduce over (dp)", ["kv"], "tp", [], KV_COPIES),
    ("mqa_sp", "override grads[qk_norms]: reduce over (dp)", ["qk_norms"], "tp", [], QK_NORMS),
    ("3d", "override grads[norms]: reduce over (dp)", ["norms"], "tp", ["CR05"], SP_NORMS),
    ("4d", "override grads[norms]: reduce over (dp, cp)", ["norms"], "tp", ["CR05"], SP_NORMS),
    ("sp", "override grads[biases]: reduce over (dp)", ["biases"], "tp", ["CR05"], SP_BIASES),
    ("3d", "override grads[biases]: reduce over (dp)", ["biases"], "tp", ["CR05"], SP_BIASES),
]:
    bb = BASES[b]
    gs = tuple(groups or bb.all_groups())
    slug = "_".join(gs) if groups and len(gs) == 1 else "non_expert" if groups else "all"
    mutant(f"grads_missing_{ax}_{slug}_{b}", b,
           f"gradients of {', '.join(gs)} not reduced over {ax}, where their contributions are partial "
           f"(`{line.removeprefix('override ')}`).",
           [line], gi(gs, f"over {ax}") + ["CR02"] + extra, gi_root(gs, f"over {ax}"), mirrors=mirrors)

for b, line, groups, ax, extra, what, mirrors in [
    ("ddp", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("zero1", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("zero2", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("fsdp", "override grads: reduce over (dp, dp)", None, "dp", [], "a repeated axis", TWICE),
    ("hsdp", "override grads: reduce over (nodes, gpus, nodes)", None, "nodes", [], "a repeated axis", TWICE),
    ("cp", "override grads: reduce over (dp, cp, cp)", None, "cp", [], "a repeated axis", ""),
    ("gpipe", "override grads[dense]: reduce over (dp, dp)", ["dense"], "dp", [], "a repeated axis", TWICE),
    ("3d", "override grads[norms]: reduce over (dp, tp, tp)", ["norms"], "tp", [], "a repeated axis", ""),
    ("tp", "override grads[dense]: reduce over (dp, tp)", ["dense"], "tp", [],
     "an extra tensor axis on which dense grads are sharded", ""),
    ("tp", "override grads[norms]: reduce over (dp, tp)", ["norms"], "tp", [],
     "an extra tensor axis on which norm grads are replicated (no sequence parallelism)",
     "the sequence-parallel all-reduce applied without SP (NVIDIA/Megatron-LM#443)"),
    ("moe_3d", "override grads[biases]: reduce over (dp, ep, tp)", ["biases"], "tp", [],
     "an extra tensor axis on which bias grads are replicated (no sequence parallelism)", ""),
    ("gpipe", "override grads[dense]: reduce over (dp, pp)", ["dense"], "pp", [],
     "the pipeline axis, on which each stage holds its own layers", ""),
    ("ep", "override grads[experts]: reduce over (dp, ep)", ["experts"], "ep", ["CR07"],
     "the expert axis, where the all-to-all already summed the expert grads", ""),
    ("moe_3d", "override grads[experts]: reduce over (dp, ep)", ["experts"], "ep", ["CR07"],
     "the expert axis, where the all-to-all already summed the expert grads", ""),
]:
    bb = BASES[b]
    gs = tuple(groups or bb.all_groups())
    slug = "_".join(gs) if groups else "all"
    kind = "twice" if "repeated" in what else "extra"
    mutant(f"grads_{kind}_{ax}_{slug}_{b}", b,
           f"gradients of {', '.join(gs)} reduced over {what} (`{line.removeprefix('override ')}`).",
           [line], gi(gs, f"over {ax}") + ["CR02"] + extra, gi_root(gs, f"over {ax}"), mirrors=mirrors)

# wrong divisor
for b, line, groups, extra, what, mirrors in [
    ("ddp", "override grads: divide by dp", None, [], "the global token mean divided again by dp", ""),
    ("zero3", "override grads: divide by 2", None, [], "the global token mean divided by 2", ""),
    ("tp", "override grads[dense]: divide by tp", ["dense"], [], "dense grads divided by tp", ""),
    ("ep", "override grads[experts]: divide by dp", ["experts"], ["CR07"],
     "a per-device mean loss with expert grads divided by dp instead of dp*ep", EXPERT_DIV),
    ("moe_3d", "override grads[experts]: divide by dp", ["experts"], ["CR07"],
     "a per-device mean loss with expert grads divided by dp instead of dp*ep", EXPERT_DIV),
    ("ddp", "override grads: divide by dp", None, [],
     "a sum loss (reduction='sum') whose gradients DDP still averages over dp",
     "a summed loss averaged by DDP's default gradient division"),
    ("zero2", "override grads: divide by dp", None, [],
     "a sum loss whose reduce-scattered gradients are still averaged over dp", ""),
]:
    bb = BASES[b]
    gs = tuple(groups or bb.all_groups())
    lines = [line]
    if "per-device" in what:
        lines = ["override loss: per_device_mean", "override tokens: equal", line]
    if "sum loss" in what:
        lines = ["override loss: sum", line]
    mutant(f"wrong_divisor_{'_'.join(gs) if groups else 'all'}_{b}" + ("_sum_loss" if "sum loss" in what else ""), b, f"{what} (`{line.removeprefix('override ')}`).",
           lines, gi(gs, "normalisation") + extra, gi_root(gs, "normalisation"), mirrors=mirrors)

# -- override bugs: loss normalisation and token counts ----------------------------------

for b, line, what, mirrors in [
    ("ddp", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("zero3", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("hsdp", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("cp", "override loss: per_device_mean", "a mean of per-device means over dp and cp with unequal token counts",
     MEAN_OF_MEANS),
    ("3d", "override loss: per_device_mean", "a mean of per-device means with unequal token counts", MEAN_OF_MEANS),
    ("zero2", "override loss: per_microbatch_mean", "a mean of per-microbatch means with unequal token counts",
     MB_MEANS),
    ("1f1b", "override loss: per_microbatch_mean", "a mean of per-microbatch means with unequal token counts",
     MB_MEANS),
    ("zeropp_zero1", "override loss: per_microbatch_mean", "a mean of per-microbatch means with unequal token counts",
     MB_MEANS),
    ("cp", "override tokens: reduce over (dp)", "the token count summed over dp only, cp times too small", CP_TOKENS),
    ("4d", "override tokens: reduce over (dp)", "the token count summed over dp only, cp times too small", CP_TOKENS),
    ("ddp", "override tokens: reduce over ()", "the token count never summed over dp (a local count)", ""),
    ("hsdp", "override tokens: reduce over (gpus)", "the token count summed over gpus only", ""),
    ("ddp", "override tokens: reduce over (dp, dp)", "the token count summed twice over dp, dp times too large", ""),
    ("cp_zero3", "override tokens: reduce over (dp, cp, cp)", "the token count summed twice over cp", ""),
]:
    bb = BASES[b]
    gs = bb.all_groups()
    target, verb = line.removeprefix("override ").split(": ", 1)
    kind = verb.replace("()", "none").replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
    mutant(f"{target}_{kind}_{b}", b, f"{what} (`{line.removeprefix('override ')}`).",
           [line], gi(gs, "normalisation"), gi_root(gs, "normalisation"), mirrors=mirrors)

# -- override bugs: global reductions ----------------------------------------------------

for b, line, what, mirrors in [
    ("zero3", "override clip_norm: reduce over ()", "the grad norm of the local shard", CLIP_FSDP),
    ("fsdp", "override clip_norm: reduce over ()", "the grad norm of the local shard", CLIP_FSDP),
    ("hsdp", "override clip_norm: reduce over (nodes)", "the grad norm summed over the replicated axis only",
     CLIP_FSDP),
    ("tp", "override clip_norm: reduce over ()", "the grad norm of the local tensor shard",
     "Megatron-LM's clip_grad_norm all-reduces over the model-parallel group"),
    ("3d", "override clip_norm: reduce over (tp)", "the grad norm not summed across pipeline stages", CLIP_PP),
    ("zero3_pp", "override clip_norm: reduce over (dp)", "the grad norm not summed across pipeline stages", CLIP_PP),
    ("fsdp_tp", "override clip_norm[dense]: reduce over (dp)", "the dense grad norm not summed over tp", ""),
    ("fsdp", "override clip_norm[norms]: reduce over ()", "the norms' grad norm of the local shard only", ""),
    ("ddp", "override clip_norm: double_count", "every group counted twice in the grad norm", ""),
    ("zero2", "override clip_norm[norms]: double_count", "the norm weights counted twice in the grad norm", ""),
    ("gpipe", "override clip_norm[embedding]: double_count", "the tied embedding counted twice in the grad norm",
     TIED_NORM),
    ("3d", "override clip_norm[embedding]: double_count", "the tied embedding counted twice in the grad norm",
     TIED_NORM),
    ("zero2", "override overflow: reduce over ()", "the overflow flag of the local gradient shard", OVERFLOW),
    ("tp", "override overflow: reduce over (dp)", "the overflow flag not or-reduced over tp", OVERFLOW),
    ("zero3_pp", "override overflow: reduce over (dp)", "the overflow flag not or-reduced over pipeline stages",
     OVERFLOW),
    ("tp", "override dropout_seed: vary over (tp)", "dropout seeds varying over tp in a replicated region", DROPOUT),
    ("fsdp_tp", "override dropout_seed: vary over (tp)", "dropout seeds varying over tp in a replicated region",
     DROPOUT),
    ("sp", "override dropout_seed: same", "one dropout seed on every sequence-parallel slice", SP_DROPOUT),
    ("3d", "override dropout_seed: same", "one dropout seed on every sequence-parallel slice", SP_DROPOUT),
]:
    target = line.split(":", 1)[0].split()[1].split("[")[0]
    ob = {"clip_norm": "SC clip_norm", "overflow": "SC overflow", "dropout_seed": "SC dropout_seed"}[target]
    verb = line.split(": ", 1)[1].split()[0]
    group = line.split("[", 1)[1].split("]")[0] + "_" if "[" in line.split(":", 1)[0] else ""
    mutant(f"{target}_{group}{verb}_{b}", b, f"{what} (`{line.removeprefix('override ')}`).",
           [line], [ob], mirrors=mirrors)

# -- override bugs: tied embedding and accumulation ---------------------------------------

for b in ["gpipe", "interleaved", "3d"]:
    mutant(f"tie_not_summed_{b}", b,
           "tied embedding copies on the first and last stage never summed (`embedding: tie_reduce over ()`).",
           ["override embedding: tie_reduce over ()"],
           gi(["embedding"], "over pp") + ["SC grads[embedding]", "CR08"], mirrors=TIED_SUM)
for b in ["1f1b", "4d"]:
    mutant(f"tie_summed_twice_{b}", b,
           "tied embedding copies summed twice across the stage pair (`embedding: tie_reduce over (pp, pp)`).",
           ["override embedding: tie_reduce over (pp, pp)"], gi(["embedding"], "over pp") + ["CR08"])

for b in ["zero2_pp", "zero3_pp", "fsdp_4d", "zeropp_dp"]:
    bb = BASES[b]
    mutant(f"no_accumulation_buffer_{b}", b,
           "sharded grads under pipeline accumulation with neither a full buffer nor a reduce-scatter per "
           "microbatch (`grads: no_accumulation_buffer`): all but the last microbatch are lost.",
           ["override grads: no_accumulation_buffer"], gi(bb.all_groups(), "over microbatches") + ["CR06"],
           mirrors=NO_BUFFER)


# -- subtler departures ------------------------------------------------------------------

mutant("experts_replicated_not_reduced_ep", "ep",
       "experts placed R on ep (every rank holds every expert and sees only its own tokens) with expert "
       "grads reduced over dp only (`grads[experts]: reduce over (dp)`): their ep contributions are partial.",
       ["params: {ep: R}", "optimizer: {ep: R}", "grads: {ep: R}", "override grads[experts]: reduce over (dp)"],
       gi(["experts"], "over ep") + ["CR02"])
mutant("grads_extra_tp_dense_replicated_tp", "tp",
       "dense params placed R on tp (every tp rank computes the whole layer on the same tokens) and dense "
       "grads all-reduced over tp anyway (`grads[dense]: reduce over (dp, tp)`), multiplying them by tp.",
       ["params: {tp: R}", "optimizer: {tp: R}", "grads: {tp: R}", "override grads[dense]: reduce over (dp, tp)"],
       gi(["dense"], "over tp") + ["CR02"])
mutant("grads_twice_inter_all_zeropp_zero1", "zeropp_zero1",
       "gradients reduced twice over the inter-node axis (`grads: reduce over (intra, inter, inter)`).",
       ["override grads: reduce over (intra, inter, inter)"],
       gi(BASES["zeropp_zero1"].all_groups(), "over inter") + ["CR02"], mirrors=TWICE)
mutant("tokens_reduce_over_dp_ep", "ep",
       "the token count summed over dp only, although the expert axis splits the batch too "
       "(`tokens: reduce over (dp)`).",
       ["override tokens: reduce over (dp)"], gi(BASES["ep"].all_groups(), "normalisation"), mirrors=CP_TOKENS)
mutant("wrong_divisor_pdm_undivided_ddp", "ddp",
       "a per-device mean loss with equal token counts and the divisor overridden to 1 "
       "(`grads: divide by 1`): the sum of dp device means is dp times the mean.",
       ["override tokens: equal", "override loss: per_device_mean", "override grads: divide by 1"],
       gi(BASES["ddp"].all_groups(), "normalisation"))
mutant("wrong_divisor_pmm_no_microbatches_zero2", "zero2",
       "a per-microbatch mean loss with equal token counts divided by dp only (`grads: divide by dp`), "
       "not by dp times the number of microbatches.",
       ["override tokens: equal", "override loss: per_microbatch_mean", "override grads: divide by dp"],
       gi(BASES["zero2"].all_groups(), "normalisation"))
mutant("wrong_divisor_pdm_missing_cp", "cp",
       "a per-device mean loss with equal token counts divided by dp only (`grads: divide by dp`), "
       "not by dp times cp.",
       ["override tokens: equal", "override loss: per_device_mean", "override grads: divide by dp"],
       gi(BASES["cp"].all_groups(), "normalisation"))
mutant("no_accumulation_buffer_ddp", "ddp",
       "gradient accumulation that keeps the last microbatch only (`grads: no_accumulation_buffer`) "
       "without a pipeline.",
       ["override grads: no_accumulation_buffer"], gi(BASES["ddp"].all_groups(), "over microbatches"))
mutant("clip_norm_reduce_replicated_ddp", "ddp",
       "the grad norm summed over dp although DDP grads are replicated there (`clip_norm: reduce over (dp)`): "
       "every element counted dp times.",
       ["override clip_norm: reduce over (dp)"], ["SC clip_norm"])
mutant("clip_norm_reduce_replicated_tp", "tp",
       "the grad norm summed over dp and tp (`clip_norm: reduce over (dp, tp)`): DDP grads are replicated over "
       "dp, so every element is counted dp times.",
       ["override clip_norm: reduce over (dp, tp)"], ["SC clip_norm"])
for name, b, lines, what in [
    ("clip_norm_norms_reduce_unfiltered_tp", "tp", ["override clip_norm[norms]: reduce over (tp)"],
     "the norm weights' squared norm summed over tp with no duplicate filter (`clip_norm[norms]: reduce over "
     "(tp)`): they are replicated over tp, so every tp rank's copy is counted"),
    ("clip_norm_reduce_unfiltered_tp", "tp", ["override clip_norm: reduce over (tp)"],
     "the grad norm summed over tp with no duplicate filter (`clip_norm: reduce over (tp)`): the norm weights "
     "and biases, replicated over tp, are counted tp times"),
    ("clip_norm_reduce_unfiltered_fsdp_tp", "fsdp_tp", ["override clip_norm: reduce over (dp, tp)"],
     "the grad norm summed over dp and tp with no duplicate filter (`clip_norm: reduce over (dp, tp)`): the "
     "norm weights and biases, replicated over tp, are counted tp times"),
    ("clip_norm_reduce_filter_norms_only_tp", "tp",
     ["override clip_norm: reduce over (tp)", "override clip_norm[norms]: dedupe over (tp)"],
     "the grad norm summed over tp with the duplicate filter stated for the norm weights only "
     "(`clip_norm[norms]: dedupe over (tp)`): the biases, replicated over tp too, are counted tp times"),
]:
    mutant(name, b, what + ".", lines, ["SC clip_norm"], mirrors=CLIP_FILTER)
mutant("dropout_seed_vary_data_only_sp", "sp",
       "dropout seeds varying over dp only (`dropout_seed: vary over (dp)`): sequence-parallel slices on tp "
       "repeat one mask.", ["override dropout_seed: vary over (dp)"], ["SC dropout_seed"], mirrors=SP_DROPOUT)
mutant("gather_replicated_zero1", "zero1",
       "ZeRO-1 params, replicated over dp, all-gathered over dp anyway (`params: gather over (dp)`): dp "
       "identical copies concatenated.", ["override params: gather over (dp)"], ["CR03"])

# loss terms: a term's path against the objective the model states once (docs/semantics.md, "Loss terms")
AUX_ACC = "the MoE aux loss without the accumulation normalisation (NVIDIA-NeMo/Automodel#3359)"
MTP_CP = "the MTP loss scaled by a microbatch count inflated by cp (NVIDIA/Megatron-LM#3959)"
MTP_LOCAL = "the MTP per-token loss normalised by local token counts (NVIDIA/Megatron-LM#7452)"
AUX = ["GI loss[aux] grads[router]", "GI loss[aux]"]
MTP = ["GI loss[mtp] grads[embedding]", "GI loss[mtp] grads[dense]", "GI loss[mtp]"]
mutant("aux_no_microbatch_divisor_ep", "ep",
       "the MoE auxiliary loss (one value per device and microbatch, averaged) divided by the data and expert "
       "sizes but not by the microbatches (`loss[aux]: divide by dp * ep`).",
       ["override loss[aux]: divide by dp * ep"], AUX, mirrors=AUX_ACC, model="moe_aux")
mutant("aux_token_mean_ep", "ep",
       "the MoE auxiliary loss, a value per device and microbatch, divided by the step's token count as a "
       "per-token loss (`loss[aux]: global_mean`).", ["override loss[aux]: global_mean"], AUX, model="moe_aux")
# a loss term on some ranks only (check.termranks)
TERM_RANKS = ("the MoE auxiliary loss added, or scaled, only where the main loss is formed (pytorch/torchtitan#3000, "
              "NVIDIA-NeMo/Automodel#1408)")
mutant("aux_on_dp_rank0_ep", "ep",
       "the MoE auxiliary loss added to the objective on the first data rank only (`if rank == 0: loss = loss + aux`, "
       "`loss[aux]: on_ranks over (dp) ranks (0)`): the other data ranks' contributions are dropped.",
       ["override loss[aux]: on_ranks over (dp) ranks (0)"], AUX, mirrors=TERM_RANKS, model="moe_aux")
mutant("aux_on_last_ep_rank_ep", "ep",
       "the MoE auxiliary loss added on the last expert rank only (`loss[aux]: on_ranks over (ep) ranks (ep - 1)`).",
       ["override loss[aux]: on_ranks over (ep) ranks (ep - 1)"], AUX, model="moe_aux")
mutant("aux_microbatch_divisor_on_rank0_ep", "ep",
       "the MoE auxiliary loss divided by the data and expert sizes on every rank and by the microbatches on "
       "rank 0 of (dp, ep) only (`loss[aux]: divide_on_ranks over (dp, ep) ranks (0) by 4`, the model's 4 microbatches).",
       ["override loss[aux]: divide by dp * ep", "override loss[aux]: divide_on_ranks over (dp, ep) ranks (0) by 4"],
       AUX, mirrors=TERM_RANKS, model="moe_aux")
mutant("aux_stats_per_microbatch_ep", "ep",
       "a global-batch load-balancing loss whose routing statistics are gathered over the data and expert ranks "
       "but taken microbatch by microbatch (`loss[aux]: stats_per_microbatch over (dp, ep)`).",
       ["override loss[aux]: stats_per_microbatch over (dp, ep)"], ["GI aux_stats"],
       mirrors="a batch-wise aux loss under gradient accumulation (pytorch/torchtitan#3000)", model="moe_aux_global")
mutant("aux_stats_local_ep", "ep",
       "a global-batch load-balancing loss computed from each rank's own microbatch (`loss[aux]: stats_per_microbatch "
       "over ()`).", ["override loss[aux]: stats_per_microbatch over ()"], ["GI aux_stats"], model="moe_aux_global")
mutant("aux_stats_over_dp_ep", "ep",
       "a per-microbatch load-balancing loss whose routing statistics are summed over the data ranks, balancing "
       "their union (`loss[aux]: stats_per_microbatch over (dp)`).",
       ["override loss[aux]: stats_per_microbatch over (dp)"], ["GI aux_stats"], model="moe_aux_micro")
mutant("aux_stats_pack_ep", "ep",
       "a sequence-wise load-balancing loss computed over the two packed sequences of a microbatch at once "
       "(`loss[aux]: stats_per_microbatch over ()`).", ["override loss[aux]: stats_per_microbatch over ()"],
       ["GI aux_stats"], mirrors="seq_aux_loss scoring a pack as one sequence (NVIDIA/Megatron-LM#5996)",
       model="moe_aux_seq2")
mutant("aux_stats_count_padding_ep", "ep",
       "a per-microbatch load-balancing loss computed from the router outputs of every position of the padded "
       "microbatch, padding included (`loss[aux]: stats_count_padding`).",
       ["override loss[aux]: stats_count_padding"], ["GI aux_stats"],
       mirrors="load_balancing_loss_func without the attention mask (huggingface/transformers#28505)",
       model="moe_aux_micro")
mutant("aux_probs_over_dp_ep", "ep",
       "a per-microbatch load-balancing loss whose mean router probabilities alone are all-reduced over the data "
       "ranks, the token counts kept per rank: the loss of the data ranks' union "
       "(`loss[aux]: probs_per_microbatch over (dp)`).",
       ["override loss[aux]: probs_per_microbatch over (dp)"], ["GI aux_stats"], model="moe_aux_micro")
mutant("aux_counts_per_microbatch_probs_local_ep", "ep",
       "a global-batch load-balancing loss whose token counts are all-reduced over the data and expert ranks "
       "microbatch by microbatch and whose probabilities stay each rank's own: no statistic spans the step's "
       "microbatches (`loss[aux]: stats_per_microbatch over (dp, ep)`, `probs_per_microbatch over ()`).",
       ["override loss[aux]: stats_per_microbatch over (dp, ep)", "override loss[aux]: probs_per_microbatch over ()"],
       ["GI aux_stats"], model="moe_aux_global")
for name, lines, why in [
    ("aux_counts_global_probs_local_padded_ep",
     ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: probs_per_sequence over ()"],
     "a global-batch load-balancing loss from global token counts times each rank's own mean probabilities per "
     "sequence, the cells' values averaged with equal weights"),
    ("aux_counts_per_microbatch_probs_per_step_padded_ep",
     ["override loss[aux]: stats_per_microbatch over (dp, ep)", "override loss[aux]: probs_per_step over ()"],
     "a global-batch load-balancing loss from token counts all-reduced per microbatch times each rank's mean "
     "probabilities over the step, the cells' values averaged with equal weights"),
]:
    mutant(name, "ep", why + ", on batches whose shards may hold unequal real-token counts (no `tokens: equal`): "
           "the mean of the cells' local factor is not the pooled one.", lines, ["GI aux_stats"],
           mirrors="global_aux_loss's local probabilities under the router's padding mask (NVIDIA/Megatron-LM#1561, "
           "#2121)", model="moe_aux_global")
mutant("aux_equal_microbatch_weights_ep", "ep",
       "a global-batch load-balancing loss whose counts are all-reduced over the data and expert ranks and "
       "accumulated over the step, each microbatch's fractions weighted equally whatever its real tokens "
       "(`loss[aux]: stats_equal_microbatch_weights`).",
       ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: stats_equal_microbatch_weights"],
       ["GI aux_stats"], mirrors="global_aux_loss's running counts over the current microbatch's tokens "
       "(NVIDIA/Megatron-LM#7197)", model="moe_aux_global")
mutant("aux_equal_rank_weights_ep", "ep",
       "a global-batch load-balancing loss whose data ranks' fractions are averaged with equal weights instead of "
       "their counts summed (`loss[aux]: stats_equal_cell_weights over (dp)`).",
       ["override loss[aux]: stats_per_step over (dp, ep)", "override loss[aux]: stats_equal_cell_weights over (dp)"],
       ["GI aux_stats"], model="moe_aux_global")
mutant("aux_after_capacity_ep", "ep",
       "a sequence-wise load-balancing loss whose fractions are counted on the routing map after the capacity step, "
       "the dropped tokens missing (`loss[aux]: stats_after_capacity`).", ["override loss[aux]: stats_after_capacity"],
       ["GI aux_stats"], mirrors="seq_aux_loss on the capacity mask (NVIDIA/Megatron-LM#1513)", model="moe_aux_seq")
mutant("aux_capacity_padded_ep", "ep",
       "a per-microbatch load-balancing loss whose fractions are counted on the routing map padded to capacity "
       "(`loss[aux]: stats_capacity_padded`).", ["override loss[aux]: stats_capacity_padded"], ["GI aux_stats"],
       mirrors="seq_aux_loss with pad_to_capacity (NVIDIA/Megatron-LM#1617)", model="moe_aux_micro")
mutant("capacity_counts_padding_ep", "ep",
       "a dropping MoE layer (capacity factor 1, top-2 of 8) whose router runs without the padding mask before "
       "dispatch: the padded positions take expert slots by their scores and count in the capacity "
       "(`capacity: counts_padding`).", ["override capacity: counts_padding"], ["GI capacity"],
       mirrors="padding consuming expert capacity (NVIDIA/Megatron-LM#5542, marin-community/marin#8953)", model="moe")
mutant("capacity_counts_padding_aux_masked_ep", "ep",
       "padding masked in the load-balancing loss's statistics but not before the capacity step "
       "(`capacity: counts_padding` beside a per-microbatch aux_stats objective).", ["override capacity: counts_padding"],
       ["GI capacity"], mirrors="the aux-loss padding mask alone (NVIDIA/Megatron-LM#2121, then #5542)",
       model="moe_aux_micro")
# what the capacity step's dropped pairs add to the combine (check.encode_capdrop)
for name, model, line, what, mirrors in [
    ("capacity_dropped_weighted_ep", "moe", "dropped_weighted", "a dropping MoE layer whose combine buffer starts "
     "from the hidden states: a dropped pair adds its gate weight times the token", "huggingface/transformers#37017"),
    ("capacity_dropped_uninitialised_ep", "moe_drop_renorm", "dropped_uninitialised", "a dropping MoE layer whose "
     "unpermute buffer is allocated empty: a dropped pair's row keeps a stale value, weighted into the combine",
     "PrimeIntellect-ai/prime-rl#2035, AMD-AGI/Primus-Turbo#345"),
    ("capacity_renormalise_dropped_ep", "moe_drop_renorm", "renormalise_dropped", "the kept experts' gate weights "
     "divided by the sum over all k chosen, the dropped ones too, where the model renormalises over the kept",
     "no public report: the dropped weights in the denominator"),
    ("capacity_renormalise_kept_ep", "moe", "renormalise_kept", "the kept experts' gate weights renormalised after "
     "the capacity step where the model keeps them as the router gave them", "no public report"),
]:
    mutant(name, "ep", what + f" (`capacity: {line}`).", [f"override capacity: {line}"], ["GI capacity dropped"],
           mirrors=mirrors, model=model)
# the MoE router's top-k choice on the tensor ranks that hold the same tokens (check.router)
PARTIALS = "a nonlinear operation on per-rank partials (vllm-project/vllm-ascend#14345)"
for name, base_name, stmt, what, mirrors in [
    ("router_jitter_per_tp_rank_moe_3d", "moe_3d", "vary over (tp)", "a tensor-parallel MoE layer without sequence "
     "parallelism whose router jitter is drawn with a per-rank seed over tp: the tensor ranks route one token to "
     "different experts", "router jitter drawn per tensor rank (databricks/megablocks#118, pytorch/pytorch#103235)"),
    ("router_sampling_per_rank_moe_3d", "moe_3d", "vary over (dp, tp)", "the second expert sampled with noise seeded "
     "per data and tensor rank: the data ranks hold different tokens, the tensor ranks the same ones",
     "DeepSpeed's sampled second expert (deepspeedai/Megatron-DeepSpeed#362)"),
    ("router_input_partial_moe_3d", "moe_3d", "input_partial over (tp)", "a router reading the row-parallel "
     "linear's partial sums over tp, before their all-reduce", PARTIALS),
    ("router_input_partial_sp_moe_etp", "moe_etp", "input_partial over (tp)", "under sequence parallelism, a router "
     "reading the partial sums before their reduce-scatter: each rank scores its summand of its own tokens", PARTIALS),
]:
    mutant(name, base_name, f"{what} (`router: {stmt}`).", [f"override router: {stmt}"], ["GI router"],
           mirrors=mirrors)
mutant("aux_expert_ranks_not_averaged_ep", "ep",
       "the MoE auxiliary loss averaged over dp and the microbatches only: the expert ranks' values, each from "
       "its own tokens, are summed (`loss[aux]: divide by dp * 4`).",
       ["override loss[aux]: divide by dp * 4"], AUX, model="moe_aux")
mutant("mtp_tokens_over_tp", "tp",
       "the MTP loss's token count summed over tp as well as dp (`tokens[mtp]: reduce over (dp, tp)`): every tp "
       "rank counts the same tokens, so the count is tp times too large.",
       ["override tokens[mtp]: reduce over (dp, tp)"], MTP, model="dense_mtp")
mutant("mtp_tokens_dp_only_cp", "cp",
       "the MTP loss's token count summed over dp only under context parallelism (`tokens[mtp]: reduce over "
       "(dp)`): each cp rank counts its slice.", ["override tokens[mtp]: reduce over (dp)"], MTP,
       mirrors=CP_TOKENS, model="dense_mtp")
mutant("mtp_local_token_means_ddp", "ddp",
       "the MTP loss, per token over the global batch, normalised by each microbatch's local token count "
       "(`loss[mtp]: per_microbatch_mean`).", ["override loss[mtp]: per_microbatch_mean"], MTP,
       mirrors=MTP_LOCAL, model="plain_mtp")
mutant("mtp_extra_cp_divisor_cp", "cp",
       "the MTP loss, per token over the global batch, divided by cp as well as the step's token count "
       "(`loss[mtp]: divide by cp`).", ["override loss[mtp]: divide by cp"], MTP, mirrors=MTP_CP,
       model="dense_mtp")

# how the ranks' squared norms are combined: an average or a max over shards, a root taken before the sum
CLIP_MAX = "a sharded optimizer's partition norms combined by max (facebookresearch/fairscale#167)"
CLIP_ROOT = "expert norms all-reduced as norms, not squares (laekov/fastmoe#65)"
mutant("clip_max_zero2", "zero2",
       "the ranks' squared norms of their gradient shards combined by max over dp (`clip_norm: max over (dp)`).",
       ["override clip_norm: max over (dp)"], ["SC clip_norm"], mirrors=CLIP_MAX)
mutant("clip_average_fsdp", "fsdp",
       "the ranks' squared norms of their gradient shards averaged over dp (`clip_norm: average over (dp)`, an "
       "all-reduce with AVG): 1/dp of the global value.", ["override clip_norm: average over (dp)"], ["SC clip_norm"])
mutant("clip_sqrt_before_reduce_tp", "tp",
       "each rank's norm (the root of its squared norm) all-reduced over tp and squared after "
       "(`clip_norm: sqrt_before_reduce`): the tp shards' roots are added.",
       ["override clip_norm: sqrt_before_reduce"], ["SC clip_norm"])
mutant("clip_sqrt_before_reduce_experts_ep", "ep",
       "the experts' norm, not its square, summed over the expert-parallel group "
       "(`clip_norm[experts]: sqrt_before_reduce`).", ["override clip_norm[experts]: sqrt_before_reduce"],
       ["SC clip_norm"], mirrors=CLIP_ROOT)

