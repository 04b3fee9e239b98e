"""Every diagnostic code with its short name and one-line description (``CODES``).

Read through ``placement_logic.diagnostics``, which names each code (``Code``) and re-exports this table.
"""

from __future__ import annotations

# code -> (short name, one-line description)
CODES: dict[str, tuple[str, str]] = {
    # lexical and syntax errors: PL0xx
    "PL001": ("unexpected-character", "A character that cannot start any token."),
    "PL002": ("unexpected-token", "A token that does not fit the grammar at this point."),
    "PL003": ("unexpected-end", "The file ended inside a construct (an unterminated block, list or expression)."),
    "PL004": ("unterminated-string", "A string literal with no closing quote."),
    "PL005": ("bad-number", "A numeric literal that cannot be read as an exact number."),
    "PL006": ("unreadable-file", "The file could not be read or is not UTF-8 text."),
    "PL007": ("too-deep", "Expressions or blocks nested more deeply than the parser accepts."),
    # names and structure: PL1xx
    "PL101": ("undefined-name", "A name that is not defined in the spec or its imports."),
    "PL102": ("duplicate-definition", "Two definitions with the same name in one scope."),
    "PL103": ("unknown-state", "A training state other than params, optimizer, grads, activations."),
    "PL104": ("unknown-mode", "A placement mode other than R, S, S*, M, O."),
    "PL105": ("missing-state", "A strategy that leaves one of the four training states unplaced."),
    "PL106": ("duplicate-axis", "A mesh that declares the same axis twice."),
    "PL107": ("bad-axis-size", "A mesh axis size that is not a positive integer."),
    "PL108": ("axis-reused", "A plan that binds the same mesh axis to two strategies."),
    "PL109": ("undefined-axis", "An axis name that is not part of the mesh or of the strategy's axes."),
    "PL110": ("strategy-cycle", "Strategies that extend or alias each other in a cycle."),
    "PL111": ("unknown-module", "An import of a library module that does not exist."),
    "PL112": ("import-cycle", "Files that import each other in a cycle."),
    "PL113": ("unknown-property", "A property name that the enclosing block does not accept."),
    "PL114": ("bad-property-value", "A property value of the wrong kind (e.g. a word where a number is needed)."),
    "PL115": ("arity-mismatch", "A strategy bound to a different number of axes than it declares."),
    "PL116": ("not-a-strategy", "A name used as a strategy that refers to something else."),
    "PL117": ("not-a-plan", "A cost query over a name that is not a plan."),
    "PL118": ("missing-section", "A spec with plans but no model or no mesh."),
    "PL119": ("duplicate-property", "The same property given twice in one block."),
    "PL120": ("bad-tuple", "A placement shorthand that is not a 4-tuple over (params, optimizer, grads, activations)."),
    "PL121": ("unknown-role", "An axis role other than data, tensor, sequence, context, pipeline, expert."),
    "PL122": ("bad-override", "An override whose target, verb or axes are not understood."),
    "PL123": ("unknown-parameter", "A strategy argument that the strategy does not declare."),
    "PL124": ("mode-option", "A placement option that does not fit the mode (e.g. prefetch on a replicated state)."),
    "PL125": ("unbound-axis", "A plan that leaves a mesh axis with no strategy bound to it."),
    "PL126": ("definition-cycle", "Let bindings that refer to each other in a cycle."),
    "PL127": ("axis-less-strategy", "A strategy bound to an axis that places no state, or used with 'use' while placing states."),
    "PL128": ("conflicting-setting", "Two strategies of one plan that set the same plan-wide setting differently."),
    "PL129": ("not-modelled", "An override naming something the step semantics does not model (a process group "
              "over part of an axis, an operation on some ranks, an expert tensor or data size); docs/checker.md, "
              "'Out of scope'."),
    "PL130": ("impossible-shape", "A size a plan's strategies would split into fractions: heads, kv heads, the MLP "
              "width or the vocabulary over the tensor ranks, layers over pipeline stages × chunks, experts over "
              "the expert ranks, the sequence over the context ranks."),
    "PL131": ("impossible-fold", "An expert group's own roles (parallel folding) that cannot hold: roles on a "
              "group that no expert axis divides, a pipeline axis given another role, an expert count or expert width "
              "that the group's own expert or tensor axes do not divide."),
    "PL132": ("product-binding", "A strategy bound to a product of axes that cannot act as one axis: a pipeline "
              "strategy, or placements that differ between the product's axes."),
    "PL133": ("fold-needs-sequence-parallel", "MoE parallel folding that gives a tensor axis of more than one "
              "device another role (expert or data) without sequence parallelism, in a plan or in Megatron-LM "
              "arguments."),
    "PL136": ("split-weight-replicated-grads", "Gradients placed R on a tensor or sequence axis whose params are split "
              "there (S or O): a replicated gradient of a split weight is meaningless."),
    "PL137": ("pipeline-replicated-params", "Params placed R or S* on a pipeline axis: every stage would hold every "
              "stage's layers while running only its own."),
    "PL140": ("bad-config", "A Hugging Face config.json that cannot be read as a model: not JSON, an unsupported "
              "model_type, a missing key or a value of the wrong kind."),
    "PL141": ("bad-framework-config", "A DeepSpeed config or Megatron-LM arguments that cannot be read as a plan."),
    "PL142": ("sees-heads-split", "A parameter group that sees head-split activations ('sees = heads') but is split "
                                  "over the tensor axes itself: only a weight kept whole there has partial gradients."),
    "PL150": ("filter-on-shards", "A duplicate filter (override clip_norm[g]: dedupe over (...)) over an axis where the "
              "group's gradient is sharded: its pieces there are distinct values, not copies of one."),
    "PL151": ("search-input", "A spec placement search cannot search (no model block, no transformer shape), or "
              "numpy (the search extra) missing."),
    "PL160": ("unresolved-auto", "A Hugging Face Trainer DeepSpeed config whose \"auto\" values (among those the "
              "import reads) the options do not fill; every such key is listed at once, each located."),
    "PL161": ("trainer-mismatch", "A DeepSpeed config value that a Trainer option given to the import contradicts "
              "(the Trainer's own mismatch error)."),
    "PL162": ("launch-line-devices", "A launch line whose --nnodes × --nproc_per_node is not the --devices given."),
    "PL163": ("params-below-shape", "params = P beside a transformer shape below the parameters the shape counts."),
    "PL170": ("rank0-unreduced-axis", "A rank-0-only norm count (override clip_norm[g]: rank0_only over (...), or "
              "count_on_ranks over (AXIS) ranks (...)) over an "
              "axis the group's squared norm is not summed over: each rank there counts only its own value."),
    "PL171": ("nested-accumulation", "An accumulation override (override accumulation: VERB by M) the step cannot "
              "read: no pipeline schedule, a loss that is not a per-microbatch mean, a divisor or no accumulation "
              "buffer stated beside it, a group named, or microbatches that are not whole rounds of M."),
    "PL180": ("checkpoint-plan-wide", "A plan-wide checkpoint statement (resume, reshard, no_regather_after_load, "
              "rng_shared, rng_not_restored, rng_by_coordinates) given a parameter group: override checkpoint[g]: VERB."),
    "PL181": ("blocks-unreduced-axis", "A gradient reduction run in blocks (override grads[g]: reduce_blocks over "
              "(...) by B) over an axis the group's gradient is not reduced over."),
    "PL182": ("norm-blocks-axis", "A grad-norm reduction run in blocks (override clip_norm: reduce_blocks over (...) "
              "by B) with a group, or over an axis the norm is not reduced over or no group's gradient is sharded on."),
    "PL183": ("block-size", "A block size, stride or count of ranks (override ...: reduce_blocks / reduce_strided / "
              "reduce_first ... by E) that is not a positive integer."),
    "PL184": ("rank-set-divisors", "Retired, no longer raised: divisors on sets of ranks over different axes now combine "
              "(each device applies their product)."),
    "PL186": ("undeclared-loss-term", "An override of a loss term (loss[TERM], tokens[TERM], aux_loss, ...) that the "
              "model's losses section does not declare."),
    "PL187": ("loss-term-reaches-nothing", "A loss term declared in the model whose parameter groups (the router for "
              "aux and z, the embedding and dense layers for mtp) the plan's model does not have."),
    "PL190": ("activation-assert-off-tensor", "An activation's type asserted (override activations[R] / "
              "activation_grads[R]: assert_replicate | assert_partial | assert_shard, activation_grads[R]: "
              "assert_output_*) over no axis or over an axis that is not a tensor axis."),
    "PL191": ("rank-out-of-range", "A rank of a per-rank operation (override grads[g]: clip_on_ranks / divide_on_ranks, "
              "clip_norm[g]: count_on_ranks "
              "over (AXIS) ranks (...)) that is not a whole number from 0 to the axis's size minus 1."),
    "PL192": ("rank-set-axes", "A rank set over no axis (override grads[g]: clip_on_ranks / divide_on_ranks, "
              "clip_norm[g]: count_on_ranks ... ranks (...))."),
    "PL194": ("partition-twice", "One axis of one reduction (a group's gradient, or the grad norm) cut into groups "
              "by two statements (override ...: reduce_blocks / reduce_strided / reduce_first / reduce_groups / "
              "reduce_sets); statements over different axes combine."),
    "PL197": ("ulysses-heads", "Ulysses' all-to-all (override activations[context] / activation_grads[context]: "
              "all_to_all over (...)) over a group whose size does not divide each tensor rank's attention heads (or "
              "its kv heads, which may instead be repeated over a group that is a multiple of them), where the plan states no "
              "uneven head split (override heads: ...)."),
    # types and units: PL2xx
    "PL201": ("unit-mismatch", "Bytes combined with a plain count by + or - (or compared with one)."),
    "PL202": ("unit-not-allowed", "A byte unit where a plain count is required (axis size, layer count, exponent)."),
    "PL203": ("bad-exponent", "An exponent that is not a plain integer constant."),
    "PL204": ("division-by-zero", "A constant expression that divides by zero."),
    "PL205": ("unknown-function", "A call to a function that the expression language does not define."),
    "PL206": ("bad-arguments", "A call with the wrong number or kind of arguments."),
    "PL207": ("bytes-squared", "A product or power that would give bytes to a power other than 0 or 1."),
    "PL208": ("unknown-unit", "A unit name that is not a byte unit."),
    "PL209": ("number-too-large", "An exact value too large to hold (an exponent tower): over 12,000 bits."),
    # loss terms' routing statistics: PL213-PL215 (check.auxstats; PL214, PL215 where the plan is resolved)
    "PL213": ("stats-scope-term", "A statistics scope (aux_stats, loss[T]: stats_*) for a term that has no routing statistics."),
    "PL214": ("stats-scope-unstated", "loss[aux]: stats_*, probs_* or stats_count_padding in a plan whose model "
              "states no aux_stats objective."),
    "PL215": ("stats-axis", "loss[aux]: stats_* or probs_* over an axis whose ranks hold the same tokens, or an axis "
              "named twice."),
    # optimizers: PL240-PL249
    "PL240": ("unknown-optimizer", "An optimizer section entry that names no known algorithm (adamw, sgd, muon, ...)."),
    "PL241": ("optimizer-argument", "An optimizer argument that is unknown, missing, positional or not a positive whole number."),
    "PL242": ("optimizer-group", "An optimizer entry or optimizer[G] override naming a parameter group the model lacks."),
    "PL243": ("optimizer-on-vectors", "A matrix-, block- or sharded-matrix algorithm on a group of vectors (norms, biases)."),
    "PL244": ("optimizer-twice", "A parameter group given two optimizers in one section."),
    "PL245": ("optimizer-gather-elementwise", "optimizer[G]: gather or round_robin where G's update is element-wise or Dion's."),
    "PL246": ("optimizer-gather-idle", "optimizer[G]: gather over an axis that cuts no matrix of G."),
    "PL250": ("group-sizes", "The sizes of reduce_groups ... by (S1, S2, ...) that cannot partition the axis: a size "
              "that is not a positive whole number, or a sum other than the axis's size."),
    "PL251": ("groups-axis", "reduce_groups ... by (S1, S2, ...) over no axis or several, or a list of sizes given to a "
              "verb that takes none."),
    "PL253": ("ce-term-unstated", "activations[loss]: reduce_smoothing or reduce_zloss where the model states no such term."),
    "PL259": ("rank-never-in-range", "A rank of a norm count on a rank set (override clip_norm[g]: count_on_ranks over "
              "(AXIS) ranks (...)) that is a rank of the axis at no size the axis can take."),
    "PL260": ("norm-rank-sets-twice", "Two norm counts on rank sets (override clip_norm[g]: rank0_only, "
              "count_on_ranks) over one axis reaching one parameter group."),
    # the aux term's statistics over router calls and capacity (check.encode_auxcells, where the plan is resolved)
    "PL264": ("stats-one-cell", "loss[aux]: stats_equal_cell_weights over (AXES) or stats_equal_microbatch_weights "
              "over a dimension whose router calls the path never combines: there is nothing to weight."),
    "PL265": ("capacity-never-drops", "loss[aux]: stats_after_capacity where the model's capacity_factor is at least "
              "experts / top_k: no expert's capacity is ever exceeded."),
    "PL267": ("rank-sets-overlap", "reduce_sets ... ranks ([...], ...) naming one rank in two sets (or twice in one)."),
    "PL268": ("rank-sets-cover", "reduce_sets ... ranks ([...], ...) whose sets miss a rank of the axis or name one past it."),
    "PL269": ("rank-sets-axis", "reduce_sets over no axis, an axis twice, several axes of a size not a number "
              "(for the grad norm also over a reduction that is no plain sum), or rank sets given to a verb that "
              "takes none."),
    "PL270": ("router-counts-pipeline", "override router: counts_reduce over (AXES) naming a pipeline axis: the "
              "routing bias's counts of layers on other stages, each with a bias of its own (not modelled)."),
    "PL271": ("amax-local-and-reduced", "override amax[g]: local over (A) and amax[g]: reduce over (B) (or the "
              "statements for every group) naming one axis: its amax both left out of the reduction and reduced."),
    # the MoE dispatch's capacity step (check.encode_capacity, where the plan is resolved)
    "PL273": ("capacity-no-experts", "override capacity: ... in a model without experts: there is no capacity step."),
    "PL274": ("capacity-padding-never-drops", "override capacity: counts_padding where the model's capacity_factor is "
              "at least experts / top_k: no capacity step drops a token, padded or not."),
    "PL275": ("capacity-renormalise-top1", "override capacity: renormalise_kept | renormalise_dropped in a model of "
              "top_k = 1: a token keeps its one expert or none, so no renormalisation changes its weight."),
    "PL276": ("heads-rule-group", "A head split stated for the wrong group (override heads[kv]: uneven / chunk / floor, "
              "or heads[forward] / heads[backward] / heads: repeat / split)."),
    "PL277": ("heads-no-ulysses", "A head split (override heads[...]) in a plan whose context region states no Ulysses "
              "all-to-all (override activations[context]: all_to_all over (...)), or whose head counts are not numbers."),
    # an operation on the row-parallel output before its reduction (check.actpartial)
    "PL278": ("partial-op-region", "activations[R]: an operation before the reduction (bias_before_reduce, ...) for a "
              "region other than attention, mlp, embedding or experts (no partial output)."),
    "PL279": ("partial-op-verb", "An operation on a partial activation the region's partial value does not have "
              "(a bias or a residual on the embedding's masked lookup, positional embeddings outside the embedding, "
              "the shared expert outside the experts, an operation on the embedding's or experts' input gradient)."),
    "PL280": ("term-divisor-every-rank", "override loss[TERM]: divide_on_ranks naming every rank of its axes at the "
              "file's sizes: a divisor every rank applies, written loss[TERM]: divide by X."),
    "PL281": ("term-rank-sets-twice", "Two override loss[TERM]: on_ranks (or divide_on_ranks) statements for one term: "
              "state one rank set per verb."),
    # the sliding window under context parallelism (check.cpwindow)
    "PL282": ("window-group", "A sliding-window behaviour (override layout[...]: window_dropped / window_local / "
              "window_on_diagonal) stated for a tensor other than the causal mask."),
    "PL283": ("window-size", "The model's sliding window (attention { window = W }) is not a whole number of tokens "
              "of at least 1."),
    "PL284": ("amax-blocks-no-shapes", "override amax: blockwise / rowwise in a model whose widths the split cuts are not "
              "numbers (no transformer block, or a free symbol): where the blocks fall is judged on concrete widths."),
    "PL285": ("amax-block-size", "override amax: blockwise by B where B is not a positive integer: a block holds a whole "
              "number of elements."),
    # documents whose real length is not a multiple of 2c (check.encode_cpshort)
    "PL286": ("layout-short-mixed", "A layout of documents not padded to 2c (pad_to_chunks, truncate_to_chunks, "
              "cut_unequal) beside another layout than zigzag_per_document."),
    # a checkpoint's fused tensors (check.checkpoint)
    "PL287": ("checkpoint-fused-count", "override checkpoint[GROUP]: fused by C where C is not an integer of at least 2: "
              "the number of components (Q, K, V: 3; gate, up: 2) concatenated in the fused tensor."),
    "PL288": ("checkpoint-fused-axis", "override checkpoint[GROUP]: fused over an axis that is not a tensor axis: fused "
              "components are columns a tensor axis splits (a pipeline's virtual stages come from its schedule)."),
    # the capacity step's dropped pairs (check.encode_capdrop)
    # loss terms of the user's own and per-sequence normalisations (check.seqterms)
    "PL289": ("loss-term-name", "A loss term whose name clashes (a reserved word or a parameter group's name) or whose "
              "normalisation it cannot take (a per-sequence one for the router's aux or z)."),
    "PL290": ("capacity-renormalise-unchanged", "override capacity: renormalise_dropped in a model without "
              "drop_renormalise: the gate weights already sum to 1 over the k chosen experts."),
    "PL291": ("override-restated", "A second statement of an override the plan states once (router, capacity, a "
              "tensor's layout, the causal mask's window behaviour, a group's amax granularity, a heads split, a "
              "gathered loss, a loss term's path, divisor or token reduction, a sequence length per context axis, a named region's activation slot)."),
    # the loss computed on the sequence gathered over context axes (check.gathered)
    "PL292": ("gathered-loss-axis", "override loss: on_gathered_sequence over an axis that is not a context axis (Ulysses "
              "or ring context parallelism): only a context axis splits one sequence to gather."),
    "PL293": ("gathered-loss-count", "A per-rank variant of the token count (tokens: clamp_before_reduce, "
              "eps_before_reduce, count_ignored, ignored_in_loss) beside loss: on_gathered_sequence: not modelled."),
    # chunked (local) attention under context parallelism (check.cpchunk)
    "PL294": ("chunk-size", "The model's attention chunk (attention { chunk = C }) is not a whole number of tokens "
              "of at least 1."),
    "PL295": ("chunk-group", "A chunked-attention behaviour (override layout[...]: chunk_dropped / chunk_local / "
              "chunk_on_diagonal) stated for a tensor other than the causal mask."),
    # the multi-token-prediction block's stage and the embedding group (check.mtpstage)
    "PL296": ("mtp-stage-axis", "override embedding: mtp_stage / group_first_last over other than one pipeline axis, "
              "or mtp_stage in a model with no multi-token-prediction block."),
    # the rows pack documents for the aux term's statistics (check.auxpacked)
    "PL297": ("packed-without-stats", "losses { aux_packed = true } where the losses section states no aux_stats: "
              "packing matters only to the statistics' groups."),
    # the accumulated buffer's reduction after every micro-step written back and into an accumulator (check.rereduce)
    "PL298": ("microstep-reduce-conflict", "Two statements of the buffer's reduction after every micro-step: "
              "reduce_accumulated_every_microbatch, reduce_every_microbatch or reduce_summed_every_microbatch "
              "(written into a separate accumulator, averaged in place, summed in place) beside another."),
    "PL299": ("sequence-count-statement", "A statement about sequence counts where there are none to count: a "
              "per-sequence normalisation of the main loss, or tokens[TERM]: equal on a term normalised per token."),
    # usage: PL3xx
    "PL301": ("bad-set", "A --set option that is not NAME=NUMBER or names nothing in the spec."),
    "PL302": ("unknown-plan", "A --plan option that names no plan in the spec."),
    "PL310": ("sweep-too-large", "A sweep of more configurations than one run evaluates (100,000)."),
    "PL311": ("sweep-unbound", "A sweep whose numbers would depend on a symbol that nothing binds."),
    "PL312": ("plot-unavailable", "--plot without matplotlib (the optional plot extra)."),
    "PL313": ("bad-plot", "A --plot file that is not .png, .svg or .pdf, or a plot of a sweep over several names."),
    "PL314": ("sweep-option", "An option a sweep cannot honour (--format latex, --groups), or --exact without a sweep."),
    "PL315": ("calibrate-unavailable", "placement calibrate without torch, or with too few GPUs or a count below 1."),
    # checker: PL500-PL549
    "PL500": ("bad-timeout", "A --timeout that is not a positive number of seconds."),
    "PL501": ("override-axis", "A check override that names an axis which is not on the plan's mesh."),
    "PL502": ("tie-axis", "A tie_reduce override over an axis that is not a pipeline axis."),
    "PL503": ("check-value", "An override value the checker cannot evaluate (a cost query or an unknown operator)."),
    "PL504": ("unbound-check-symbol", "An override value that uses a symbol with no value and no mesh size."),
    "PL505": ("transient-persistent-state", "Params or optimizer state placed M: they persist across steps, M is for gradients and activations."),
    "PL506": ("override-no-effect", "An override the step it modifies cannot read: a statement that would change "
              "nothing (docs/diagnostics.md lists the cases)."),
    # cost engine: PL400-PL449
    "PL400": ("bad-value-expression", "A value expression the cost engine cannot translate (unknown operator or node)."),
    "PL401": ("query-not-allowed", "A cost query (memory(...), comm(...)) where only plain values are allowed."),
    "PL402": ("bad-query-argument", "A cost query argument that is not a state, 'transient', an axis or 'host'."),
    "PL403": ("unknown-query", "A cost query other than memory, host_memory, model_state, comm, volume."),
    # measurement: PL6xx
    "PL601": ("torch-missing", "placement measure and placement trace need PyTorch (the optional torch extra)."),
    "PL602": ("bad-devices", "A --devices count that does not fit the plan's mesh."),
    "PL604": ("bad-steps", "A --steps count below one."),
    "PL620": ("torchrun-env", "placement measure --torchrun outside a torchrun job (RANK, WORLD_SIZE, LOCAL_RANK, "
                              "MASTER_ADDR or MASTER_PORT missing or inconsistent)."),
    "PL621": ("torchrun-devices", "placement measure --torchrun with a --devices count other than torchrun's "
                                  "WORLD_SIZE."),
    "PL611": ("bad-trace-command", "placement trace: a --nproc outside 2-8, or no script after --; trace or lift: a bad "
              "--objective."),
    "PL612": ("bad-trace", "A file that is not a trace placement lift reads (schema, version, ranks)."),
    "PL613": ("trace-failed", "The traced script failed or did not finish on a rank."),
    "PL614": ("not-liftable", "A recorded call placement lift cannot express in a plan (reported, never dropped)."),
    # proofs: PL700-PL749
    "PL700": ("export-failed", "An output file that cannot be written, or would replace an input of the command."),
}
