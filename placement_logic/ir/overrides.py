"""The override vocabulary: what ``override TARGET[GROUP]: VERB`` accepts (resolve checks it,
the checker reads it). Re-exported by ``ir.nodes`` and ``ir``."""

from __future__ import annotations

from .override_names import OverrideTarget, OverrideVerb  # noqa: F401 (re-exported)

# target -> verbs accepted by resolve; each verb says whether it takes `over` / `by`.
OVERRIDE_VERBS: dict[str, dict[str, tuple[bool, bool]]] = {
    "grads": {
        "reduce": (True, False),  # gradients reduced (summed) over exactly these axes
        "divide": (False, True),  # gradients divided by this divisor after reduction
        "no_accumulation_buffer": (False, False),  # sharded grads with no full accumulator
        # the (replicated) gradient buffer reduced after every microbatch's backward, not once per step
        "reduce_every_microbatch": (False, False),
        # the accumulated (never cleared) buffer reduced after every microbatch's backward and the result added into a
        # separate accumulator (ZeRO's reduced gradient): micro-step k counted m - k + 1 times (check.rereduce)
        "reduce_accumulated_every_microbatch": (False, False),
        # the accumulating buffer all-reduced with a sum (no division) in place after every microbatch's backward:
        # micro-step k multiplied by n^(m - k) over the n ranks of its reduction (check.resummed)
        "reduce_summed_every_microbatch": (False, False),
        # the once-per-step reduction armed on a micro-step before the last (no_sync around the later ones)
        "sync_before_last": (False, False),
        # the gradient buffer never cleared between optimizer steps (zero_grad skipped): each update reads the sum
        # of this step's gradient and every earlier step's (check.carryover)
        "no_zero_grad": (False, False),
        # the flat gradient buffer laid out in a different parameter order on some ranks of these axes (check.buckets)
        "bucket_order": (True, False),
        # a clip coefficient, or a divisor every rank applies, applied on rank 0 of these axes only (check.rankupdate)
        "clip_rank0_only": (True, False),
        "divide_rank0_only": (True, True),
        # a divisor applied on every rank of these axes but the last (every pipeline stage but the last scaling
        # again), or on the last rank only (check.subgroups)
        "divide_except_last": (True, True),
        "divide_last_only": (True, True),
        # a clip coefficient, or a divisor, applied on the ranks R1, R2, ... of the named axis only (ranks (R1, ...):
        # an operation under `if rank == k` / `if rank in (...)`, check.rankset)
        "clip_on_ranks": (True, False),
        "divide_on_ranks": (True, True),
        # the gradient reduction over each of these axes run within blocks of B consecutive ranks (a process group
        # over part of the axis: per-node groups) instead of over the whole axis (check.subgroups)
        "reduce_blocks": (True, True),
        # ... within strided groups of ranks r, r+S, r+2S, ... (stride S: groups built with the wrong stride), or
        # within the first K ranks only, the others reducing nothing (check.subgroups)
        "reduce_strided": (True, True),
        "reduce_first": (True, True),
        # ... within consecutive groups of the sizes S1, S2, ... (by (S1, S2, ...): groups of unequal sizes, a
        # per-node group on nodes of unequal GPU counts, a hand-written new_group list; check.subgroups)
        "reduce_groups": (True, False),
        # ... within the process groups given by a list of rank sets, ranks ([0, 2, 3], [1, 4]) (one new_group per
        # set, ranks in any order: a partition of the axis's ranks; check.subgroups)
        "reduce_sets": (True, False),
    },
    "clip_norm": {
        "reduce": (True, False),  # squared norms summed over exactly these axes
        "double_count": (False, False),  # group counted twice in the norm
        # the duplicate filter: a group's copies on these axes counted on one rank only (with a stated reduce)
        "dedupe": (True, False),
        # how the ranks' values are combined (check.clipagg): averaged (all-reduce AVG) or their maximum
        "average": (True, False),
        "max": (True, False),
        # each rank's square root taken before the reduction: local norms summed, not squared ones
        "sqrt_before_reduce": (False, False),
        # a group's squared norm counted on rank 0 of these axes only (not marked model-parallel: check.perrank)
        "rank0_only": (True, False),
        # a group's squared norm counted on the ranks R1, R2, ... of the named axis only (ranks (R1, ...): a norm
        # filter that keeps the group on some ranks, rank0_only being ranks (0); check.rankcount)
        "count_on_ranks": (True, False),
        # each rank's squared norm plus EPS before the reduction: Σ (s + ε), not Σ s + ε (check.rankupdate)
        "eps_before_reduce": (False, True),
        # EPS added to the squared norm on the ranks R1, R2, ... of the process group over these axes only, before the
        # reduction (``if rank == 0: total_norm_sq += eps``; check.normeps)
        "eps_on_ranks": (True, True),
        # the norm's reduction over each of these axes run within blocks of B consecutive ranks (check.subgroups)
        "reduce_blocks": (True, True),
        # the filter takes a group's copied kv heads over these axes for distinct shards: every copy counted
        # (check.kvnorm)
        "count_copies": (True, False),
        # ... within strided groups of stride S, or within the first K ranks only (check.subgroups)
        "reduce_strided": (True, True),
        "reduce_first": (True, True),
        "reduce_groups": (True, False),  # ... within consecutive groups of the sizes S1, S2, ... (check.subgroups)
        "reduce_sets": (True, False),  # ... within the process groups of the rank sets given (check.subgroups)
    },
    "loss": {
        "per_device_mean": (False, False),
        "per_microbatch_mean": (False, False),
        "global_mean": (False, False),
        "sum": (False, False),  # the objective is the sum over tokens (reduction='sum'): no normaliser
        "divide": (False, True),  # a loss term's contributions divided by this (loss[TERM] only, ir.losses)
        # a term's per-sequence values (each sequence's token mean, or token sum) averaged over the global batch's
        # sequences, the count summed over the token axes and microbatches (loss[TERM] only, check.seqterms)
        "per_sequence_mean": (False, False),
        "per_sequence_sum": (False, False),
        # the routing statistics of loss[aux] gathered per sequence, per local microbatch or over the step's
        # microbatches, summed over these axes (check.auxstats)
        "stats_per_sequence": (True, False),
        "stats_per_microbatch": (True, False),
        "stats_per_step": (True, False),
        # each packed row's statistics (every document of the row at once), summed over these axes (check.auxpacked)
        "stats_per_row": (True, False),
        # the documents of a packed row averaged weighted by their real lengths, not equally (check.auxpacked)
        "stats_length_weighted": (False, False),
        # the mean router probabilities P of loss[aux] over a group of their own (f keeps the stats_* group), and
        # the statistics counted over every padded position (check.auxstats)
        "probs_per_sequence": (True, False),
        "probs_per_microbatch": (True, False),
        "probs_per_step": (True, False),
        "stats_count_padding": (False, False),
        # the router calls' statistics combined with equal weights over these axes or over the microbatches, and f
        # from the post-capacity routing map (check.encode_auxcells)
        "stats_equal_cell_weights": (True, False),
        "stats_equal_microbatch_weights": (False, False),
        "stats_after_capacity": (False, False),
        "stats_capacity_padded": (False, False),
        # the term added to the objective on the ranks R1, R2, ... of the process group over these axes only
        # (``ranks (R1, ...)``: ``if rank == 0: loss = loss + aux``), or its contributions divided by X there only
        # (a coefficient or 1/microbatches applied on some ranks; check.termranks)
        "on_ranks": (True, False),
        "divide_on_ranks": (True, True),
        # each rank of these context axes computes the loss on the sequence gathered over them (its count the whole
        # sequence's); the gather's backward keeps each rank's own shard (check.gathered)
        "on_gathered_sequence": (True, False),
    },
    "tokens": {
        "reduce": (True, False),  # token count summed over exactly these axes
        "equal": (False, False),  # every device and microbatch holds the same number of tokens
        # the length a rank of these context axes divides its part of each sequence by, under a per-sequence token
        # mean: its own slice's (local: the cp ranks' slice means then averaged as if they were sequences) or the
        # whole sequence's, its count all-reduced over the axes (gathered) (check.seqterms)
        "per_sequence_local": (True, False),
        "per_sequence_gathered": (True, False),
        # each microbatch's local count clamped to >= 1 before it is summed and all-reduced (check.partial)
        "clamp_before_reduce": (False, False),
        # each microbatch's local count plus EPS before it is summed and all-reduced: Σ (n + ε) (check.partial)
        "eps_before_reduce": (False, True),
        # the count includes the tokens whose label is ignored (-100, padding, the position the shift drops) (check.ignored)
        "count_ignored": (False, False),
        # the loss terms of the tokens whose label is ignored summed into the loss: a cross entropy without
        # ignore_index and no loss mask over them (check.encode_ignored_loss)
        "ignored_in_loss": (False, False),
    },
    "dropout_seed": {"vary": (True, False), "same": (False, False)},
    "overflow": {"reduce": (True, False)},  # overflow flag all-reduced over these axes
    # the dynamic loss scale updated from each rank's own found-inf flag over these axes (check.rankupdate); the
    # scaler's counters (growth tracker, hysteresis) updated from it, the scales parting steps later (check.scalerstate)
    "loss_scale": {"local": (True, False), "growth_local": (True, False)},
    # the fp8 amax (delayed scaling's amax history) of a group's layers not all-reduced over these axes: each rank
    # scales its fp8 casts from its own maximum (local); or all-reduced over exactly these axes (reduce: the
    # fp8_group) (check.amax)
    # its granularity (check.amax_blocks): one scale per block of B elements (blockwise by B: DeepSeek-V3's 128, MX's
    # 32) or per row (rowwise) along the dimensions these axes split, each rank's taken from its own shard
    "amax": {"local": (True, False), "reduce": (True, False), "blockwise": (True, True), "rowwise": (True, False)},
    "params": {
        "no_regather": (False, False),  # sharded optimizer step, no re-gather of params
        "gather": (True, False),  # S* state gathered over these axes
        "no_fetch": (False, False),  # offloaded params never fetched to device
        # params initialised on every rank (a per-rank seed) and never broadcast over these axes
        "no_init_broadcast": (True, False),
    },
    # the optimizer holds copies of the params made before the model was re-wrapped (FSDP, .to(device))
    # a matrix-wise update (ir.optimizers): each whole gradient matrix gathered over these axes on every rank
    # (gather), or each matrix updated whole by one owner rank of the axes and its shards sent back (round_robin)
    # one update after every micro-step's backward, each from that micro-step's gradient, instead of one per step from
    # the accumulated one (step_every_microbatch: check.microupdate)
    "optimizer": {"stale_params": (False, False), "gather": (True, False), "round_robin": (True, False),
                  "step_every_microbatch": (False, False)},
    # the RNG state (generator seed and offset) per rank: the model-parallel tracker not forked per rank
    # (same), offsets advanced differently (advance), one rank's state restored on every rank of the axes
    # (restored_from_one), recomputation without the forward's RNG state (not_preserved)
    "rng": {"same": (True, False), "advance": (True, False), "restored_from_one": (True, False),
            "not_preserved": (False, False)},
    # the activations of a layer region (check/actflow.py; group: attention, mlp, head, embedding, loss, experts,
    # context: context parallelism's key/value exchange (gather) and their gradients' reduce-scatter; experts with an
    # expert tensor group of its own: the routed tokens' gather and reduce-scatter over it):
    # the collective before the column-parallel linear (gather), the one after the row-parallel linear or the
    # embedding's masked lookup (reduce), or a
    # DTensor.from_local-style type asserted at the region's output instead of derived (assert_*)
    # (the vocabulary-parallel cross entropy, group loss: its all-reduces of the max logit, the target's logit and the
    # sum of exponentials)
    "activations": {"gather": (True, False), "reduce": (True, False), "assert_replicate": (True, False),
                    "assert_partial": (True, False), "assert_shard": (True, False), "reduce_max": (True, False),
                    "reduce_target": (True, False), "reduce_sumexp": (True, False),
                    # the cross entropy's extra terms (ir.losses.CE_TERMS): the all-reduce of the sum of the logits
                    # label smoothing's mean log-probability reads, of the sum of exponentials of the z-loss's lse
                    "reduce_smoothing": (True, False), "reduce_zloss": (True, False),
                    # label smoothing's vocabulary size V (its α/V) counted over these axes: each tensor rank holds
                    # V/t words, so over () it is the slice's size (check.actflow_loss)
                    "smoothing_vocab": (True, False),
                    # the MoE layer (group experts): the token dispatch and combine all-to-alls
                    "dispatch": (True, False), "combine": (True, False),
                    # Ulysses context parallelism (group context): the all-to-all before the attention (sequence
                    # shards -> head shards) and its inverse after it
                    "all_to_all": (True, False),
                    # an operation on the row-parallel output while it is still partial over these tensor axes, before
                    # its reduction (check/actpartial.py): the bias or the residual added on every rank (summed t
                    # times), a nonlinearity (activation, norm, dropout) applied to each rank's summand
                    "bias_before_reduce": (True, False), "residual_before_reduce": (True, False),
                    "nonlinear_before_reduce": (True, False),
                    # check/actpartial_regions.py: a linear scale (a constant, the embedding's sqrt(hidden), the
                    # router's gate weights) applied to each summand: commutes with the sum (proved); positional
                    # embeddings added to the embedding's masked lookup, the shared expert's whole output added to
                    # the experts' partial output, on every rank (summed t times)
                    "scale_before_reduce": (True, False), "positional_before_reduce": (True, False),
                    "shared_before_reduce": (True, False)},
    # their gradients in backward: the input gradient's reduction (reduce, no_reduce, reduce_copy: on a copy),
    # the output gradient's gather, a declared input (assert_*) or output (assert_output_*: to_local) gradient type
    "activation_grads": {"reduce": (True, False), "no_reduce": (False, False), "reduce_copy": (False, False),
                         "gather": (True, False), "assert_replicate": (True, False),
                         "assert_partial": (True, False), "assert_shard": (True, False),
                         "assert_output_replicate": (True, False), "assert_output_partial": (True, False),
                         "assert_output_shard": (True, False),
                         "dispatch": (True, False), "combine": (True, False), "all_to_all": (True, False),
                         # the residual's gradient added to the partial input gradient on every rank before its
                         # reduction (check/actpartial.py)
                         "residual_before_reduce": (True, False)},
    # the step's microbatches as rounds of a pipeline schedule of M inside an outer accumulation (check.nested)
    "accumulation": {
        "outer_undivided": (False, True),  # the outer loop divides by nothing: the rounds summed
        "inner_undivided": (False, True),  # the schedule sums its M microbatches, the outer loop divides by rounds
        "rescaled_every_round": (False, True),  # the accumulated buffer scaled by 1/M after every round
    },
    # tied embedding grads summed over these axes; the multi-token-prediction block on a middle stage of this pipeline
    # axis, holding a copy of the embedding (mtp_stage), and an embedding group of the first and last stage only, which
    # leaves that copy out (group_first_last: check.mtpstage)
    "embedding": {"tie_reduce": (True, False), "mtp_stage": (True, False), "group_first_last": (True, False)},
    # checkpoint save, load and reshard (check/checkpoint.py): any statement adds the transition to the step
    "checkpoint": {
        "resume": (False, False),  # saved and loaded on the same mesh, as derived
        "reshard": (True, False),  # loaded on a mesh where these axes have a new size
        "save_from": (True, False),  # [group] written by every rank of these axes (a replica too)
        "save_rank0": (True, False),  # [group] written by rank 0 of these axes only (a shard too)
        "skip_optimizer": (False, False),  # [group] optimizer state not written
        "no_regather_after_load": (False, False),  # params not re-gathered from the loaded master shards
        "load_by_rank": (True, False),  # [group] shards read by rank index over these axes, not remapped
        "rng_shared": (False, False),  # one RNG state (rank 0's) saved and restored on every rank
        "rng_not_restored": (False, False),  # no generator restored: every stream at the fresh process's seed
        # on a new size of a resharded axis, new rank r' reads the stream saved by the old rank of its coordinates
        "rng_by_coordinates": (False, False),
        # [group] its tensor is C components (QKV: 3, gate/up: 2) concatenated, each split over these tensor axes
        "fused": (True, True),
        # [group] its shards keyed by the rank's offset in a contiguous split, not block by block (fused, virtual stages)
        "flat_offset": (True, False),
    },
    # the layout of context parallelism's sequence blocks (check/encode_cplayout.py): [inputs] (or no group) the input
    # tokens' layout, [labels], [loss_mask], [position_ids], [causal_mask] what a per-token tensor (or the
    # attention's causal mask) is laid out as, when it does not follow the inputs; zigzag: rank i of the c context
    # ranks holds chunks i and 2c-1-i of 2c (load-balanced causal attention), contiguous: chunk i of c,
    # zigzag_per_document: each document of a packed sequence cut into 2c chunks, zigzag per document (THD),
    # rank-major; zigzag_document_major: those chunks listed document-major and cut into c contiguous shards
    # (PyTorch's per-document head-tail balancer before pytorch#189902); zigzag_per_document_unpadded: the
    # per-document cut at the real (unpadded) document boundaries, the padding one dummy sequence at the end;
    # ptrr: the order PyTorch's processing-time round-robin balancer computes from the mask (check/cplayout_ptrr.py);
    # documents whose real length is not a multiple of 2c (check/encode_cpshort.py): pad_to_chunks: each padded to a
    # multiple of 2c and cut per document (derived); truncate_to_chunks: that cut, each rank taking its first
    # floor(L/c) slots as real; cut_unequal: the unpadded document cut into 2c chunks of ceil(L/2c), the last short;
    # [causal_mask] under the model's sliding window (``attention { window = W }``, check/cpwindow.py): window_dropped:
    # causal attention without the window; window_local: the window measured between the positions of each rank's
    # local buffer; window_on_diagonal: the window applied on the rank's own block only, the others causal;
    # window_across_documents: the window on the packed positions, the document mask dropped (check/cpwindow_packs.py);
    # [causal_mask] under the model's chunked attention (``attention { chunk = C }``, check/cpchunk.py): chunk_dropped:
    # causal attention without the chunks; chunk_local: the chunks cut on each rank's local slots; chunk_on_diagonal:
    # the chunk boundary applied on the rank's own block only, the others causal
    "layout": {"zigzag": (False, False), "contiguous": (False, False), "zigzag_per_document": (False, False),
               "zigzag_document_major": (False, False), "zigzag_per_document_unpadded": (False, False),
               "ptrr": (False, False), "pad_to_chunks": (False, False), "truncate_to_chunks": (False, False),
               "cut_unequal": (False, False), "window_dropped": (False, False), "window_local": (False, False),
               "window_on_diagonal": (False, False), "window_across_documents": (False, False), "chunk_dropped": (False, False), "chunk_local": (False, False),
               "chunk_on_diagonal": (False, False)},
    # the MoE dispatch's capacity step (check/encode_capacity.py): masks_padding: each router call's real tokens
    # only, every expert keeping its top C = ⌈capacity_factor·k·N/E⌉ of them by router score (as derived);
    # counts_padding: the padded positions routed too, taking slots by score, and N counting them
    "capacity": {"masks_padding": (False, False), "counts_padding": (False, False),
                 # what a dropped (token, expert) pair adds to the combine (check/encode_capdrop.py): drops_zeroed:
                 # nothing (as derived); dropped_uninitialised: its gate weight times a stale buffer's value;
                 # dropped_weighted: its gate weight times the token's own hidden state; and the kept experts' weights:
                 # renormalise_kept over the kept experts, renormalise_dropped over all k chosen, the dropped too
                 "drops_zeroed": (False, False), "dropped_uninitialised": (False, False),
                 "dropped_weighted": (False, False), "renormalise_kept": (False, False),
                 "renormalise_dropped": (False, False)},
    # the MoE router's top-k choice (check/router.py): same: every rank that holds the same tokens routes them as the
    # single device does (its jitter / gate noise drawn from a generator shared over them, its input the reduced
    # activation; as derived); vary: its scores' noise drawn with a per-rank seed over these axes; input_partial: it
    # routes the un-reduced partial sums of the row-parallel linear over these axes (before their all-reduce)
    # and the aux-loss-free routing bias (check/router_bias.py; model flag router_bias): counts_reduce: the per-expert
    # token counts summed over exactly these axes before the step's update bias_e += u * sign(mean - count_e)
    # (derived: every axis whose ranks hold different tokens); counts_recomputed: counted in the forward and again in
    # the recomputed forward (every count doubled, which the sign of the update cannot see: PL506)
    "router": {"same": (False, False), "vary": (True, False), "input_partial": (True, False),
               "counts_reduce": (True, False), "counts_recomputed": (False, False)},
    # the head split of Ulysses' all-to-alls (check/encode_ulysses_heads.py): [forward] / [backward] (no group: both)
    # the rule that gives rank r of the g ranks its contiguous heads of h: uneven (DeepSpeed's uneven all-to-all:
    # floor(h/g) each, one more on the first h mod g ranks), chunk (torch.chunk: ceil(h/g) each until the heads run
    # out), floor (floor(h/g) each, the remainder dropped); [kv] how the kv heads follow: repeat (each rank receives
    # the kv head of each of its query heads, repeated where shared) or split (the kv heads cut by the same rule
    # over their own count)
    "heads": {"uneven": (False, False), "chunk": (False, False), "floor": (False, False),
              "repeat": (False, False), "split": (False, False)},
}

