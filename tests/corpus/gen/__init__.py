"""The corpus generator's sections, imported in file order (each registers its mutants and equivalents)."""

from . import (  # noqa: F401
    c00_bases,
    c01_override_bugs,
    c02_norms_and_rank_sets,
    c03_equivalents,
    c04_state_and_buckets,
    c05_activations,
    c06_partial_activations,
    c07_gathered_loss,
    c08_output_grads,
    c09_loss_terms,
    c10_rereduce,
    c11_router_bias,
)
