"""Loss terms besides the main loss: the model block's ``losses { TERM = NORMALISATION }``.

Each term is a loss of its own added to the main loss with its own normalisation (the
objective, stated once in the model) and reaching only some parameter groups: an MoE
auxiliary load-balancing loss and a router z-loss reach the router; multi-token-prediction
heads reach the shared embedding/output head and their own (dense) layers; a term of the user's own
(an RL trainer's policy loss, KL penalty, entropy bonus) reaches the dense layers. A plan states
what its code path does with ``override loss[TERM]: VERB`` and ``override tokens[TERM]:
reduce over (...)``; the checker holds every plan of a spec to the one objective.
"""

from __future__ import annotations

# term -> the gradient groups it reaches (those the model has)
TERMS: dict[str, tuple[str, ...]] = {
    "aux": ("router",),  # MoE auxiliary load-balancing loss
    "z": ("router",),  # router z-loss
    "mtp": ("embedding", "dense"),  # multi-token-prediction heads: shared embedding/output head, own layers
}

# the normalisation a term's objective states (its weight per contribution)
OBJECTIVES: tuple[str, ...] = (
    "global_mean",  # per token over the global batch: divided by the step's whole token count
    "per_microbatch_mean",  # a value per device and microbatch, averaged over every device and microbatch
    "sum",  # per token, summed (no normaliser)
    "per_sequence_mean",  # each sequence's token mean, averaged over the global batch's sequences (seq-mean-token-mean)
    "per_sequence_sum",  # each sequence's token sum, averaged over the global batch's sequences (seq-mean-token-sum)
)

# the per-sequence normalisations: a value per sequence (its tokens' mean or sum), the objective their mean over
# the step's sequences; the sequence counts play the part the token counts play for a per-token mean (check.seqterms)
SEQUENCE_OBJECTIVES: tuple[str, ...] = ("per_sequence_mean", "per_sequence_sum")
# the length a context rank divides its part of a sequence by under a per-sequence token mean (``tokens[T]: VERB over
# (AXES)``, check.seqterms): its own slice's, or the whole sequence's gathered over the context axes
LENGTH_VERBS: tuple[str, ...] = ("per_sequence_local", "per_sequence_gathered")

# a term of the user's own (``losses { kl = global_mean  entropy = per_sequence_mean }``): any identifier that is not a
# reserved word declares one, reaching the dense layers as the main loss does
NAMED_REACH: tuple[str, ...] = ("dense",)
# the terms computed from routing statistics, not from tokens or sequences: no per-sequence normalisation
ROUTER_TERMS: tuple[str, ...] = ("aux", "z")
# words a term of the user's own may not take: the built-in terms, the section's other keys, the main loss
# (and the built-in terms' override spellings, which name the built-in terms)
RESERVED_WORDS: tuple[str, ...] = ("main", "loss", "tokens", "all", "aux_loss", "z_loss", "mtp_loss")

# what a plan's path may do with a term (``override loss[TERM]: VERB``): the main loss's verbs and a divisor
# (on a per-sequence term the means are over its sequences: global_mean is then a per-token mean of another family)
PATH_VERBS: tuple[str, ...] = ("global_mean", "per_device_mean", "per_microbatch_mean", "sum", "divide") + SEQUENCE_OBJECTIVES

# the term's own operations on some ranks (``override loss[TERM]: VERB over (AXES) ranks (R1, ...)``,
# check.termranks): the term added to the objective on the named ranks only, or divided by X there only
RANK_VERBS: tuple[str, ...] = ("on_ranks", "divide_on_ranks")

# the scope of a term's routing statistics (``losses { aux_stats = SCOPE }``, check.auxstats): the MoE
# load-balancing loss E · Σ_i f_i P_i is a function of the tokens' routing fractions f_i and mean router
# probabilities P_i over a group of tokens, nonlinear in their partial sums, so the group is part of the
# objective: the global batch (every token of the step), each microbatch (the tokens of one device's
# microbatch, gathered over the ranks that split its sequences), or each sequence (DeepSeek's
# sequence-wise loss); the loss is the mean of the groups' values
STATS_KEY = "aux_stats"
STATS_TERMS: tuple[str, ...] = ("aux",)  # the terms whose value depends on statistics over a group of tokens
STATS_OBJECTIVES: tuple[str, ...] = ("global_batch", "per_microbatch", "per_sequence")

# what a plan's path does (``override loss[aux]: VERB over (AXES)``): the statistics of each sequence,
# of each local microbatch or of the whole step's microbatches, summed over the ranks of AXES
GROUP_VERBS: tuple[str, ...] = ("stats_per_sequence", "stats_per_microbatch", "stats_per_step", "stats_per_row")
# the rows pack several documents of free lengths (``losses { aux_packed = true }``, check.auxpacked): a sequence of
# ``aux_stats`` is one document, and ``stats_per_row`` takes a packed row's statistics (every document of the row)
PACKED_KEY = "aux_packed"
ROW_VERB = "stats_per_row"
# the per-document values of a packed row averaged weighted by the documents' real lengths (a per-token mean of each
# token's document's value), where the objective weighs every document one
LENGTH_VERB = "stats_length_weighted"
# the mean router probabilities P alone over a group of their own (the same three groups, summed over the ranks
# of AXES), the routing fractions f keeping the group above: global counts times local probabilities
PROBS_VERBS: tuple[str, ...] = ("probs_per_sequence", "probs_per_microbatch", "probs_per_step")
# the statistics taken over every position of the padded batch, padding included (f's and P's sums and counts)
PADDING_VERB = "stats_count_padding"
# the statistics of the router calls (each device's microbatch) a path gathers over the ranks of AXES (``over
# (AXES)``), or over the step's microbatches, combined with equal weights: each call's f and P normalised by its
# own real-token count and then averaged, not summed as counts (check.encode_auxcells)
EQUAL_WEIGHTS_VERB = "stats_equal_cell_weights"
EQUAL_MICROBATCH_VERB = "stats_equal_microbatch_weights"
# f taken from the routing map after the capacity step (each router call's tokens beyond an expert's capacity
# dropped; or, padded to capacity, every expert's column filled up to it), not from the router's top-k
CAPACITY_VERBS: tuple[str, ...] = ("stats_after_capacity", "stats_capacity_padded")
# the statements about the aux term's statistics that take no 'over (AXES)'
NO_AXES_VERBS: tuple[str, ...] = (PADDING_VERB, EQUAL_MICROBATCH_VERB) + CAPACITY_VERBS + (LENGTH_VERB,)
# every statement about the aux term's statistics (check.auxstats)
STATS_VERBS: tuple[str, ...] = GROUP_VERBS + PROBS_VERBS + (EQUAL_WEIGHTS_VERB,) + NO_AXES_VERBS

# the cross entropy's own extra terms (``losses { label_smoothing = true  logit_z_loss = true }``, check.actflow_loss):
# label smoothing mixes the target's log-probability with the mean log-probability over the whole vocabulary,
# (1 - α)·(lse - z_t) + α·(lse - Σ_j z_j / V), and the output-logit z-loss (PaLM, ST-MoE) adds lse², where lse is
# the log-sum-exp of the token's logits over the whole vocabulary. Under a vocabulary-parallel output layer
# each tensor rank holds a slice of the logits: the sum of the logits (the smoothing term's, slot ``smoothing``)
# and the z-loss's sum of exponentials (slot ``zloss``) are partial over the tensor axes and need an all-reduce
# each, as the cross entropy's own sum of exponentials does
CE_TERMS: dict[str, str] = {"label_smoothing": "smoothing", "logit_z_loss": "zloss"}  # model key -> loss slot