# the groups of `layout[...]` (check/encode_cplayout.py): the input tokens and what must follow their layout
LAYOUT_ITEMS = ("inputs", "labels", "loss_mask", "position_ids", "causal_mask")
# the groups of `heads[...]` (check/encode_ulysses_heads.py): the forward pair of all-to-alls, the backward pair, the kv heads
HEAD_GROUPS = ("forward", "backward", "kv")


# the (target, verb) pairs that take (and need) a ``ranks (R1, R2, ...)`` clause: the ranks of the axis it is on
TAKES_RANKS: frozenset[tuple[str, str]] = frozenset({("grads", "clip_on_ranks"), ("grads", "divide_on_ranks"),
                                                     ("clip_norm", "count_on_ranks"), ("loss", "on_ranks"),
                                                     ("loss", "divide_on_ranks"), ("clip_norm", "eps_on_ranks")})
# the verbs that take ``by (S1, S2, ...)``: the sizes of the consecutive groups an axis is cut into
TAKES_SIZES: frozenset[tuple[str, str]] = frozenset({("grads", "reduce_groups"), ("clip_norm", "reduce_groups")})
# the verbs that take ``ranks ([R, ...], [R, ...])``: the rank sets of the process groups an axis is cut into
TAKES_SETS: frozenset[tuple[str, str]] = frozenset({("grads", "reduce_sets"), ("clip_norm", "reduce_sets")})


PARAM_GROUPS: tuple[str, ...] = ("all", "dense", "kv", "norms", "qk_norms", "biases", "experts", "router", "embedding")
