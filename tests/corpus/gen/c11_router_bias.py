"""The corpus generator's aux-loss-free routing bias (``router: counts_reduce over (AXES)``, check.router_bias):
the per-expert token counts summed over too few of the axes whose ranks hold different tokens before the bias
update, and the stated sums that cover them (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import BASES, MODELS, mutant
from .c03_equivalents import equivalent

MODELS.update({
    "moe_bias": (MODELS["moe"][0].replace("    top_k = 2\n", "    top_k = 2\n    router_bias = true\n"),)
    + MODELS["moe"][1:],
    "moe_etp_bias": (MODELS["moe_etp"][0].replace("    top_k = 2\n", "    top_k = 2\n    router_bias = true\n"),)
    + MODELS["moe_etp"][1:],
})
for name, base_name, model, axes, what, mirrors in [
    ("router_bias_counts_dp_only_moe_3d", "moe_3d", "moe_bias", "dp", "the routing bias's counts summed over the "
     "data ranks only: each expert-parallel rank moves its replica of the bias by its own tokens' counts",
     "no public report: the expert ranks' counts left out"),
    ("router_bias_counts_not_over_sp_moe_etp", "moe_etp", "moe_etp_bias", "dp, x, ep", "under sequence parallelism, "
     "the routing bias's counts not summed over the tensor ranks, each of which routes its own sequence shard",
     "the counts not all-reduced over the tensor ranks (pytorch/torchtitan#4154)"),
]:
    mutant(name, base_name, f"{what} (`router: counts_reduce over ({axes})`).",
           [f"override router: counts_reduce over ({axes})"], ["SC router bias"], mirrors=mirrors, model=model)
for name, base_name, model, axes, why in [
    ("router_bias_counts_moe_3d", "moe_3d", "moe_bias", "dp, ep", "the routing bias's counts summed over the data "
     "and expert ranks; the tensor ranks (no sequence parallelism) count the same tokens"),
    ("router_bias_counts_with_tp_moe_3d", "moe_3d", "moe_bias", "dp, tp, ep", "the routing bias's counts summed "
     "over the tensor ranks too, which hold the same tokens: every count times tp, every sign unchanged"),
    ("router_bias_counts_sp_moe_etp", "moe_etp", "moe_etp_bias", "dp, x, ep, tp", "the routing bias's counts summed "
     "over every axis whose ranks hold different tokens, the sequence-parallel tensor ranks included"),
]:
    b = BASES[base_name]
    equivalent(name, b.title, why + "; every replica of the bias takes the single device's step.",
               list(b.bind) + [f"override router: counts_reduce over ({axes})"], base_name, model=model)
