"""The override vocabulary: what ``override TARGET[GROUP]: VERB`` accepts (resolve checks it,
the checker reads it). Re-exported by ``ir.nodes`` and ``ir``."""

from __future__ import annotations

# target -> verbs accepted by resolve; each verb says whether it takes `over` / `by`.
OVERRIDE_VERBS: dict[str, dict[str, tuple[bool, bool]]] = {
    "grads": {
        "reduce": (True, False),  # gradients reduced (summed) over exactly these axes
        "divide": (False, True),  # gradients divided by this divisor after reduction
        "no_accumulation_buffer": (False, False),  # sharded grads with no full accumulator
        # the (replicated) gradient buffer reduced after every microbatch's backward, not once per step
        "reduce_every_microbatch": (False, False),
        # the once-per-step reduction armed on a micro-step before the last (no_sync around the later ones)
        "sync_before_last": (False, False),
    },
    "clip_norm": {
        "reduce": (True, False),  # squared norms summed over exactly these axes
        "double_count": (False, False),  # group counted twice in the norm
        # the duplicate filter: a group's copies on these axes counted on one rank only (with a stated reduce)
        "dedupe": (True, False),
    },
    "loss": {
        "per_device_mean": (False, False),
        "per_microbatch_mean": (False, False),
        "global_mean": (False, False),
        "sum": (False, False),  # the objective is the sum over tokens (reduction='sum'): no normaliser
    },
    "tokens": {
        "reduce": (True, False),  # token count summed over exactly these axes
        "equal": (False, False),  # every device and microbatch holds the same number of tokens
    },
    "dropout_seed": {"vary": (True, False), "same": (False, False)},
    "overflow": {"reduce": (True, False)},  # overflow flag all-reduced over these axes
    "params": {
        "no_regather": (False, False),  # sharded optimizer step, no re-gather of params
        "gather": (True, False),  # S* state gathered over these axes
        "no_fetch": (False, False),  # offloaded params never fetched to device
        # params initialised on every rank (a per-rank seed) and never broadcast over these axes
        "no_init_broadcast": (True, False),
    },
    # the optimizer holds copies of the params made before the model was re-wrapped (FSDP, .to(device))
    "optimizer": {"stale_params": (False, False)},
    # the RNG state (generator seed and offset) per rank: the model-parallel tracker not forked per rank
    # (same), offsets advanced differently (advance), one rank's state restored on every rank of the axes
    # (restored_from_one), recomputation without the forward's RNG state (not_preserved)
    "rng": {"same": (True, False), "advance": (True, False), "restored_from_one": (True, False),
            "not_preserved": (False, False)},
    "embedding": {"tie_reduce": (True, False)},  # tied embedding grads summed over these axes
}

PARAM_GROUPS: tuple[str, ...] = ("all", "dense", "kv", "norms", "qk_norms", "biases", "experts", "router", "embedding")
