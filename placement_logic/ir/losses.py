"""Loss terms besides the main loss: the model block's ``losses { TERM = NORMALISATION }``.

Each term is a loss of its own added to the main loss with its own normalisation (the
objective, stated once in the model) and reaching only some parameter groups: an MoE
auxiliary load-balancing loss and a router z-loss reach the router; multi-token-prediction
heads reach the shared embedding/output head and their own (dense) layers. A plan states
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
)

# what a plan's path may do with a term (``override loss[TERM]: VERB``): the main loss's verbs and a divisor
PATH_VERBS: tuple[str, ...] = ("global_mean", "per_device_mean", "per_microbatch_mean", "sum", "divide")
